"""Ops that return their input unchanged are views in the stitch flow, as TVM's flow makes
them in the end (transform/identity_views.py).

Fuzz graph 4242:66: a Max with a constant read through a same-type Cast (by a MatMul) and an
identity Transpose (a graph output) fell back with "the stitched kernel moves 576 B of global
memory, TVM's fusion of the same ops 384 B": the group wrote both copies out, where TVM's
RewriteDataflowReshape makes each copy kernel a view."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from regression_models import global_bytes, model
from tvm import relax
from tvm.script import relax as R

from tvm_stitch import verify
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
