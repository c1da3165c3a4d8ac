"""The GPU pack (scripts/gpu_pack.py) and the half that runs it (scripts/gpu_check.sh).

No GPU here: the CUDA pack is checked for its layout, size, a library of sm_90 cubins for every
flow (a failed build fails the pack) and that they load with the packed runtime alone; the whole
check runs end to end on a CPU variant of the pack (``--device cpu``), with this interpreter
and, when it is installed with numpy, Python 3.12.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import verify
from tvm_stitch.analysis import ptxas

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

gpu_check = importlib.import_module("gpu_check")
refs = importlib.import_module("gpu_torch_refs")

# gpu_pack.py run with the stitch flow's build failing (what assert_built must catch)
FAILING_STITCH_BUILD = """
import sys
import gpu_pack

build = gpu_pack.build_library


def failing(mod, flow, target, path):
    if flow == "stitch":
        raise RuntimeError("stitch build failed (injected by the test)")
    build(mod, flow, target, path)


gpu_pack.build_library = failing
sys.exit(gpu_pack.main(sys.argv[1:]))
"""


# ---------------------------------------------------------------------------------------------
# Helpers and fixtures


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[list[int], int]],
    outputs: dict[str, tuple[list[int] | None, int]],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    """An ONNX model from nodes, typed inputs/outputs and initializers."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in outputs.items()],
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tiny_model() -> onnx.ModelProto:
    """layer_norm -> softmax -> add on 4 x 64."""
    f32 = TensorProto.FLOAT
    return make_model(
        [
            helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["ln"], axis=-1),
            helper.make_node("Softmax", ["ln"], ["sm"], axis=-1),
            helper.make_node("Add", ["sm", "x"], ["y"]),
        ],
        {"x": ([4, 64], f32)},
        {"y": ([4, 64], f32)},
        {
            "scale": np.linspace(0.5, 1.5, 64, dtype=np.float32),
            "bias": np.linspace(-0.1, 0.1, 64, dtype=np.float32),
        },
    )


def pack(out: Path, *args: str, code: str | None = None) -> tuple[int, str, dict[str, Any]]:
    """Run gpu_pack.py as a user would (or ``code``, which calls its main, in its place);
    returns the exit status, the output and the manifest."""
    script = [str(SCRIPTS / "gpu_pack.py")] if code is None else ["-c", code]
    cmd = [sys.executable, *script, "--out", str(out), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(SCRIPTS), str(REPO)))}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    manifest = json.loads((out / "manifest.json").read_text())
    return result.returncode, result.stdout + result.stderr, manifest


def assert_built(manifest: dict[str, Any], pack_dir: Path) -> None:
    """Every workload of the pack has a library for every flow of the pack and no build
    error."""
    for workload in manifest["workloads"]:
        assert workload["build_errors"] == {}, (workload["name"], workload["build_errors"])
        assert sorted(workload["libs"]) == sorted(manifest["flows"]), workload["name"]
        for lib in workload["libs"].values():
            assert (pack_dir / lib).is_file(), lib


def run_pack(out: Path, *args: str) -> dict[str, Any]:
    """Run gpu_pack.py as a user would; it must exit 0 with every library built. Returns the
    manifest."""
    returncode, output, manifest = pack(out, *args)
    assert returncode == 0, output
    assert_built(manifest, out)
    return manifest


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(tiny_model(), path)
    return path


@pytest.fixture(scope="module")
def wheels() -> None:
    """The packed wheels are downloaded once into gpu_pack's cache; skip if PyPI is out of
    reach and the cache is empty."""
    gpu_pack = importlib.import_module("gpu_pack")
    try:
        gpu_pack.ensure_wheels(gpu_pack.DEFAULT_WHEEL_DIR)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot download the tvm-ffi wheel: {exc}")


@pytest.fixture(scope="module")
def cuda_pack(tmp_path_factory: pytest.TempPathFactory, tiny_onnx: Path, wheels: None) -> Path:
    """The CUDA pack of the tiny model, every flow built (only for tests marked nvcc)."""
    path = tmp_path_factory.mktemp("cuda") / "pack"
    run_pack(path, "--onnx", str(tiny_onnx), "--archive", "--tune-trials", "2",
             "--tune-model", "h200")
    return path


