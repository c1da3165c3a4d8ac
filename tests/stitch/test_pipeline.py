"""The "stitch" flow and Relax pipeline: registration and tvm.compile for CUDA and OpenCL."""

from __future__ import annotations

import importlib

import pytest
import stitch_patterns as patterns
import tvm
from stitch_helpers import import_onnx
from tvm import relax

import tvm_stitch
from tvm_stitch import pipeline
from tvm_stitch.plan import StitchPlan
from tvm_stitch.target import cuda_target, opencl_target


def _kinds(module: tvm.runtime.Module) -> set[str]:
    kinds, stack = set(), [module]
    while stack:
        m = stack.pop()
        kinds.add(m.kind)
        stack.extend(m.imports)
    return kinds


def test_flow_and_pipeline_are_registered_once() -> None:
    assert "stitch" in pipeline.available_flows()
    assert "stitch" in relax.pipeline.PIPELINE_MAP
    importlib.reload(tvm_stitch)  # a second import must not register twice
    assert "stitch" in relax.pipeline.PIPELINE_MAP


@pytest.mark.parametrize("target", [cuda_target("sm_80"), opencl_target()],
                         ids=["cuda", "opencl"])
def test_tvm_compile_with_stitch_pipeline(target: tvm.target.Target) -> None:
    model, _ = patterns.ln_softmax_add(16, 64)
    executable = tvm.compile(import_onnx(model), target, relax_pipeline="stitch")
    assert target.kind.name in _kinds(executable.mod)


def test_lower_keeps_the_plan_and_marks_kernels_scheduled() -> None:
    model, _ = patterns.ln_softmax_add(16, 64)
    scheduled = pipeline.lower(import_onnx(model), "cuda", flow="stitch")
    plan = StitchPlan.of_module(scheduled)
    assert plan is not None and len(plan.groups) == 1
    func = scheduled[plan.groups[0].function]
    assert bool(func.attrs["tirx.is_scheduled"])
    assert int(func.attrs["stitch.group"]) == 0
