"""Every ci-size workload of the zoo through the stitch flow: each kernel runs on the SIMT
runner and the model matches onnxruntime; every kernel's CUDA source compiles with nvcc for
sm_80 and sm_90 without register spills."""

from __future__ import annotations

import functools

import pytest
from stitch_helpers import (
    assert_matches,
    compile_cuda,
    import_onnx,
    module_cuda_source,
    reference,
    run_simt,
    spills,
)

from tvm_stitch import pipeline
from tvm_stitch.workloads import registry

NAMES = registry.names()


@functools.cache
def _workload(name: str):
    wl = registry.get(name)
    model = wl.model("ci")
    scheduled = pipeline.lower(import_onnx(model), "cuda", flow="stitch")
    return model, wl.inputs("ci"), scheduled


@pytest.mark.parametrize("name", NAMES)
def test_workload_runs_and_matches_onnxruntime(name: str) -> None:
    model, inputs, scheduled = _workload(name)
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", NAMES)
def test_workload_kernels_compile_without_spills(name: str, arch: str) -> None:
    _, _, scheduled = _workload(name)
    report = compile_cuda(module_cuda_source(scheduled, arch), arch)
    found = spills(report)
    assert found, report
    assert all(s == (0, 0) for s in found), report