@pytest.fixture(scope="module")
def cpu_pack(tmp_path_factory: pytest.TempPathFactory, tiny_onnx: Path, wheels: None) -> Path:
    path = tmp_path_factory.mktemp("cpu") / "pack"
    run_pack(path, "--onnx", str(tiny_onnx), "--device", "cpu", "--archive")
    return path


def python312() -> str | None:
    """A working CPython 3.12 interpreter (on PATH, or a pyenv install), or None."""
    candidates = [
        shutil.which("python3.12"),
        *map(str, Path.home().glob(".pyenv/versions/3.12*/bin/python3.12")),
    ]
    for path in filter(None, candidates):
        version = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if version.returncode == 0 and version.stdout.strip() == "(3, 12)":
            return path
    return None


def runtime_env(pack: Path, **extra: str) -> dict[str, str]:
    """Environment of a process that may only see the packed tvm (this interpreter's tvm-ffi
    is the pinned version, so the packed CPython 3.12 wheel is not needed here)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(pack / "runtime"),
        TVM_USE_RUNTIME_LIB="1",
        TVM_FFI_DISABLE_TORCH_C_DLPACK="1",
    )
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# The CUDA pack


@pytest.mark.nvcc
def test_pack_layout_and_size(cuda_pack: Path) -> None:
    manifest = json.loads((cuda_pack / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["arch"] == "sm_90"
    assert manifest["flows"] == importlib.import_module("tvm_stitch.pipeline").available_flows()
    assert {"baseline", "stitch"} <= set(manifest["flows"])
    assert_built(manifest, cuda_pack)
    (workload,) = manifest["workloads"]
    data = np.load(cuda_pack / workload["data"])
    assert {"input_0", "output_0"} <= set(data.files)
    assert workload["torch"]["program"] == "onnx_replay"
    assert (cuda_pack / "torch_refs" / "programs.py").is_file()
    for name in ("gpu_check.sh", "gpu_check.py", "gpu_torch_refs.py"):
        assert (cuda_pack / name).is_file()

    tvm_dir = cuda_pack / "runtime" / "tvm"
    libs = {p.name for p in (tvm_dir / "lib").iterdir()}
    assert {"libtvm_runtime.so", "libtvm_runtime_cuda.so"} <= libs
    assert "libtvm_compiler.so" not in libs
    assert not (tvm_dir / "3rdparty").exists() and not list(tvm_dir.rglob("__pycache__"))
    assert [p.name for p in tvm_dir.rglob("*.so") if "cpython" in p.name] == []

    wheels = sorted(p.name for p in (cuda_pack / "runtime" / "wheels").iterdir())
    assert any(w.startswith("apache_tvm_ffi-0.1.14.post1-cp312-") for w in wheels), wheels
    assert any(w.startswith("typing_extensions-") for w in wheels), wheels

    archive = cuda_pack.with_name("pack.tar.gz")
    assert archive.stat().st_size < 60 * 2**20
    assert sum(f.stat().st_size for f in cuda_pack.rglob("*") if f.is_file()) < 60 * 2**20
    with tarfile.open(archive) as tar:
        assert "gpu-pack/manifest.json" in tar.getnames()


@pytest.mark.nvcc
def test_a_failed_stitch_build_fails_the_pack(
    tiny_onnx: Path, wheels: None, tmp_path: Path
) -> None:
    """gpu_pack exits 1 and records the error; assert_built, which every pack of these tests
    goes through, refuses the pack."""
    out = tmp_path / "pack"
    returncode, output, manifest = pack(out, "--onnx", str(tiny_onnx), code=FAILING_STITCH_BUILD)
    assert returncode == 1, output
    assert "1 builds failed" in output
    (workload,) = manifest["workloads"]
    assert list(workload["build_errors"]) == ["stitch"]
    assert "injected by the test" in workload["build_errors"]["stitch"]
    assert list(workload["libs"]) == ["baseline"] and (out / workload["libs"]["baseline"]).is_file()
    with pytest.raises(AssertionError, match="stitch"):
        assert_built(manifest, out)


@pytest.mark.nvcc
def test_libraries_hold_sm90_cubins(cuda_pack: Path) -> None:
    gpu_pack = importlib.import_module("gpu_pack")
    manifest = json.loads((cuda_pack / "manifest.json").read_text())
    (workload,) = manifest["workloads"]
    assert sorted(workload["libs"]) == sorted(manifest["flows"])
    for lib in workload["libs"].values():
        assert gpu_pack.cubin_archs(cuda_pack / lib) == ["sm_90"]


@pytest.mark.nvcc
def test_tuning_candidates_are_packed_as_cubins(cuda_pack: Path) -> None:
    """``--tune-trials 2 --tune-model h200``: the workload's tuning pack (tuning/WORKLOAD)
    lists two candidates per stitched group, the rules' kernel and the shipped model's pick,
    each a library holding an sm_90 cubin, and its runner."""
    gpu_pack = importlib.import_module("gpu_pack")
    (workload,) = json.loads((cuda_pack / "manifest.json").read_text())["workloads"]
    assert workload["tuning"]["model"] == "h200"
    tuning = cuda_pack / workload["tuning"]["pack"]
    manifest = json.loads((tuning / "manifest.json").read_text())
    assert manifest["runner"] == "local" and manifest["arch"] == "sm_90"
    assert manifest["candidates"] and not manifest["build_errors"]
    per_workload: dict[str, int] = {}
    for candidate in manifest["candidates"]:
        per_workload[candidate["workload"]] = per_workload.get(candidate["workload"], 0) + 1
        assert gpu_pack.cubin_archs(tuning / candidate["artifact"]) == ["sm_90"]
    assert set(per_workload.values()) == {2}
    assert (tuning / "pack_runner.py").is_file()


@pytest.mark.nvcc
def test_cubin_arch_decoding(tmp_path: Path) -> None:
    """cubin_archs reads what nvcc wrote, for several architectures."""
    gpu_pack = importlib.import_module("gpu_pack")
    nvcc = ptxas.find_nvcc()
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(float* a) { a[threadIdx.x] += 1.0f; }\n")
    for arch in ("sm_80", "sm_90"):
        cubin = tmp_path / f"{arch}.cubin"
        subprocess.run([nvcc, "--cubin", "-arch", arch, "-o", cubin, source], check=True)
        blob = tmp_path / f"{arch}.bin"
        blob.write_bytes(b"\x7fELF-host-part" + cubin.read_bytes())
        assert gpu_pack.cubin_archs(blob) == [arch]


@pytest.mark.nvcc
def test_runtime_only_import_loads_the_cuda_library(cuda_pack: Path, tmp_path: Path) -> None:
    """The packed tvm imports with the runtime library only and deserialises each flow's CUDA
    library: its CUDA module holds no source (nothing compiles at load time) and libcudart
    comes from the pack. A stub libcuda.so.1 stands in for the driver."""
    gpu_pack = importlib.import_module("gpu_pack")
    stub = gpu_pack.make_libcuda_stub(
        cuda_pack / "runtime/tvm/lib/libtvm_runtime_cuda.so", tmp_path
    )
    manifest = json.loads((cuda_pack / "manifest.json").read_text())
    libs = [str(cuda_pack / lib) for lib in manifest["workloads"][0]["libs"].values()]
    assert len(libs) == len(manifest["flows"])
    script = textwrap.dedent(
        f"""
        import ctypes, sys
        from pathlib import Path
        ctypes.CDLL({str(stub)!r}, mode=ctypes.RTLD_GLOBAL)
        import tvm
        from tvm_ffi.libinfo import load_lib_ctypes
        pack = Path({str(cuda_pack)!r})
        assert Path(tvm.__file__).is_relative_to(pack), tvm.__file__
        assert tvm.base._RUNTIME_ONLY and list(tvm.base._LOADED_LIBS) == ["tvm_runtime"]
        assert "tvm.relax" not in sys.modules
        lib_dir = Path(tvm.libinfo.find_libtvm_runtime()).parent
        load_lib_ctypes("tvm", "tvm_runtime_cuda", "RTLD_LOCAL", [lib_dir])
        for lib in {libs!r}:
            kinds, node = [], tvm.runtime.load_module(lib)
            while True:
                kinds.append(node.kind)
                if not node.imports:
                    break
                node = node.imports[0]
            assert kinds == ["relax.VMExecutable", "library", "cuda"], (lib, kinds)
            assert node.inspect_source("cuda") == "", lib
        maps = open("/proc/self/maps").read()
        cudart = {{line.split()[-1] for line in maps.splitlines() if "libcudart" in line}}
        assert cudart == {{str(lib_dir / "libcudart.so.13")}}, cudart
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=runtime_env(cuda_pack),
        cwd=tmp_path,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# ---------------------------------------------------------------------------------------------
