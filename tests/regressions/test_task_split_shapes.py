"""Task splitting lays out intermediates of any shape as sub-rows.

Fuzz graphs 4242:9 and :13: a LayerNormalization over axis -2 of (1000, 31) (one row of
31000) and over axis 0 of a (2, 32, 4, 255) broadcast (two rows of 65280) fell back: task
splitting refused "intermediate T_layer_norm_intermediate [1000, 31] is not laid out as 1
rows of 31000", and a block per row needs more registers than a thread has. Split rows now
take intermediates whose row-major layout is the rows, whatever their shape
(schedule/task_split.py)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def test_a_layer_norm_over_two_axes_of_one_long_row_is_split() -> None:
    shape = [1000, 31]
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["n"], axis=-2),
             helper.make_node("Relu", ["n"], ["y"])]
    built = model(nodes, {"x": shape}, {"y": shape},
                  {"g": np.linspace(0.5, 1.5, 31000, dtype=np.float32).reshape(shape)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.row_split > 1, group
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_an_output_read_inside_a_split_row_is_copied_as_sub_rows() -> None:
    # fuzz graphs 4242:118 and :296: a LayerNormalization over a whole (128, 255) tensor of a
    # pow that is also an output; the output's on-chip copy iterated (128, 255), not the
    # sub-rows ("block T_power_intermediate_shared does not iterate over the 51 rows
    # first"), and a block per row needed more registers than a thread has
    shape = [128, 255]
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Pow", ["a", "e"], ["p"]),
             helper.make_node("LayerNormalization", ["p", "g"], ["n"], axis=0),
             helper.make_node("Min", ["p", "n"], ["y"])]
    built = model(nodes, {"x": shape}, {"p": shape, "y": shape},
                  {"e": np.array(1.5, np.float32),
                   "g": np.linspace(0.5, 1.5, 128 * 255, dtype=np.float32).reshape(shape)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.row_split > 1 and any(b.role == "output" for b in group.buffers), group
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
