"""The workloads of the stitching issue at their real sizes: one kernel each, and the traffic
and roofline targets (counted from the scheduled TIR; no GPU needed)."""

from __future__ import annotations

import functools

import pytest
from stitch_helpers import import_onnx

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import DemotionKind, StitchPlan
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.workloads import registry

WORKLOADS = ["rowreduce_750000x32", "softmax_64x30000", "colsum_8192x1024",
             "layernorm_backward", "batchnorm_train", "adam_update", "logsoftmax_nll",
             "cross_entropy_128256"]


@functools.cache
def _report(name: str, flow: str):
    scheduled = pipeline.lower(import_onnx(registry.get(name).model("real")), "cuda",
                               flow=flow)
    return scheduled, analyze(scheduled)


@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_is_one_kernel(name: str) -> None:
    scheduled, report = _report(name, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks
    assert len(report.kernels) == 1
    (group,) = plan.groups
    (kernel,) = report.kernels
    assert kernel.blocks == group.launch.grid  # the launch the plan decided
    if group.phases:  # a persistent grid: every block resident at once
        assert group.launch.grid <= group.launch.wave


@pytest.mark.parametrize(("name", "ratio"), [("layernorm_backward", 1.3), ("adam_update", 1.0),
                                             ("rowreduce_750000x32", 1.0),
                                             ("colsum_8192x1024", 1.2),
                                             ("logsoftmax_nll", 1.05),
                                             ("cross_entropy_128256", 1.01),
                                             ("softmax_64x30000", 1.05),
                                             ("batchnorm_train", 2.2)])
def test_traffic_ratio(name: str, ratio: float) -> None:
    assert _report(name, "stitch")[1].traffic_ratio <= ratio + 1e-6


@pytest.mark.parametrize("name", ["rowreduce_750000x32", "softmax_64x30000"])
def test_irregular_shapes_take_at_most_half_the_baseline_time(name: str) -> None:
    stitched = _report(name, "stitch")[1]
    baseline = _report(name, "baseline")[1]
    assert stitched.roofline_us()["H200"] <= 0.5 * baseline.roofline_us()["H200"]
    (kernel,) = stitched.kernels
    assert kernel.waves()["H200"] <= 1.0  # the grid fits one wave: parallelism, not launches


@pytest.mark.parametrize("name", ["logsoftmax_nll", "batchnorm_train"])
def test_long_row_tiles_do_not_spill(name: str) -> None:
    """Their row tiles are longer than the register cap allows for a held tile (nvcc reloads
    a long row walk rather than holding it): ptxas must agree, with no spills."""
    scheduled, _ = _report(name, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert any(d.kind is DemotionKind.ROW_TILES_KEPT for d in group.demotions)
    kernels = check_resources(scheduled).kernels
    assert kernels and all(k.spill_bytes == 0 for k in kernels), kernels