# The check, end to end on the CPU variant


def run_check(pack: Path, out: Path, *args: str, **env: str) -> dict[str, Any]:
    """Run gpu_check.sh on ``pack`` and return results.json."""
    cmd = ["bash", str(SCRIPTS / "gpu_check.sh"), str(pack), str(out), *args]
    # The interpreter running the tests has this machine's tvm-ffi; a bare python3 on PATH
    # would install the pack's Python 3.12 wheel, which cannot load here.
    env = {**os.environ, "PYTHON": sys.executable, **env}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "results.json").read_text())


def test_check_runs_the_cpu_pack(cpu_pack: Path, tmp_path: Path) -> None:
    results = run_check(cpu_pack.with_name("pack.tar.gz"), tmp_path, "--skip", "torch_compile")
    assert results["complete"] and results["stopped"] is None
    machine = results["machine"]
    assert machine["tvm_runtime_only"] and machine["tvm_libs_loaded"] == ["tvm_runtime"]
    assert machine["tvm_file"].endswith("gpu-pack/runtime/tvm/__init__.py")
    (entry,) = results["workloads"]
    flow = results["pack"]["flows"][0]
    assert entry["status"][flow] == "measured" and entry["ok"][flow] is True
    assert entry["measured_us"][flow] > 0 and entry["max_abs_err"][flow] < 1e-4
    assert entry["status"]["torch_compile"] == "skipped: --skip"
    assert entry["measured_us"]["torch_compile"] is None
    if machine["torch_version"] is None:
        assert entry["status"]["torch_eager"].startswith("not available")
    else:
        assert entry["status"]["torch_eager"] == "measured" and entry["ok"]["torch_eager"]


