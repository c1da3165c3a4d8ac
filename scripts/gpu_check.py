#!/usr/bin/env python3
"""Run a pack from gpu_pack.py on the GPU machine with TVM's runtime alone; started by
gpu_check.sh, which sets up the runtime (TVM_USE_RUNTIME_LIB=1, the packed tvm and tvm-ffi).

For every workload: load each flow's library, run it on the pack's inputs (regenerated from
their recipes when too large to ship) in a Relax VM and compare with onnxruntime's outputs
(shipped, or computed here on the CPU; ``ok`` stays null, with the reason under ``timing``, when
onnxruntime is missing here), time it with the VM's time evaluator; then time the PyTorch
program eagerly and under ``torch.compile`` (checked the same way), using CUDA events.
Results go to ``OUT/results.json``, rewritten after every step so that a run stopped at any
point leaves valid JSON; every column of every workload ends up with a status: ``measured``,
``failed: ...``, ``not available: ...`` or ``skipped: ...``. A number appears in
``measured_us`` only when it was measured in this run.

Measured time is the median over ``--repeat`` repeats of the mean time per call, each repeat
running the call often enough to last ``--min-repeat-ms`` (TVM's ``min_repeat_ms`` semantics),
after warm-up; ``timing`` keeps mean, min and max and the per-call counts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

TORCH_COLUMNS = ("torch_eager", "torch_compile")
PENDING = "pending"
MEASURED = "measured"
# rtol = atol per float dtype; integers and bools compare exactly. float16 as tvm_stitch.verify
# (this script runs with TVM's runtime alone, without tvm_stitch: tests/scripts checks that they
# agree). Other floats at 1e-3, not verify's 1e-4, for the reference, not the GPU: it is
# onnxruntime's float32 at real sizes, whose long sums are themselves off by more than 1e-4
# (layernorm_backward: its 768 column sums over 8192 rows by up to 1.3e-3 from its float64
# twin's, one outside 1e-4), where the differential tests take the float64 twin's
# (tvm_stitch.testing.differential.LONG_REDUCTION). Fast math is not the reason: the workloads
# without such sums were within 2e-5 on the H200 (docs/results/gpu-2026-11-29-h200.md).
TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2}
DEFAULT_TOLERANCE = 1e-3


class Deadline(Exception):
    """The run must stop: its time budget is spent, or it got SIGTERM."""


class StepTimeout(Exception):
    """One step (a measurement, a torch.compile) took longer than its own limit."""


class Budget:
    """Seconds left before the run must have stopped cleanly."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left."""
        return self.deadline - time.monotonic()


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``StepTimeout`` in the main thread after ``seconds`` (Python code only: a call
    stuck in C is stopped by gpu_check.sh's outer timeout instead)."""

    def alarm(signum: int, frame: Any) -> None:
        raise StepTimeout(f"no result within {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------
# Results


def new_entry(workload: dict[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    """A results entry for one workload with every column pending."""
    return {
        "name": workload["name"],
        "kind": workload["kind"],
        "size": workload["size"],
        "measured_us": {c: None for c in columns},
        "max_abs_err": {c: None for c in columns},
        "ok": {c: None for c in columns},
        "status": {c: PENDING for c in columns},
        "timing": {},
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def finalize(doc: dict[str, Any], reason: str) -> dict[str, Any]:
    """Mark every still-pending column skipped for ``reason``; the document is then complete."""
    pending = 0
    for entry in doc["workloads"]:
        for column, status in entry["status"].items():
            if status == PENDING:
                entry["status"][column] = f"skipped: {reason}"
                pending += 1
    if pending and doc.get("stopped") is None:
        doc["stopped"] = reason
    doc["complete"] = True
    return doc


class Results:
    """``results.json``, saved after every recorded step."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path = path
        self.doc = doc
        self.by_name = {e["name"]: e for e in doc["workloads"]}
        self.save()

    def save(self) -> None:
        """Write the current state."""
        write_json(self.path, self.doc)

    def record(
        self,
        name: str,
        column: str,
        status: str,
        seconds: Sequence[float] | None = None,
        check: tuple[bool | None, float | None] | None = None,
        **timing: Any,
    ) -> None:
        """Record one column of one workload: its status, per-call seconds of each repeat,
        and the output check (ok, max abs error)."""
        entry = self.by_name[name]
        entry["status"][column] = status
        if check is not None:
            entry["ok"][column], entry["max_abs_err"][column] = check
        if seconds:
            us = sorted(s * 1e6 for s in seconds)
            entry["measured_us"][column] = float(np.median(us))
            timing.update(mean_us=float(np.mean(us)), min_us=us[0], max_us=us[-1])
        if timing:
            entry["timing"][column] = timing
        self.save()


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> tuple[bool, float | None]:
    """(all outputs close, max abs error); rtol = atol = ``TOLERANCE`` for the dtype (else
    ``DEFAULT_TOLERANCE``) for floats, exact for integers. The error is None when the outputs
    do not even have the expected shapes."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want, strict=False)):
        return False, None
    ok, err = True, 0.0
    for g, w in zip(got, want, strict=True):
        tol = TOLERANCE.get(str(w.dtype), DEFAULT_TOLERANCE) if w.dtype.kind in "fc" else 0.0
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.size:
            diff = np.abs(g64 - w64)
            err = max(err, float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else math.inf)
        ok = ok and bool(np.allclose(g64, w64, rtol=tol, atol=tol, equal_nan=True))
    return ok, err if math.isfinite(err) else None


# ---------------------------------------------------------------------------------------------
# Arrays: shipped in data/<workload>.npz, or regenerated from a seeded recipe


def digest(array: np.ndarray) -> str:
    """A fingerprint of an array's dtype, shape and bytes."""
    h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:32]


def regenerate(recipe: dict[str, Any]) -> np.ndarray:
    """The array a recipe describes: values uniform in ``[low, high)`` (integers for ``int``)
    from PCG64's raw stream for ``seed``, which numpy keeps stable across versions."""
    shape = tuple(recipe["shape"])
    raw = np.random.PCG64(recipe["seed"]).random_raw(int(np.prod(shape, dtype=np.int64)))
    low, high = recipe["low"], recipe["high"]
    if recipe["kind"] == "int":
        values = np.int64(low) + (raw % np.uint64(high - low)).astype(np.int64)
    else:
        values = low + (high - low) * ((raw >> np.uint64(11)).astype(np.float64) * 2.0**-53)
    return values.astype(recipe["dtype"]).reshape(shape)


def load_array(source: dict[str, Any], data: Any) -> np.ndarray:
    """An array of the pack: ``{"array": key}`` in the workload's npz, or ``{"recipe": ...}``
    regenerated and checked against the pack's fingerprint."""
    if "array" in source:
        return data[source["array"]]
    array = regenerate(source["recipe"])
    if digest(array) != source["recipe"]["sha256"]:
        raise RuntimeError("a regenerated array differs from the pack's (numpy changed PCG64?)")
    return array


class Workload:
    """One workload of the pack: its arrays, loaded on first use."""

    def __init__(self, pack: Path, spec: dict[str, Any]) -> None:
        self.pack = pack
        self.spec = spec
        self.name: str = spec["name"]
        self.data = np.load(pack / spec["data"]) if spec["data"] else {}
        self._inputs: list[np.ndarray] | None = None
        self._expected: list[np.ndarray] | None = None
        self.reference_note: str | None = None

    def inputs(self) -> list[np.ndarray]:
        """The seeded inputs, in graph input order."""
        if self._inputs is None:
            self._inputs = [load_array(i["source"], self.data) for i in self.spec["inputs"]]
        return self._inputs

    def params(self) -> list[np.ndarray]:
        """Weights the libraries take as VM inputs after the graph inputs (none if embedded)."""
        return [load_array(p, self.data) for p in self.spec["params"]]

    def expected(self) -> list[np.ndarray] | None:
        """onnxruntime's outputs: from the pack, or computed here on the CPU when they were too
        large to ship; None (with ``reference_note``) when onnxruntime is missing here."""
        if self._expected is not None:
            return self._expected
        reference = self.spec["reference"]
        if reference == "pack":
            self._expected = [self.data[f"output_{i}"] for i in range(len(self.spec["outputs"]))]
            return self._expected
        try:
            import onnxruntime as ort
        except ImportError as exc:
            self.reference_note = f"outputs not checked: {describe(exc)}"
            return None
        session = ort.InferenceSession(
            str(self.pack / reference["onnx"]), providers=["CPUExecutionProvider"]
        )
        feeds = {f["name"]: load_array(f["source"], self.data) for f in reference["feeds"]}
        self._expected = [np.asarray(o) for o in session.run(None, feeds)]
        return self._expected

    def check(self, got: Sequence[np.ndarray]) -> tuple[bool | None, float | None]:
        """(ok, max abs error) against the expected outputs; (None, None) without them."""
        want = self.expected()
        return compare(got, want) if want is not None else (None, None)


# ---------------------------------------------------------------------------------------------
# TVM


def open_device(kind: str) -> Any:
    """The TVM device to run on; for CUDA, loads TVM's CUDA runtime library first (the
    runtime-only import does not)."""
    import tvm

    if kind == "cpu":
        return tvm.cpu(0)
    if tvm_ffi_global("ffi.Module.load_from_bytes.cuda") is None:
        from tvm_ffi.libinfo import load_lib_ctypes

        lib_dir = Path(tvm.libinfo.find_libtvm_runtime()).parent
        load_lib_ctypes("tvm", "tvm_runtime_cuda", "RTLD_LOCAL", [lib_dir])
    dev = tvm.cuda(0)
    if not dev.exist:
        raise RuntimeError("TVM sees no CUDA device")
    return dev


def tvm_ffi_global(name: str) -> Any:
    """The tvm-ffi global function ``name``, or None."""
    import tvm_ffi

    return tvm_ffi.get_global_func(name, allow_missing=True)


def flatten(value: Any) -> list[np.ndarray]:
    """VM outputs (a tensor or nested tuples of tensors) as numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in flatten(v)]


def arch_mismatch(manifest: dict[str, Any], dev: Any) -> str | None:
    """Why the pack's cubins cannot run on ``dev``, or None."""
    arch = manifest.get("arch")
    if manifest["device"] != "cuda" or not arch:
        return None
    have = "sm_" + str(dev.compute_version).replace(".", "")
    return None if have == arch else f"libraries hold cubins for {arch}, the device is {have}"


def measure_tvm(
    path: Path, dev: Any, workload: Workload, opts: Any
) -> tuple[list[float], tuple[bool | None, float | None], dict[str, Any]]:
    """Load one library, check its outputs, and time ``main`` with the time evaluator."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    vm = VirtualMachine(tvm.runtime.load_module(str(path)), dev)
    arrays = [*workload.inputs(), *workload.params()]
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in arrays]
    check = workload.check(flatten(vm["main"](*args)))
    evaluator = vm.time_evaluator(
        "main", dev, number=1, repeat=opts.repeat, min_repeat_ms=opts.min_repeat_ms
    )
    result = evaluator(*args)
    return list(result.results), check, {"repeat": opts.repeat, "timer": "tvm time_evaluator"}


# ---------------------------------------------------------------------------------------------
# PyTorch


def torch_call(
    workload: Workload, device: str, programs: dict[str, Callable]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The PyTorch program of a workload and its arguments, already on ``device``."""
    import gpu_torch_refs as refs
    import torch

    spec = workload.spec["torch"]
    inputs = refs.to_device(workload.inputs(), device)
    if spec["program"] == "onnx_replay":
        consts = [load_array(c, workload.data) for c in spec["consts"]]
        return programs[spec["function"]], (refs.to_device(consts, device), *inputs)
    if spec["program"] == "torch.export":
        module = torch.export.load(str(workload.pack / spec["path"])).module().to(device)
        return module, tuple(inputs)
    raise ValueError(f"unknown PyTorch program kind {spec['program']!r}")


def time_torch(call: Callable[[], Any], device: str, opts: Any) -> tuple[list[float], int]:
    """Per-call seconds of each repeat (CUDA events on a GPU) and the calls per repeat."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        call()
    sync()
    number, elapsed = 1, 0.0
    while number < 1 << 20:
        start = time.perf_counter()
        for _ in range(number):
            call()
        sync()
        elapsed = time.perf_counter() - start
        if elapsed * 1e3 >= opts.min_repeat_ms / 4:
            break
        number *= 2
    number = max(1, math.ceil(number * opts.min_repeat_ms / 1e3 / max(elapsed, 1e-9)))
    seconds = []
    for _ in range(opts.repeat):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(number):
                call()
            end.record()
            end.synchronize()
            seconds.append(begin.elapsed_time(end) / 1e3 / number)
        else:
            start = time.perf_counter()
            for _ in range(number):
                call()
            seconds.append((time.perf_counter() - start) / number)
    return seconds, number


# ---------------------------------------------------------------------------------------------
# The run


def machine_info(dev: Any, kind: str) -> dict[str, Any]:
    """What ran this: host, GPU, driver, library versions, and which tvm was imported."""
    import tvm

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tvm_version": tvm.__version__,
        "tvm_file": tvm.__file__,
        "tvm_runtime_only": bool(tvm.base._RUNTIME_ONLY),
        "tvm_libs_loaded": sorted(tvm.base._LOADED_LIBS),
        "device": kind,
        "nvidia_smi": os.environ.get("GPU_CHECK_NVIDIA_SMI") or None,
    }
    if kind == "cuda":
        info.update(gpu=dev.device_name, compute_version=dev.compute_version)
    try:
        import torch

        info.update(torch_version=torch.__version__, torch_cuda=torch.version.cuda)
    except ImportError:
        info["torch_version"] = None
    return info


def run_step(
    results: Results, name: str, column: str, limit_s: float, budget: Budget, step: Callable
) -> None:
    """Run ``step()`` within ``limit_s`` and the budget; it records its own success, failures
    are recorded here. Raises ``Deadline`` when the budget ran out."""
    try:
        with time_limit(min(limit_s, budget.left())):
            step()
    except StepTimeout as exc:
        if budget.left() <= 1:
            raise Deadline("time budget") from exc
        results.record(name, column, f"failed: {exc}")
    except Deadline:
        raise
    except Exception as exc:  # noqa: BLE001 (recorded per column)
        results.record(name, column, f"failed: {describe(exc)}")


def run_tvm_phase(
    pack: Path,
    manifest: dict[str, Any],
    workloads: Sequence[Workload],
    results: Results,
    dev: Any,
    budget: Budget,
    opts: Any,
) -> None:
    """Check and time every library of every workload."""
    mismatch = arch_mismatch(manifest, dev)
    for workload in workloads:
        for flow in manifest["flows"]:
            name = workload.name
            if flow in opts.skip:
                results.record(name, flow, "skipped: --skip")
            elif flow in workload.spec["build_errors"]:
                error = workload.spec["build_errors"][flow]
                results.record(name, flow, f"not available: build failed when packing: {error}")
            elif mismatch:
                results.record(name, flow, f"not available: {mismatch}")
            elif budget.left() < opts.step_s:
                results.record(name, flow, f"skipped: time budget ({budget.left():.0f} s left)")
            else:
                lib = pack / workload.spec["libs"][flow]

                def step(lib: Path = lib, flow: str = flow, workload: Workload = workload) -> None:
                    seconds, check, timing = measure_tvm(lib, dev, workload, opts)
                    if workload.reference_note:
                        timing["reference"] = workload.reference_note
                    results.record(workload.name, flow, MEASURED, seconds, check, **timing)

                run_step(results, name, flow, opts.step_limit_s, budget, step)
            print_step(results, name, flow)


def run_torch_phase(
    pack: Path,
    manifest: dict[str, Any],
    workloads: Sequence[Workload],
    results: Results,
    budget: Budget,
    opts: Any,
) -> None:
    """Check and time every workload's PyTorch program, eagerly, then under torch.compile."""
    columns = [c for c in TORCH_COLUMNS if c not in opts.skip]
    for column in TORCH_COLUMNS:
        if column in opts.skip:
            for workload in workloads:
                results.record(workload.name, column, "skipped: --skip")
    if not columns:
        return
    try:
        import gpu_torch_refs as refs
        import torch
    except ImportError as exc:
        for workload in workloads:
            for column in columns:
                results.record(workload.name, column, f"not available: {describe(exc)}")
                print_step(results, workload.name, column)
        return
    device = "cuda" if manifest["device"] == "cuda" else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)  # the CPU self-test shares its cores with TVM's thread pool
    programs = refs.load_programs(pack / "torch_refs" / "programs.py")
    for column in columns:
        for workload in workloads:
            name = workload.name
            if "reason" in workload.spec["torch"]:
                results.record(name, column, f"not available: {workload.spec['torch']['reason']}")
            elif budget.left() < (opts.compile_s if column == "torch_compile" else opts.step_s):
                results.record(name, column, f"skipped: time budget ({budget.left():.0f} s left)")
            else:

                def step(workload: Workload = workload, column: str = column) -> None:
                    fn, args = torch_call(workload, device, programs)
                    with torch.no_grad():
                        measure_torch_column(results, workload, column, fn, args, device, opts)

                limit = opts.compile_limit_s if column == "torch_compile" else opts.step_limit_s
                try:
                    run_step(results, name, column, limit, budget, step)
                finally:
                    if column == "torch_compile":
                        torch._dynamo.reset()
            print_step(results, name, column)


def measure_torch_column(
    results: Results,
    workload: Workload,
    column: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    device: str,
    opts: Any,
) -> None:
    """Check and time one PyTorch column of one workload."""
    import gpu_torch_refs as refs
    import torch

    timer = "cuda events" if device.startswith("cuda") else "perf_counter"
    timing: dict[str, Any] = {"repeat": opts.repeat, "timer": timer}
    if column == "torch_compile":
        fn = torch.compile(fn)
        start = time.perf_counter()
        first = fn(*args)  # compiles
        timing["compile_s"] = time.perf_counter() - start
        timing["mode"] = "default"
    else:
        first = fn(*args)
    check = workload.check(refs.to_numpy(first))
    if workload.reference_note:
        timing["reference"] = workload.reference_note
    seconds, number = time_torch(lambda: fn(*args), device, opts)
    results.record(workload.name, column, MEASURED, seconds, check, number=number, **timing)


def selected(manifest: dict[str, Any], opts: Any) -> list[dict[str, Any]]:
    """The manifest's workloads, filtered by ``--workloads``."""
    wanted = set(opts.workloads.split(",")) if opts.workloads else None
    return [w for w in manifest["workloads"] if wanted is None or w["name"] in wanted]


def describe(exc: BaseException) -> str:
    """One line for an exception."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
    return text[:500]


def print_step(results: Results, name: str, column: str) -> None:
    """One progress line."""
    entry = results.by_name[name]
    us, ok = entry["measured_us"][column], entry["ok"][column]
    shown = f"{us:10.2f} us  ok={ok}" if us is not None else entry["status"][column][:100]
    print(f"{name:32s} {column:16s} {shown}", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line of gpu_check.py."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, help="unpacked pack directory")
    parser.add_argument("--out", type=Path, help="directory for results.json")
    parser.add_argument("--budget-s", type=float, default=440.0, help="stop cleanly by then")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--min-repeat-ms", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=5.0, help="time one measurement needs")
    parser.add_argument(
        "--compile-s", type=float, default=45.0, help="time left needed to start a torch.compile"
    )
    parser.add_argument(
        "--step-limit-s", type=float, default=60.0, help="longest one measurement may take"
    )
    parser.add_argument(
        "--compile-limit-s",
        type=float,
        default=120.0,
        help="longest one torch.compile check and timing may take",
    )
    parser.add_argument("--workloads", help="comma-separated names (default: all in the pack)")
    parser.add_argument("--skip", default="", help="columns to skip, e.g. torch_compile")
    parser.add_argument(
        "--finalize",
        type=Path,
        help="only mark a results.json's pending "
        "columns skipped (after gpu_check.sh killed the run)",
    )
    parser.add_argument("--reason", default="killed at the global time limit")
    args = parser.parse_args(argv)
    args.skip = {s for s in args.skip.split(",") if s}
    if args.finalize is None and (args.pack is None or args.out is None):
        parser.error("--pack and --out are required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; 0 when every measured column's outputs matched and none failed."""
    opts = parse_args(argv)
    if opts.finalize is not None:
        write_json(opts.finalize, finalize(json.loads(opts.finalize.read_text()), opts.reason))
        return 0
    budget = Budget(opts.budget_s)

    def terminate(signum: int, frame: Any) -> None:
        raise Deadline("terminated")

    signal.signal(signal.SIGTERM, terminate)
    manifest = json.loads((opts.pack / "manifest.json").read_text())
    columns = [*manifest["flows"], *TORCH_COLUMNS]
    opts.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": None,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "pack": {k: manifest[k] for k in ("created", "device", "target", "arch", "flows", "size")},
        "settings": {
            "repeat": opts.repeat,
            "min_repeat_ms": opts.min_repeat_ms,
            "budget_s": opts.budget_s,
            "tolerance": DEFAULT_TOLERANCE,
        },
        "complete": False,
        "stopped": None,
        "workloads": [new_entry(w, columns) for w in selected(manifest, opts)],
    }
    results = Results(opts.out / "results.json", doc)
    reason = "not reached"  # nothing stays pending when both phases finish
    try:
        dev = open_device(manifest["device"])
        doc["machine"] = machine_info(dev, manifest["device"])
        results.save()
        workloads = [Workload(opts.pack, spec) for spec in selected(manifest, opts)]
        run_tvm_phase(opts.pack, manifest, workloads, results, dev, budget, opts)
        run_torch_phase(opts.pack, manifest, workloads, results, budget, opts)
    except Deadline as exc:
        reason = f"run stopped ({exc})"
    except Exception as exc:
        reason = f"run aborted ({describe(exc)})"
        doc["error"] = describe(exc)
        raise
    finally:
        finalize(doc, reason)
        results.save()
    entries = doc["workloads"]
    failed = [s for e in entries for s in e["status"].values() if s.startswith("failed")]
    wrong = [v for e in entries for v in e["ok"].values() if v is False]
    print(f"results: {results.path} ({len(failed)} failed, {len(wrong)} with wrong outputs)")
    return 1 if failed or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
