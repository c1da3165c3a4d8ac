#!/usr/bin/env python3
"""Measure a tuning pack (``tvm-stitch tune --export PACK``) on the machine of its GPU, and
write the results that ``tvm-stitch tune --import RESULTS --db DIR`` records.

    python pack_runner.py PACK RESULTS [--number N] [--repeat R] [--min-repeat-ms MS]

A CUDA pack (exported with ``--runner local``) needs TVM's runtime and numpy only, never
tvm_stitch: each candidate's library is loaded with ``tvm.runtime.load_module``, its arguments
are allocated on ``tvm.cuda(0)`` (random values drawn as ``tuning.measure.arguments`` draws
them, zeros for the state of a grid barrier) and its ``main`` is timed with TVM's time
evaluator: ``repeat`` means of at least ``number`` runs, more to last ``min_repeat_ms``, after
a warm-up run; the candidate's time is the mean of those means (as ``measure.LocalRunner``).
The libraries carry CUDA source, which TVM's CUDA runtime compiles for the device when one is
loaded: with NVRTC (the ``cuda-bindings`` package) or, when that package is missing, with nvcc
(``TVM_CUDA_COMPILE_MODE=nvcc``, which this script then sets unless it is set already). The
device must be of the arch the pack was exported for (its plans count that arch's limits).

A SIMT pack (``--runner simt``) is the self-test of the whole loop on a CPU: it imports
``tvm_stitch.tuning.measure`` and times each serialised kernel with its SIMT timing
(``simt_seconds``: CPU times, never a GPU's); the candidate's time is the fastest of
``repeat`` means of ``number`` runs (as ``measure.SimtRunner``).

RESULTS is rewritten after every candidate, so that a run stopped at any point leaves valid
JSON (``"complete": false`` until the end). A candidate that fails is recorded with its error
and the run goes on. RESULTS carries the pack's manifest, so that importing needs nothing
else. Exit status: 0 when every candidate was timed, 1 when some failed, 2 when the pack
cannot run here.

On a GPU machine without a TVM install, with the runtime that ``scripts/gpu_pack.py`` ships in
its packs (TVM without its compiler, and the tvm-ffi wheel for CPython 3.12), set up as
``scripts/gpu_check.sh`` does::

    site=$(mktemp -d)
    python3.12 -m pip install --no-index --no-deps --target "$site" GPU_PACK/runtime/wheels/*.whl
    PYTHONPATH=GPU_PACK/runtime:$site TVM_USE_RUNTIME_LIB=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1 \\
        python3.12 PACK/pack_runner.py PACK RESULTS

The tuning pack must come from the TVM version of that runtime (``versions`` in its
manifest); nvcc or ``cuda-bindings`` must be there to compile the kernels.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi

PACK_FORMAT = "tvm-stitch-tuning-pack/1"
"""The format tag of a pack's manifest."""

RESULTS_FORMAT = "tvm-stitch-tuning-results/1"
"""The format tag of a results file."""

CUDA, SIMT = "local", "simt"
"""The runner kinds of packs (``tuning.kinds.RunnerKind`` values)."""

DEFAULTS = {CUDA: {"number": 3, "repeat": 1, "min_repeat_ms": 100},
            SIMT: {"number": 1, "repeat": 3, "min_repeat_ms": 0}}
"""Timing settings per kind of pack: those of ``measure.LocalRunner`` and ``SimtRunner``."""


class PackError(Exception):
    """The pack cannot be measured here."""