def test_check_regenerates_what_is_too_large_to_ship(
    tiny_onnx: Path, wheels: None, tmp_path: Path
) -> None:
    """With tiny limits every array ships as a recipe, the weights become VM inputs and the
    reference outputs are recomputed by onnxruntime at check time: the real-size path."""
    pack = tmp_path / "pack"
    limits = ["--inline-kb", "0.1", "--outputs-mb", "0", "--embed-mb", "0"]
    run_pack(pack, "--onnx", str(tiny_onnx), "--device", "cpu", *limits)
    (spec,) = json.loads((pack / "manifest.json").read_text())["workloads"]
    assert spec["weights"] == "vm inputs" and len(spec["params"]) == 2
    assert all("recipe" in p for p in spec["params"])
    assert "recipe" in spec["inputs"][0]["source"] and spec["reference"]["onnx"]
    assert np.load(pack / spec["data"]).files == []
    results = run_check(pack, tmp_path / "out", "--skip", "torch_compile")
    (entry,) = results["workloads"]
    flow = results["pack"]["flows"][0]
    assert entry["ok"][flow] is True and entry["max_abs_err"][flow] < 1e-4
    if results["machine"]["torch_version"] is not None:
        assert entry["ok"]["torch_eager"] is True

    hidden = tmp_path / "no_onnxruntime" / "onnxruntime"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    results = run_check(
        pack,
        tmp_path / "out2",
        "--skip",
        "torch_compile,torch_eager",
        PYTHONPATH=str(hidden.parent),
    )
    (entry,) = results["workloads"]
    assert entry["status"][flow] == "measured" and entry["ok"][flow] is None
    assert "hidden by the test" in entry["timing"][flow]["reference"]


def test_a_dynamic_model_is_built_once_and_checked_at_every_size(
    wheels: None, tmp_path: Path
) -> None:
    """``--dims``: GPT-2 exported with dynamic axes, one library per flow for all sizes, and
    weights regenerated from one seed (tiny limits make every weight a VM input from a recipe
    and inputs at the larger size recipes too): every size matches onnxruntime."""
    pack = tmp_path / "pack"
    sizes = ("batch=1,seq=1", "batch=2,seq=13")
    limits = ["--inline-kb", "1", "--embed-mb", "0"]
    run_pack(pack, "--workloads", "gpt2_block", "--size", "ci", "--device", "cpu",
             *(arg for dims in sizes for arg in ("--dims", dims)), *limits)
    specs = json.loads((pack / "manifest.json").read_text())["workloads"]
    assert [s["name"] for s in specs] == [f"gpt2_block@{d}" for d in sizes]
    assert [s["dims"] for s in specs] == [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 13}]
    assert specs[0]["libs"] == specs[1]["libs"] and specs[0]["weights"] == "vm inputs"
    assert specs[0]["params"] == specs[1]["params"]
    assert len(list((pack / "libs").iterdir())) == 1
    results = run_check(pack, tmp_path / "out", "--skip", "torch_compile,torch_eager")
    flow = results["pack"]["flows"][0]
    assert [e["ok"][flow] for e in results["workloads"]] == [True, True]


