"""An input that holds one value is read where it is used, never staged in shared memory;
in a block computed lane by lane it is not copied a vector at a time (nor is an input read
at its own element and at another: schedule/lanes.py).

Fuzz graphs 4242:81, :140, :202, :226, :331, :353, :370 (large 0.05): a reduction over the
whole tensor (one row) with a 0-d or one-element operand fell back with "block
const1_shared: compute-at made 0 loops for (row, element)". Staging that operand per row
made a copy block without loops; every thread reads the same word, which the cache serves
(schedule/decisions/rows.py, ``_single_value``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def _max_then_where(shape: list[int], scale_shape: list[int]):
    """Where(x <= max(x), x, c) over the whole tensor: the max is one row, c one value."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1),
             helper.make_node("LessOrEqual", ["x", "m"], ["b"]),
             helper.make_node("Where", ["b", "x", "c"], ["y"])]
    return model(nodes, {"x": shape}, {"y": shape},
                 {"c": np.full(scale_shape, 0.25, np.float32)})


@pytest.mark.parametrize("shape,scale_shape", [([128, 13], []), ([1, 30000], [1]),
                                               ([4, 8], [1, 1])])
def test_a_one_value_operand_of_a_whole_tensor_reduction_stitches(
        shape: list[int], scale_shape: list[int]) -> None:
    built = _max_then_where(shape, scale_shape)
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    assert not any(b.name.startswith("const") for g in plan.groups for b in g.buffers), plan
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_scalar_input_of_a_block_computed_lane_by_lane_stitches() -> None:
    # fuzz graph 9001:24 (large 0.3): erf(x + s) with s a 0-d input, computed lane by lane
    # (erf has no vector form); looking for the inputs that move with the lanes indexed the
    # last dimension of s's read region, which has none: "scheduling failed: Index out of
    # range", and the group fell back (schedule/lanes.py)
    nodes = [helper.make_node("Add", ["x", "s"], ["a"]),
             helper.make_node("Erf", ["a"], ["y"])]
    built = model(nodes, {"x": [8192, 32], "s": []}, {"y": [8192, 32]})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert len(plan.groups) == 1 and not plan.fallbacks, plan.fallbacks
    assert plan.groups[0].lane_blocks
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error


def test_a_block_computed_lane_by_lane_reading_its_rows_first_element_stitches() -> None:
    # erf(x - x[:, :1]): the lane block reads x at its own element and at the row's first,
    # one region x[r, 0:c + 1] whose extent is not a number; taken for a moving input it
    # failed ("scheduling failed: int() argument must be ... not 'Sub'")
    nodes = [helper.make_node("Slice", ["x", "start", "end", "axes"], ["first"]),
             helper.make_node("Sub", ["x", "first"], ["d"]),
             helper.make_node("Erf", ["d"], ["y"])]
    built = model(nodes, {"x": [8192, 32]}, {"y": [8192, 32]},
                  {"start": np.array([0], np.int64), "end": np.array([1], np.int64),
                   "axes": np.array([1], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert len(plan.groups) == 1 and not plan.fallbacks, plan.fallbacks
    assert plan.groups[0].lane_blocks
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error