def random_array(dtype: str, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """The values ``tuning.measure.random_array`` draws: floats uniform in [-1, 1), integers 0
    or 1, booleans either."""
    kind = np.dtype(dtype)
    if kind == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(kind, np.integer):
        return rng.integers(0, 2, shape).astype(kind)
    return rng.uniform(-1.0, 1.0, shape).astype(kind)


def arguments(specs: Sequence[dict[str, Any]], zeroed: Sequence[int], seed: int
              ) -> list[np.ndarray]:
    """One array per argument spec (``dtype``, ``shape``): zeros at the ``zeroed`` positions,
    random values elsewhere, drawn in order from ``seed`` (``tuning.measure.arguments``)."""
    rng = np.random.default_rng(seed)
    return [np.zeros(s["shape"], s["dtype"]) if i in zeroed
            else random_array(s["dtype"], s["shape"], rng) for i, s in enumerate(specs)]


def read_manifest(pack: Path) -> dict[str, Any]:
    """The manifest of the pack directory ``pack``; a PackError for anything else."""
    path = pack / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise PackError(f"{path}: cannot be read as a tuning pack's manifest: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != PACK_FORMAT:
        raise PackError(f"{path}: not a {PACK_FORMAT} manifest")
    if manifest.get("runner") not in DEFAULTS:
        raise PackError(f"{path}: a pack for the runner {manifest.get('runner')!r}")
    return manifest


def choose_cuda_compiler() -> None:
    """Have TVM compile the libraries' CUDA source, when they are loaded, with nvcc if NVRTC's
    Python bindings (``cuda-bindings``) are missing, unless ``TVM_CUDA_COMPILE_MODE`` is set
    already."""
    if "TVM_CUDA_COMPILE_MODE" not in os.environ:
        try:
            import cuda.bindings  # noqa: F401
        except ImportError:
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def open_device(manifest: dict[str, Any]) -> Any:
    """The device to time on: the CPU for a SIMT pack; for a CUDA pack ``tvm.cuda(0)``, which
    must be of the pack's arch, after loading TVM's CUDA runtime library (a runtime-only TVM
    does not load it) and choosing the CUDA compiler (``choose_cuda_compiler``)."""
    if manifest["runner"] == SIMT:
        return tvm.cpu(0)
    choose_cuda_compiler()
    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is None:
        from tvm_ffi.libinfo import load_lib_ctypes

        lib_dir = Path(tvm.libinfo.find_libtvm_runtime()).parent
        try:
            load_lib_ctypes("tvm", "tvm_runtime_cuda", "RTLD_LOCAL", [lib_dir])
        except OSError as err:
            raise PackError(f"TVM's CUDA runtime library does not load: {err}") from err
    dev = tvm.cuda(0)
    if not dev.exist:
        raise PackError("TVM sees no CUDA device")
    have, want = re.sub(r"\D", "", dev.compute_version), re.sub(r"\D", "", manifest["arch"])
    if have != want:
        raise PackError(f"the pack was exported for {manifest['arch']}, the device "
                        f"{dev.device_name} is sm_{have}")
    return dev


def machine_info(manifest: dict[str, Any], dev: Any) -> dict[str, Any]:
    """What measured: host, Python, TVM, and the GPU (or the SIMT runner)."""
    info: dict[str, Any] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                            "python": platform.python_version(), "tvm_version": tvm.__version__,
                            "tvm_runtime_only": bool(getattr(tvm.base, "_RUNTIME_ONLY", False))}
    if manifest["runner"] == CUDA:
        info.update(gpu=dev.device_name, compute_version=dev.compute_version,
                    cuda_compile=os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc"))
    else:
        info["gpu"] = None
        info["device"] = "cpu: the SIMT runner (CPU times, never a GPU's)"
    return info


def time_candidate(pack: Path, manifest: dict[str, Any], entry: dict[str, Any], dev: Any,
                   settings: dict[str, int]) -> tuple[float, list[float]]:
    """The time of one candidate and the means it came from (see the module's doc)."""
    args = [tvm.runtime.tensor(a, dev)
            for a in arguments(entry["args"], entry["zeroed"], manifest["seed"])]
    artifact = str(pack / entry["artifact"])
    if manifest["runner"] == SIMT:
        from tvm_stitch.tuning import measure

        means = [float(measure.simt_seconds(artifact, settings["number"], *args))
                 for _ in range(settings["repeat"])]
        return min(means), means
    module = tvm.runtime.load_module(artifact)
    evaluator = module.time_evaluator(manifest["entry"], dev, number=settings["number"],
                                      repeat=settings["repeat"],
                                      min_repeat_ms=settings["min_repeat_ms"])
    means = [float(s) for s in evaluator(*args).results]
    return statistics.fmean(means), means


def describe(exc: BaseException) -> str:
    """One line for an exception: its type and the last line of its message."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:500]


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def run(pack: Path, results: Path, overrides: dict[str, int | None]) -> int:
    """Time every candidate of ``pack`` into ``results``; the exit status."""
    manifest = read_manifest(pack)
    settings = {k: v if overrides.get(k) is None else overrides[k]
                for k, v in DEFAULTS[manifest["runner"]].items()}
    dev = open_device(manifest)
    doc: dict[str, Any] = {
        "format": RESULTS_FORMAT,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(manifest, dev), "settings": settings, "complete": False,
        "manifest": manifest, "results": []}
    results.parent.mkdir(parents=True, exist_ok=True)
    write_json(results, doc)
    failed = 0
    for entry in manifest["candidates"]:
        try:
            seconds, means = time_candidate(pack, manifest, entry, dev, settings)
            if not math.isfinite(seconds) or seconds <= 0:
                raise ValueError(f"the timer gave {seconds} s")
            outcome = {"id": entry["id"], "seconds": seconds, "means": means, "error": ""}
            shown = f"{seconds * 1e6:12.2f} us"
        except Exception as exc:  # noqa: BLE001 (recorded: one candidate must not stop the run)
            failed += 1
            outcome = {"id": entry["id"], "seconds": None, "means": [], "error": describe(exc)}
            shown = f"failed: {outcome['error'][:200]}"
        doc["results"].append(outcome)
        write_json(results, doc)
        print(f"{entry['id']:10s} {','.join(entry['ops'])[:40]:40s} {shown}", flush=True)
    doc["complete"] = True
    write_json(results, doc)
    timed = len(manifest["candidates"]) - failed
    print(f"results: {results} ({timed} timed, {failed} failed)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pack", type=Path, help="the pack directory")
    parser.add_argument("results", type=Path, help="the results file to write")
    parser.add_argument("--number", type=int, help="runs per mean (default: per pack kind)")
    parser.add_argument("--repeat", type=int, help="means per candidate")
    parser.add_argument("--min-repeat-ms", type=int,
                        help="CUDA: run each mean at least this long (default 100)")
    args = parser.parse_args(argv)
    if any(n is not None and n < 1 for n in (args.number, args.repeat)):
        parser.error("--number and --repeat must be at least 1")
    try:
        return run(args.pack, args.results, {"number": args.number, "repeat": args.repeat,
                                             "min_repeat_ms": args.min_repeat_ms})
    except PackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