def test_check_times_torch_compile(cpu_pack: Path, tmp_path: Path) -> None:
    """torch.compile on the CPU (Inductor compiles C++ here: about 25 s)."""
    pytest.importorskip("torch")
    results = run_check(cpu_pack, tmp_path, "--skip", "torch_eager")
    (entry,) = results["workloads"]
    assert entry["status"]["torch_compile"] == "measured", entry["status"]
    assert entry["ok"]["torch_compile"] is True
    assert entry["timing"]["torch_compile"]["compile_s"] > 0


def test_check_records_what_the_budget_skips(cpu_pack: Path, tmp_path: Path) -> None:
    results = run_check(cpu_pack, tmp_path, "--budget-s", "0")
    (entry,) = results["workloads"]
    assert set(entry["measured_us"].values()) == {None}
    assert all(s.startswith("skipped: time budget") for s in entry["status"].values())


def test_check_under_python312(cpu_pack: Path, tmp_path: Path) -> None:
    """With Python 3.12 the check installs the packed cp312 tvm-ffi wheel itself."""
    python = python312()
    if python is None or subprocess.run([python, "-c", "import numpy"]).returncode != 0:
        pytest.skip("needs python3.12 with numpy")
    results = run_check(cpu_pack, tmp_path, "--skip", "torch_compile", PYTHON=python)
    assert results["machine"]["python"].startswith("3.12")
    flow = results["pack"]["flows"][0]
    assert results["workloads"][0]["ok"][flow] is True


def test_packed_ffi_wheel_installs_for_python312(cpu_pack: Path, tmp_path: Path) -> None:
    python = python312()
    if python is None:
        pytest.skip("needs python3.12")
    wheels = sorted((cpu_pack / "runtime" / "wheels").glob("*.whl"))
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target"]
    subprocess.run([*cmd, str(tmp_path), *map(str, wheels)], check=True)
    script = "import tvm_ffi; print(tvm_ffi.__version__)"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"}
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "0.1.14.post1", out.stderr


# ---------------------------------------------------------------------------------------------
# Pieces of gpu_check


def test_finalize_marks_pending_columns(tmp_path: Path) -> None:
    doc = {
        "stopped": None,
        "workloads": [gpu_check.new_entry({"name": "a", "kind": "micro", "size": "ci"}, ["x"])],
    }
    path = tmp_path / "results.json"
    gpu_check.write_json(path, doc)
    cmd = [sys.executable, str(SCRIPTS / "gpu_check.py"), "--finalize", str(path)]
    subprocess.run([*cmd, "--reason", "killed"], check=True)
    done = json.loads(path.read_text())
    assert done["complete"] and done["stopped"] == "killed"
    assert done["workloads"][0]["status"] == {"x": "skipped: killed"}


def test_compare_tolerances() -> None:
    """float16 as verify; float32 at 1e-3 (gpu_check.DEFAULT_TOLERANCE says why)."""
    assert gpu_check.TOLERANCE["float16"] == verify.RTOL["float16"] == verify.ATOL["float16"]
    a = np.ones((2, 3), np.float32)
    assert gpu_check.compare([a], [a + 5e-4]) == (True, pytest.approx(5e-4, rel=1e-3))
    assert gpu_check.compare([a], [a + 5e-3])[0] is False
    h = np.ones(4, np.float16)
    assert gpu_check.compare([h], [h + np.float16(1e-2)])[0] is True
    assert gpu_check.compare([h], [h + np.float16(5e-2)])[0] is False
    assert gpu_check.compare([a], [a[:1]]) == (False, None)
    ints = np.arange(4)
    assert gpu_check.compare([ints], [ints + 1]) == (False, 1.0)


