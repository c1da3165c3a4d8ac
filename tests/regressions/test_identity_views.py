"""Ops that return their input unchanged are views in the stitch flow, as TVM's flow makes
them in the end (transform/identity_views.py).

Fuzz graph 4242:66: a Max with a constant read through a same-type Cast (by a MatMul) and an
identity Transpose (a graph output) fell back with "the stitched kernel moves 576 B of global
memory, TVM's fusion of the same ops 384 B": the group wrote both copies out, where TVM's
RewriteDataflowReshape makes each copy kernel a view.

Fuzz graph 9419:19: such an op became a reshape to the same shape, which TVM legalizes to an
injective kernel, and FuseOps fuses no injective op into a matmul's epilogue: an identity
Transpose between a MatMul and a Mul left the Mul out of the matmul's kernel (3 kernels and
13764 B against TVM's 2 and 8164 B). The op is now removed, its uses reading its input.

Fuzz graph 12031:139: two transposes that cancel, of a MatMul's result, were stitched into
a copy kernel (6 kernels against TVM's 5): FuseOps fuses the two alone, and once dlight
inlines the first, RewriteDataflowReshape makes their kernel a view. Such copies now fall
back as nothing to stitch (``graph.tvm_fusion``), and the yardstick counts them as views."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from regression_models import global_bytes, model
from tvm import relax
from tvm.script import relax as R

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.graph.grouping import FUSED_VIEW
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform.identity_views import is_identity


def test_a_same_type_cast_and_an_identity_transpose_of_a_stitched_value_are_views() -> None:
    nodes = [helper.make_node("Max", ["x", "c"], ["m"]),
             helper.make_node("Transpose", ["m"], ["t"], perm=[0, 1]),
             helper.make_node("Cast", ["m"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Expand", ["f", "shape"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["y"])]
    built = model(nodes, {"x": [16, 3]}, {"t": [16, 3], "y": [16, 4]},
                  {"c": np.array(2.0, np.float32), "shape": np.array([16, 3], np.int64),
                   "w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not any("moves" in f.reason for f in plan.fallbacks), plan
    assert global_bytes(built, "stitch") <= global_bytes(built, "baseline")
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_an_identity_transpose_keeps_a_matmul_epilogue_in_the_matmul() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Transpose", ["p"], ["t"], perm=[0, 1]),
             helper.make_node("Mul", ["t", "c"], ["y"])]
    built = model(nodes, {"x": [7, 5]}, {"y": [7, 100]},
                  {"w": np.linspace(-1, 1, 500, dtype=np.float32).reshape(5, 100),
                   "c": np.linspace(0.5, 1.5, 100, dtype=np.float32)})
    assert _kernels_and_bytes(built, "stitch") == _kernels_and_bytes(built, "baseline")
    outcome = check_model(built, "stitch", resources=False)
    assert outcome.kind == "ok", outcome.error


@pytest.mark.parametrize("outputs", [["t"], ["t", "e"]])
def test_an_identity_op_of_a_graph_input_as_an_output(outputs: list[str]) -> None:
    """The output is the input itself, and read by another op."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1]),
             helper.make_node("Exp", ["t"], ["e"])]
    built = model(nodes, {"x": [16, 3]}, {name: [16, 3] for name in outputs})
    outcome = check_model(built, "stitch", resources=False)
    assert outcome.kind == "ok", outcome.error


@pytest.mark.parametrize("source", ["matmul", "input"])
def test_transposes_that_cancel_are_a_view_as_in_tvm(source: str) -> None:
    perms = [[1, 0], [1, 0]] if source == "matmul" else [[2, 0, 1], [1, 2, 0]]
    shape = [3, 4] if source == "matmul" else [2, 3, 4]
    first = [helper.make_node("MatMul", ["x", "w"], ["p"])] if source == "matmul" else \
        [helper.make_node("Identity", ["x"], ["p"])]
    nodes = [*first, helper.make_node("Transpose", ["p"], ["t"], perm=perms[0]),
             helper.make_node("Transpose", ["t"], ["y"], perm=perms[1]),
             helper.make_node("Neg", ["x"], ["n"])]
    built = model(nodes, {"x": [3, 2] if source == "matmul" else shape},
                  {"y": shape, "n": [3, 2] if source == "matmul" else shape},
                  {"w": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}
                  if source == "matmul" else {})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert {f.reason for f in plan.fallbacks if "transpose" in " ".join(f.ops)} \
        == {FUSED_VIEW}, plan
    assert _kernels_and_bytes(built, "stitch") == _kernels_and_bytes(built, "baseline")
    outcome = check_model(built, "stitch", resources=False)
    assert outcome.kind == "ok", outcome.error


def _kernels_and_bytes(built, flow: str) -> tuple[int, int]:
    report = analyze(verify.compile_model(built, flow))
    return len(report.kernels), report.global_bytes


@pytest.mark.parametrize("op,identity", [
    (lambda x: R.astype(x, "float32"), True),
    (lambda x: R.astype(x, "float16"), False),
    (lambda x: R.permute_dims(x, [0, 1, 2]), True),
    (lambda x: R.permute_dims(x, [-3, -2, -1]), True),
    (lambda x: R.permute_dims(x, [0, 2, 1]), False),
    (lambda x: R.permute_dims(x), False),
    (lambda x: R.broadcast_to(x, R.shape([2, 3, 4])), True),
    (lambda x: R.broadcast_to(x, R.shape([5, 2, 3, 4])), False),
])
def test_identity_ops_are_recognised(op, identity: bool) -> None:
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((2, 3, 4), "float32"))
    with bb.function("main", [x]):
        call = bb.normalize(op(x))
        bb.emit_func_output(call)
    assert is_identity(call) is identity
