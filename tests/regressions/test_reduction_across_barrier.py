"""A row reduction read after a grid barrier is copied to global memory in its own phase.

Fuzz graphs 4242:150, :195, :261 (large 0.05): a mean of every row that a softmax over the
rows (or a LayerNorm over the means) reads fell back with "in0_red is read by compute after
a grid barrier and cannot be recomputed: The block has init statement". A Global group
recomputes an element-wise intermediate where a later phase reads it; a reduction's result
cannot be, and nothing on chip survives the barrier (schedule/phases.py,
``copy_across_barrier``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import BufferRole, StitchPlan
from tvm_stitch.testing.differential import check_model


def _mean_then_softmax_over_rows(rows: int, length: int):
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("LogSoftmax", ["m"], ["y"], axis=0)]
    return model(nodes, {"x": [rows, length]}, {"y": [rows, 1]},
                 {"axes": np.array([1], np.int64)})


@pytest.mark.usefixtures("global_at_any_cost")  # (7, 255), (256, 512): estimated slower
@pytest.mark.parametrize("rows,length", [(7, 255), (256, 512), (1000, 96)])
def test_a_softmax_over_row_means_stitches(rows: int, length: int) -> None:
    built = _mean_then_softmax_over_rows(rows, length)
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    (crossing,) = [b for b in group.buffers if b.role is BufferRole.CROSSING]
    later = [p for p in group.phases if crossing.block not in p.blocks]
    assert crossing.readers and all(any(r in p.blocks for p in later)
                                    for r in crossing.readers), crossing
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_two_reduction_results_read_after_a_barrier_are_both_copied() -> None:
    # fuzz graphs 4242:1200 and :1239: a row softmax whose max and sum a column softmax over
    # its result reads after the barrier; the second copy looked up the roles of a schedule
    # without the first one (KeyError 'T_softmax_maxelem_global': stitching gave up)
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["s"], axis=1),
             helper.make_node("Softmax", ["s"], ["y"], axis=-2)]
    built = model(nodes, {"x": [3, 256]}, {"s": [3, 256], "y": [3, 256]},
                  {"w": np.linspace(0.5, 1.5, 256, dtype=np.float32)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    # it builds; the yardstick then keeps TVM's kernels (the later phases recompute the
    # softmax from x: more bytes than TVM's three kernels at this size)
    assert not plan.notes, plan.notes
    assert all("moves" in f.reason for f in plan.fallbacks), plan.fallbacks
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