def test_record_keeps_the_median(tmp_path: Path) -> None:
    workload = {"name": "a", "kind": "micro", "size": "ci"}
    doc = {"workloads": [gpu_check.new_entry(workload, ["x"])]}
    results = gpu_check.Results(tmp_path / "r.json", doc)
    results.record("a", "x", "measured", [3e-6, 1e-6, 2e-6], (True, 0.0), repeat=3)
    saved = json.loads((tmp_path / "r.json").read_text())["workloads"][0]
    assert saved["measured_us"]["x"] == pytest.approx(2.0)
    assert saved["timing"]["x"]["min_us"] == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_recipes_regenerate_large_arrays(dtype: str) -> None:
    gpu_pack = importlib.import_module("gpu_pack")
    rng = np.random.default_rng(0)
    big = {
        "float32": rng.normal(2.0, 0.5, (300, 300)),
        "int64": rng.integers(5, 50, (300, 300)),
        "bool": rng.integers(0, 2, (300, 300)),
    }[dtype].astype(dtype)
    store = gpu_pack.ArrayStore(seed_base=0, limit_bytes=1024)
    stand_in = store.shrink(big)
    source = store.source("k", stand_in)
    again = gpu_check.load_array(source, data={})
    np.testing.assert_array_equal(again, stand_in)
    assert stand_in.dtype == big.dtype and stand_in.shape == big.shape
    if dtype == "float32":
        assert abs(stand_in.mean() - 2.0) < 0.01 and abs(stand_in.std() - 0.5) < 0.01
    else:
        assert stand_in.min() >= big.min() and stand_in.max() <= big.max()
    small = np.arange(3)
    assert store.shrink(small) is small and store.source("s", small) == {"array": "s"}


# ---------------------------------------------------------------------------------------------
# PyTorch programs generated from ONNX


F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
CASES: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]] = {}


def case(fn: Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]) -> Callable:
    CASES[fn.__name__] = fn
    return fn


def _rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


@case
def rms_norm() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = {
        "two": np.array(2.0, np.float32),
        "axes": np.array([-1]),
        "eps": np.array(1e-5, np.float32),
        "w": _rand(16),
    }
    return make_model(nodes, {"x": ([4, 16], F32)}, {"y": (None, F32)}, inits), {"x": _rand(4, 16)}


@case
def gelu_erf_and_mask_softmax() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes = [
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["x", "e1"], ["g0"]),
        helper.make_node("Mul", ["g0", "half"], ["g"]),
        helper.make_node("Where", ["mask", "g", "neg"], ["m"]),
        helper.make_node("Softmax", ["m"], ["y"], axis=-1),
    ]
    inits = {
        "sqrt2": np.array(2**0.5, np.float32),
        "one": np.array(1.0, np.float32),
        "neg": np.array(-1e4, np.float32),
    }
    mask = np.random.default_rng(1).integers(0, 2, (3, 8)).astype(bool)
    mask[:, 0] = True
    model = make_model(
        nodes, {"x": ([3, 8], F32), "mask": ([3, 8], BOOL)}, {"y": (None, F32)}, inits
    )
    return model, {"x": _rand(3, 8), "mask": mask}


@case
def log_softmax_nll_and_gather() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes = [
        helper.make_node("LogSoftmax", ["logits"], ["ls"], axis=-1),
        helper.make_node("NegativeLogLikelihoodLoss", ["ls", "t"], ["loss"], reduction="mean"),
        helper.make_node("Unsqueeze", ["t", "ax"], ["t2"]),
        helper.make_node("GatherElements", ["ls", "t2"], ["picked"], axis=1),
        helper.make_node("Gather", ["logits", "t"], ["cols"], axis=1),
    ]
    model = make_model(
        nodes,
        {"logits": ([6, 10], F32), "t": ([6], I64)},
        {"loss": (None, F32), "picked": (None, F32), "cols": (None, F32)},
        {"ax": np.array([1])},
    )
    return model, {"logits": _rand(6, 10), "t": np.array([0, 3, 9, 2, 5, 5])}


