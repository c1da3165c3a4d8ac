"""A group of 0-d values runs on one thread (fuzz graph 4242:60): on a block of 32 threads
every thread computed the scalar producers again, unguarded, and loaded their inputs, so the
kernel counted 144 B against TVM's 32 B and fell back."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model as onnx_model

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def test_scalar_ops_stitch_on_one_thread() -> None:
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("Pow", ["b", "p"], ["y"]),
             helper.make_node("Abs", ["y"], ["z"])]
    model = onnx_model(nodes, {"x": []}, {"a": [], "y": [], "z": []},
                       {"half": np.array(0.5, np.float32), "p": np.array(-1.0, np.float32)})
    scheduled = verify.compile_model(model, "stitch")
    plan = StitchPlan.of_module(scheduled)
    (group,) = plan.groups
    assert not plan.fallbacks and group.mapping.threads_per_block == 1, plan
    stitched = sum(k.traffic.global_bytes for k in analyze(scheduled).kernels)
    assert stitched == 16  # the input read once, three outputs written once
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_mean_of_a_broadcast_scalar_stitches() -> None:
    # fuzz graph 2612:576: the mean of a scalar expanded to (3,), over a divisor of another
    # scalar. The group's only row is of scalar blocks, so no block moves vector lanes and
    # the widest element was the max of nothing: stitching gave up for the whole model
    # (and TVM's own flow crashes on it). The mean over the expanded axis is now a reshape
    # of the maximum (``transform.UnitReduction``), in the group beside it
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Expand", ["m", "three"], ["e"]),
             helper.make_node("ReduceMean", ["e", "zero"], ["r"], keepdims=0),
             helper.make_node("Abs", ["d"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("Div", ["r", "b"], ["y"])]
    model = onnx_model(nodes, {"x": [257, 7], "d": []}, {"m": [], "y": []},
                       {"three": np.array([3], np.int64), "zero": np.array([0], np.int64),
                        "half": np.array(0.5, np.float32)})
    scheduled = verify.compile_model(model, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not any("gave up" in n for n in plan.notes), plan.notes
    (group,) = plan.groups
    assert not plan.fallbacks and "repeated_once:reshape" in group.ops, plan
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_one_element_matrix_vector_product_falls_back_with_its_reason() -> None:
    # fuzz graph 2612:371: a softmax of one value times a (1, 1) matrix. Its group of one
    # block made a statement sequence of one nest, which TVM refuses ("A SeqStmt of length
    # 1 is prohibited"), and the plan said only "scheduling failed"
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("Softmax", ["m"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["y"])]
    model = onnx_model(nodes, {"x": [1024]}, {"y": [1]},
                       {"axes": np.array([0], np.int64), "w": np.full((1, 1), 2, np.float32)})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    reasons = [f.reason for f in plan.fallbacks]
    assert reasons and not any("scheduling failed" in r for r in reasons), reasons
    assert check_model(model, "stitch").kind == "ok"
