"""Helpers of the stitch tests: compile with a flow, run on the SIMT runner, compare, nvcc."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from tvm_stitch import pipeline, verify
from tvm_stitch.analysis import ptxas
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.lowering import lower
from tvm_stitch.plan import GROUP_ATTR, Choices, StitchPlan
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.simt import SimtModule
from tvm_stitch.target import cuda_target
from tvm_stitch.tuning.tasks import extract_tasks

RTOL = ATOL = 1e-4


def import_onnx(model: onnx.ModelProto) -> IRModule:
    """The Relax module of ``model``, through our front end (TVM's importer alone gets some
    outputs wrong: ``tvm_stitch.frontend.outputs``)."""
    return import_model(model)


def single_task(model: onnx.ModelProto):
    """The one stitch task (``tuning.tasks``) of ``model`` for sm_90."""
    (task,) = extract_tasks(import_model(model), "cuda:sm_90")
    return task


def compiled_choosing(model: onnx.ModelProto, choices: Choices | None = None
                      ) -> tuple[IRModule, StitchPlan]:
    """``model`` scheduled by the stitch flow for sm_90, with ``choices`` fixed for every
    group (the rules' where None), and its plan."""
    if choices is None:
        scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    else:
        with choosing(FixedChoices(choices)):
            scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    return scheduled, StitchPlan.of_module(scheduled)


def legalized(mod: IRModule) -> IRModule:
    """``mod`` after the passes StitchFuse expects before it (LegalizeOps and friends)."""
    with cuda_target():
        return tvm.transform.Sequential([
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
        ])(mod)


def lower_stitch(model: onnx.ModelProto, target: str | tvm.target.Target = "cuda"
                 ) -> tuple[IRModule, StitchPlan]:
    """The scheduled module of ``model`` with the stitch flow, and its plan."""
    scheduled = pipeline.lower(import_onnx(model), target, flow="stitch")
    plan = StitchPlan.of_module(scheduled)
    assert plan is not None, "the stitch flow attaches its plan to the module"
    return scheduled, plan


def lower_baseline(model: onnx.ModelProto, target: str | tvm.target.Target = "cuda"
                   ) -> IRModule:
    """The scheduled module of ``model`` with TVM's own fusion (the baseline flow)."""
    return pipeline.lower(import_onnx(model), target, flow="baseline")


def run_simt(model: onnx.ModelProto, scheduled: IRModule, inputs: dict[str, np.ndarray]
             ) -> list[np.ndarray]:
    """Run ``scheduled`` on the SIMT runner with ``inputs`` in the model's input order."""
    args = [inputs[i.name] for i in model.graph.input if i.name in inputs]
    return SimtModule(scheduled)(*args)


def reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs for ``model``."""
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def assert_matches(outs: list[np.ndarray], refs: list[np.ndarray]) -> None:
    """Every output equals onnxruntime's within RTOL/ATOL (float16 within verify's float16
    tolerances)."""
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs, strict=True):
        tol = verify.RTOL["float16"] if out.dtype == np.float16 else RTOL
        np.testing.assert_allclose(out.astype("float64"), np.asarray(ref, "float64"),
                                   rtol=tol, atol=tol)


def stitched_functions(scheduled: IRModule) -> dict[str, tirx.PrimFunc]:
    """The stitched PrimFuncs of a scheduled module, by name."""
    return {gv.name_hint: f for gv, f in scheduled.functions_items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and GROUP_ATTR in f.attrs}


def kernel_count(func: tirx.PrimFunc, name: str) -> int:
    """Kernels one call of ``func`` launches."""
    return len(lower(func, name, cuda_target()).launches)


_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_cuda(source: str, arch: str) -> str:
    """Compile CUDA ``source`` to a cubin for ``arch`` with ``-Xptxas -v``; returns ptxas'
    report, raising AssertionError on a compile error."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cu"
        path.write_text(source)
        proc = subprocess.run([ptxas.find_nvcc(), f"-arch={arch}", "-cubin", "-O3", "-Xptxas",
                               "-v", "-o", str(Path(tmp) / "kernels.cubin"), str(path)],
                              capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def global_accesses(source: str, arch: str) -> set[str]:
    """The global load and store instructions (``ld.global.nc.v4.u32``, ...) of every kernel
    of CUDA ``source`` compiled to PTX for ``arch``."""
    return {a for counts in ptxas.global_accesses(source, arch).values() for a in counts}


def spills(report: str) -> list[tuple[int, int]]:
    """(spill stores, spill loads) of every kernel in a ptxas report."""
    return [(int(a), int(b)) for a, b in _SPILLS.findall(report)]


_STACK = re.compile(r"(\d+) bytes stack frame")


def stack_frames(report: str) -> list[int]:
    """The stack frame bytes of every kernel in a ptxas report (a local-memory array)."""
    return [int(n) for n in _STACK.findall(report)]


def module_cuda_source(scheduled: IRModule, arch: str) -> str:
    """The CUDA source of every kernel of ``scheduled``, as TVM builds it for ``arch``."""
    executable = pipeline.build(scheduled, cuda_target(arch))
    stack = [executable.mod]
    while stack:
        mod = stack.pop()
        if mod.kind == "cuda":
            return mod.inspect_source()
        stack.extend(mod.imports)
    raise AssertionError("no CUDA module in the executable")