@case
def shapes_and_reductions() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("ReduceSum", ["t", "axes0"], ["cs"], keepdims=0),
        helper.make_node("Slice", ["x", "st", "en", "sax"], ["sl"]),
        helper.make_node("Expand", ["sl", "eshape"], ["ex"]),
        helper.make_node("Concat", ["ex", "ex"], ["cat"], axis=0),
        helper.make_node("ReduceMax", ["cat"], ["mx"], axes=[1], keepdims=1),
        helper.make_node("Cast", ["mx"], ["y"], to=TensorProto.INT64),
        helper.make_node("Gemm", ["x", "w", "c"], ["gm"], transB=1, alpha=0.5),
    ]
    inits = {
        "shape": np.array([0, 3, -1]),
        "axes0": np.array([0]),
        "st": np.array([1]),
        "en": np.array([3]),
        "sax": np.array([1]),
        "eshape": np.array([2, 1]),
        "w": _rand(5, 6),
        "c": _rand(5),
    }
    model = make_model(
        nodes,
        {"x": ([2, 6], F32)},
        {"cs": (None, F32), "y": (None, I64), "gm": (None, F32)},
        inits,
        opset=17,
    )
    return model, {"x": _rand(2, 6) * 3}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_program_matches_onnxruntime(name: str) -> None:
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    model, feeds = CASES[name]()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    program = refs.generate_program(model, "f")
    namespace: dict[str, Any] = {"OPS": refs.OPS}
    exec(program.source, namespace)  # noqa: S102
    with torch.no_grad():
        got = namespace["f"](
            refs.to_device(program.consts, "cpu"), *refs.to_device(feeds.values(), "cpu")
        )
    ok, err = gpu_check.compare(refs.to_numpy(got), want)
    assert ok, (err, program.source)


def test_generation_names_what_it_cannot_express() -> None:
    model = make_model(
        [helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,ij->i")],
        {"x": ([2, 3], F32)},
        {"y": (None, F32)},
    )
    with pytest.raises(refs.Unsupported, match="Einsum"):
        refs.generate_program(model, "f")
    reshape = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        {"x": ([2, 3], F32), "s": ([2], I64)},
        {"y": (None, F32)},
    )
    with pytest.raises(refs.Unsupported, match="computed at run time"):
        refs.generate_program(reshape, "f")


def test_programs_module_round_trip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model, feeds = CASES["rms_norm"]()
    program = refs.generate_program(model, "workload_0")
    path = tmp_path / "programs.py"
    refs.write_programs(path, [program])
    fn = refs.load_programs(path)["workload_0"]
    with torch.no_grad():
        out = fn(refs.to_device(program.consts, "cpu"), *refs.to_device(feeds.values(), "cpu"))
    assert refs.to_numpy(out)[0].shape == (4, 16)


def test_exported_module_round_trip(tmp_path: Path) -> None:
    """A model workload's torch module goes through torch.export into the pack and comes back
    through gpu_check's loader."""
    torch = pytest.importorskip("torch")
    gpu_pack = importlib.import_module("gpu_pack")
    model = tiny_model()
    module = torch.nn.LayerNorm(64)
    with torch.no_grad():
        module.weight.copy_(torch.linspace(0.5, 1.5, 64))
        module.bias.copy_(torch.linspace(-0.1, 0.1, 64))
    ln_only = make_model(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1)],
        {"x": ([4, 64], F32)},
        {"y": ([4, 64], F32)},
        {n.name: numpy_helper.to_array(n) for n in model.graph.initializer},
    )
    feeds = {"x": _rand(4, 64)}
    outputs = gpu_pack.reference_outputs(ln_only, feeds)
    item = gpu_pack.Item("ln", "model", "ci", ln_only, feeds, module)
    (tmp_path / "torch_refs").mkdir()
    entry = gpu_pack._export_module(item, feeds, outputs, tmp_path, [])
    assert entry["program"] == "torch.export"
    np.savez(tmp_path / "d.npz", input_0=feeds["x"])
    spec = {
        "name": "ln",
        "data": "d.npz",
        "torch": entry,
        "inputs": [{"source": {"array": "input_0"}}],
    }
    fn, args = gpu_check.torch_call(gpu_check.Workload(tmp_path, spec), "cpu", {})
    with torch.no_grad():
        got = refs.to_numpy(fn(*args))
    assert gpu_check.compare(got, outputs)[0]
    item.torch_module = None
    with pytest.raises(RuntimeError, match="no PyTorch module"):
        gpu_pack._export_module(item, feeds, outputs, tmp_path, [])
