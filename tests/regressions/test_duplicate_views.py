"""Reshapes that TVM makes views are not written by a stitched kernel (fuzz graphs 4242:8 and
4242:20): a group of reshapes only, or a reshape passing out of its group a value the group
passes out anyway, wrote a second copy of it, and the yardstick sent the whole group back to
TVM ("the stitched kernel moves 94488 B ..., TVM's fusion of the same ops 47244 B")."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import global_bytes
from regression_models import model as _model

from tvm_stitch import verify
from tvm_stitch.graph.grouping import DUPLICATE_VIEW, NOTHING_TO_STITCH
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def test_a_reshape_of_a_group_output_is_a_view_not_a_second_output() -> None:
    nodes = [helper.make_node("GreaterOrEqual", ["x", "c"], ["ge"]),
             helper.make_node("Where", ["ge", "x", "d"], ["w"]),
             helper.make_node("Reshape", ["w", "shape"], ["r"]),
             helper.make_node("ReduceMax", ["w"], ["m"], keepdims=1)]
    model = _model(nodes, {"x": [31, 127]}, {"r": [31, 1, 127], "m": [1, 1]},
                   {"c": np.array(0.1, np.float32), "d": np.array(-0.5, np.float32),
                    "shape": np.array([31, 1, 127], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert [f.reason for f in plan.fallbacks] == [DUPLICATE_VIEW], plan.fallbacks
    assert any("where" in op for g in plan.groups for op in g.ops), plan
    assert global_bytes(model, "stitch") <= global_bytes(model, "baseline")
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_identity_transposes_alone_are_left_to_tvm_as_views() -> None:
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[0, 1])]
    model = _model(nodes, {"x": [2, 100]}, {"t": [2, 100], "u": [2, 100]}, {})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    # removed (transform.identity_views): nothing left to stitch or to leave to TVM
    assert not plan.groups
    assert all(f.reason in NOTHING_TO_STITCH for f in plan.fallbacks), plan.fallbacks
    assert global_bytes(model, "stitch") <= global_bytes(model, "baseline")
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_reshape_of_a_group_input_passed_out_is_a_view() -> None:
    # fuzz graph 4242:30: the group wrote the reshaped input out as well as its result
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("Reshape", ["r", "s2"], ["r2"]),
             helper.make_node("Abs", ["b"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["h"]),
             helper.make_node("Div", ["r2", "h"], ["y"])]
    model = _model(nodes, {"x": [7, 31], "b": [31]}, {"r": [1, 7, 31], "y": [1, 7, 1, 31]},
                   {"s1": np.array([1, 7, 31], np.int64),
                    "s2": np.array([1, 7, 1, 31], np.int64), "half": np.array(0.5, np.float32)})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert [f.reason for f in plan.fallbacks] == [DUPLICATE_VIEW], plan.fallbacks
    assert len(plan.groups) == 1
    assert global_bytes(model, "stitch") <= global_bytes(model, "baseline")
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_two_reshapes_of_one_computed_value_passed_out_are_views_of_it() -> None:
    # fuzz graph 4242:66: a maximum read only through two views wrote both views out
    nodes = [helper.make_node("Max", ["x", "c"], ["m"]),
             helper.make_node("Reshape", ["m", "s1"], ["r1"]),
             helper.make_node("Reshape", ["m", "s2"], ["r2"])]
    model = _model(nodes, {"x": [16, 30]}, {"r1": [480], "r2": [16, 1, 30]},
                   {"c": np.array(0.25, np.float32), "s1": np.array([480], np.int64),
                    "s2": np.array([16, 1, 30], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert DUPLICATE_VIEW in [f.reason for f in plan.fallbacks], plan.fallbacks
    assert all(f.reason in NOTHING_TO_STITCH for f in plan.fallbacks), plan.fallbacks
    assert global_bytes(model, "stitch") <= global_bytes(model, "baseline")
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_reshape_read_inside_and_passed_out_next_to_its_source_is_a_view() -> None:
    # fuzz graph 4242:205: an add passed out, and a reshape of it that a tanh reads inside the
    # group passed out too: the kernel wrote the add twice and recomputed it for the tanh
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]),
             helper.make_node("Add", ["a", "z"], ["y"]),
             helper.make_node("Reshape", ["a", "shape"], ["r"]),
             helper.make_node("Tanh", ["r"], ["t"])]
    model = _model(nodes, {"x": [128, 3], "z": [128, 3]},
                   {"a": [128, 3], "y": [128, 3], "r": [128, 1, 3], "t": [128, 1, 3]},
                   {"b": np.array([0.5, -0.25, 1.0], np.float32),
                    "shape": np.array([128, 1, 3], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert not any("reshape" in out for out in group.outputs), group
    assert global_bytes(model, "stitch") <= global_bytes(model, "baseline") * 3 // 4
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_reshape_of_a_reshaped_input_passed_out_is_a_view() -> None:
    # fuzz graph 4242:426: the group read its input through a reshape and passed out a reshape
    # of that reshape, a second copy of the input (32768 B against TVM's 16384 B)
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["v"]),
             helper.make_node("Neg", ["v"], ["n"]),
             helper.make_node("Reshape", ["v", "s2"], ["r"]),
             helper.make_node("Abs", ["n"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["h"]),
             helper.make_node("Div", ["v", "h"], ["y"])]
    model = _model(nodes, {"x": [2, 1024]}, {"r": [2048], "y": [1, 2, 1024]},
                   {"s1": np.array([1, 2, 1024], np.int64), "s2": np.array([-1], np.int64),
                    "half": np.array(0.5, np.float32)})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert all(f.reason == DUPLICATE_VIEW for f in plan.fallbacks), plan.fallbacks
    assert len(plan.groups) == 1
    assert global_bytes(model, "stitch") <= global_bytes(model, "baseline")
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
