#!/usr/bin/env bash
# Half two of the GPU measurement: run a pack made by gpu_pack.py on the GPU machine.
#
#   gpu_check.sh PACK OUTDIR [gpu_check.py options, e.g. --skip torch_compile]
#
# PACK is a pack directory or its .tar.gz. Needs Python (3.12 for the packed tvm-ffi wheel),
# numpy, a CUDA driver; PyTorch for the PyTorch columns. No network, no TVM install: the packed
# tvm runs with TVM_USE_RUNTIME_LIB=1, tvm-ffi comes from the packed wheel. Writes
# OUTDIR/results.json (see gpu_check.py) and stops within GPU_CHECK_BUDGET_S seconds
# (default 470), recording what it skipped.
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S.
set -euo pipefail

start=$SECONDS
budget=${GPU_CHECK_BUDGET_S:-470}
if [[ $# -lt 2 ]]; then
    echo "usage: $0 PACK OUTDIR [gpu_check.py options]" >&2
    exit 2
fi
pack=$1
out=$2
shift 2
python=${PYTHON:-python3}

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [[ -f $pack ]]; then
    tar -xzf "$pack" -C "$work"
    pack=$work/gpu-pack
fi
pack=$(cd "$pack" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

# tvm-ffi: this interpreter's own when it is the pinned version, else the packed wheel.
site=$work/site
mkdir -p "$site"
wheels=("$pack"/runtime/wheels/apache_tvm_ffi-*.whl)
ffi_wheel=${wheels[0]}
ffi_version=${ffi_wheel##*/apache_tvm_ffi-}
ffi_version=${ffi_version%%-*}
install_wheel() {
    "$python" -m pip install --quiet --no-index --no-deps --target "$site" "$1" ||
        "$python" -m zipfile -e "$1" "$site"
}
if ! "$python" -c "import importlib.metadata as m, sys
sys.exit(m.version('apache-tvm-ffi') != '$ffi_version')" 2>/dev/null; then
    install_wheel "$ffi_wheel"
fi
if ! "$python" -c "import typing_extensions" 2>/dev/null; then
    for wheel in "$pack"/runtime/wheels/typing_extensions-*.whl; do install_wheel "$wheel"; done
fi

export PYTHONPATH="$pack/runtime:$site${PYTHONPATH:+:$PYTHONPATH}"
export TVM_USE_RUNTIME_LIB=1
export TVM_FFI_DISABLE_TORCH_C_DLPACK=1 # else importing tvm_ffi may JIT-build a torch addon
export PYTHONDONTWRITEBYTECODE=1       # leave the pack as it came
GPU_CHECK_NVIDIA_SMI=$(nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -n 1 || true)
export GPU_CHECK_NVIDIA_SMI

left=$((budget - (SECONDS - start)))
if ((left < 60)); then
    echo "gpu_check: only ${left} s of the ${budget} s budget left after set-up" >&2
    exit 1
fi
rc=0
timeout --kill-after=5 "$((left - 5))" \
    "$python" "$pack/gpu_check.py" --pack "$pack" --out "$out" --budget-s "$((left - 25))" "$@" ||
    rc=$?
if ((rc == 124 || rc == 137)) && [[ -f $out/results.json ]]; then
    "$python" "$pack/gpu_check.py" --finalize "$out/results.json" \
        --reason "killed at the global time limit of ${budget} s"
fi
# Tuning candidates (gpu_pack.py --tune-trials), in what is left of the budget; their results
# are recorded with `tvm-stitch tune --import OUTDIR/tuning/WORKLOAD.json --db DIR`.
if [[ -d $pack/tuning ]]; then
    mkdir -p "$out/tuning"
    for dir in "$pack"/tuning/*/; do
        name=$(basename "$dir")
        left=$((budget - (SECONDS - start)))
        if ((left < 20)); then
            echo "gpu_check: no time left to tune ${name} and the rest" >&2
            break
        fi
        timeout --kill-after=5 "$((left - 10))" \
            "$python" "$dir/pack_runner.py" "$dir" "$out/tuning/${name}.json" ||
            echo "gpu_check: tuning ${name} exited $?" >&2
    done
fi
echo "gpu_check: ${out}/results.json after $((SECONDS - start)) s (exit ${rc})"
exit "$rc"
