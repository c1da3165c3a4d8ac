"""Stitched kernels at the real sizes of the micro patterns (vertical and horizontal packing,
1024-thread rows, demoted staging) compile with nvcc for sm_80 and sm_90 without spills."""

from __future__ import annotations

import functools

import pytest
from stitch_helpers import compile_cuda, import_onnx, spills, stitched_functions

from tvm_stitch import pipeline
from tvm_stitch.lowering import lower
from tvm_stitch.target import cuda_target
from tvm_stitch.workloads import registry

pytestmark = pytest.mark.nvcc


@functools.cache
def _stitched(name: str) -> dict:
    model = registry.get(name).model("real")
    return stitched_functions(pipeline.lower(import_onnx(model), "cuda", flow="stitch"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", registry.names("micro"))
def test_real_size_stitched_kernels_compile_without_spills(name: str, arch: str) -> None:
    for fname, func in _stitched(name).items():
        report = compile_cuda(lower(func, fname, cuda_target(arch)).source(), arch)
        found = spills(report)
        assert found and all(s == (0, 0) for s in found), report
