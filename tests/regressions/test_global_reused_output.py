"""A Global group whose output is also read inside the kernel, by a block the plan inlines.

Fuzz graph 4242:55: Where -> Neg -> LogSoftmax over axis 0 of (7, 4097) (a column reduction),
the Where also an output (read by a MatMul). The plan gave the Where's output an on-chip copy
and inlined the Where, but emission chose the outputs to copy from the blocks of the row
phases, where the inlined Where no longer is: "The block ... is an output block", and the
group fell back. Emission now copies the outputs the plan lists. (A column LogSoftmax of
so few rows is strided rows of a transposed view now, ``mixed_reductions``: a column maximum
subtracted stands in for it.)"""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import BufferRole, StitchPlan
from tvm_stitch.testing.differential import check_model


def _model():
    shape = [7, 4097]
    nodes = [helper.make_node("Equal", ["a", "half"], ["eq"]),
             helper.make_node("Where", ["eq", "a", "b"], ["sel"]),
             helper.make_node("Neg", ["sel"], ["neg"]),
             helper.make_node("ReduceMax", ["neg", "a0"], ["mx"], keepdims=1),
             helper.make_node("Sub", ["neg", "mx"], ["y"]),
             helper.make_node("MatMul", ["sel", "w"], ["m"]),
             helper.make_node("Abs", ["neg"], ["z"]),
             helper.make_node("Add", ["z", "half"], ["za"]),
             helper.make_node("Reciprocal", ["za"], ["r"])]
    return model(nodes, {"a": shape, "b": shape},
                 {"y": shape, "m": [7, 1], "z": shape, "za": shape, "r": shape},
                 {"half": np.array(0.5, np.float32), "w": np.ones((4097, 1), np.float32),
                  "a0": np.array([0], np.int64)})


def test_a_global_group_copies_the_outputs_its_plan_lists() -> None:
    model = _model()
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert not plan.fallbacks, plan.fallbacks
    (group,) = plan.groups
    assert group.phases and any(b.role is BufferRole.OUTPUT for b in group.buffers), group
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
