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
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def _mean_then_softmax_over_rows(rows: int, length: int):
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("LogSoftmax", ["m"], ["y"], axis=0)]
    return model(nodes, {"x": [rows, length]}, {"y": [rows, 1]},
                 {"axes": np.array([1], np.int64)})


@pytest.mark.parametrize("rows,length", [(7, 255), (256, 512), (1000, 96)])
def test_a_softmax_over_row_means_stitches(rows: int, length: int) -> None:
    built = _mean_then_softmax_over_rows(rows, length)
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert any(b.role == "crossing" for b in group.buffers), group
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
