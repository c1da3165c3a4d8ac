"""float16 reductions accumulated in float16 in the stitch flow: TVM's legalization of sum,
mean, prod, variance, softmax and log-softmax reduces in the input's dtype, so a stitched
ReduceSum over (4, 30000) float16 started its partial sums at float16(0) and added halves to
them (a serial float16 sum of values about 1 stops growing at 4096; the stitched kernel's
parallel partial sums came out 2 half ulps off). The stitch flow now reduces in float32
(``transform.Float32Reductions``), as onnxruntime and PyTorch do and TVM's own layer_norm did
already. TVM's default flow still accumulates float16 sums, means and softmaxes in float16.
Owner: transform/float32_reductions.py."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm_ffi
from onnx import TensorProto, helper
from regression_models import model, needs_stitch
from tvm import s_tir, tirx
from tvm.ir import IRModule

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule import decisions
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.simt import SimtModule
from tvm_stitch.testing.differential import check_model, reference_outputs
from tvm_stitch.workloads import inputs
from tvm_stitch.workloads.inputs import set_input_dists, uniform

pytestmark = needs_stitch

ROW = 30000
AXES = {"axes": np.array([1], np.int64)}
NODES = {
    "ReduceSum": ([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], [4], AXES),
    "ReduceMean": ([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)], [4],
                   AXES),
    "Softmax": ([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [4, ROW], {}),
    "LayerNormalization": ([helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=-1)],
                           [4, ROW], {"g": np.ones(ROW, np.float16)}),
}


def _model(op: str):
    """``op`` over a (4, ROW) float16 input of values about 1 (a sum reaches 30000)."""
    nodes, out, constants = NODES[op]
    built = model(nodes, {"x": [4, ROW]}, {"y": out}, constants, TensorProto.FLOAT16)
    set_input_dists(built, {"x": uniform(0.5, 1.5)})
    return built


@functools.cache
def _scheduled(op: str, flow: str) -> IRModule:
    return verify.compile_model(_model(op), flow, "cuda:sm_90")


def _accumulator_dtypes(scheduled: IRModule) -> set[str]:
    """Dtypes of the buffers that reduction blocks (blocks with an init) accumulate into."""
    found: set[str] = set()

    def visit(block: s_tir.stmt.SBlock) -> None:
        if block.init is not None:
            found.update(str(w.source.dtype) for w in block.writes)

    for func in scheduled.functions.values():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func, [(s_tir.stmt.SBlock, visit)])
    return found


@pytest.mark.parametrize("op", sorted(NODES))
def test_stitched_float16_reductions_accumulate_in_float32(op: str) -> None:
    assert _accumulator_dtypes(_scheduled(op, "stitch")) == {"float32"}


@pytest.mark.parametrize("op", sorted(NODES))
def test_stitched_float16_reductions_match_the_float32_twin(op: str) -> None:
    """Within the float16 tolerance, and within one half ulp: the result of a float32
    reduction, rounded once to float16."""
    built = _model(op)
    feeds = inputs(built, 0)
    (y,) = SimtModule(_scheduled(op, "stitch"))(*feeds.values())
    (expected,) = reference_outputs(built, feeds)
    check = verify.compare([y], [expected])
    assert check.ok, check
    err = np.abs(y.astype(np.float64) - expected.astype(np.float64))
    assert np.all(err <= np.spacing(np.abs(expected)).astype(np.float64)), err.max()


def test_tvm_default_flow_sums_float16_in_float16() -> None:
    assert _accumulator_dtypes(_scheduled("ReduceSum", "baseline")) == {"float16"}


@pytest.mark.parametrize("node,out", [
    (helper.make_node("Softmax", ["x"], ["y"], axis=0), [4099, 64]),
    (helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0), [64]),
], ids=["column_softmax", "column_sum"])
def test_a_float16_reduction_left_to_tvm_is_fused_as_tvm_fuses_it(
        node, out, monkeypatch: pytest.MonkeyPatch) -> None:
    # a column reduction over 4099 rows falls back to TVM's fusion (it did while row tiles
    # had to divide the rows; now the test makes it). With casts of their own around the
    # float32 reduction, FuseOps fused neither into it: a cast kernel more, and for the
    # softmax 5.2 MB where TVM's flow moves 2.1 MB. One float32 PrimFunc per op, with the op
    # pattern of TVM's float16 op, fuses as TVM's flow does: as many kernels and bytes
    def left_to_tvm(*_args, **_kwargs):
        raise Unstitchable("left to TVM's fusion by the test")

    monkeypatch.setattr(decisions, "decide_global", left_to_tvm)
    built = model([node], {"x": [4099, 64]}, {"y": out}, {"axes": np.array([0], np.int64)},
                  TensorProto.FLOAT16)
    stitch = verify.compile_model(built, "stitch", "cuda:sm_90")
    baseline = verify.compile_model(built, "baseline", "cuda:sm_90")
    assert _accumulator_dtypes(stitch) == {"float32"}
    assert StitchPlan.of_module(stitch).fallbacks
    counted, tvm = analyze(stitch), analyze(baseline)
    assert len(counted.kernels) == len(tvm.kernels) == 1
    assert counted.global_bytes == tvm.global_bytes
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
