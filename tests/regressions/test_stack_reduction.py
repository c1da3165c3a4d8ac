"""Variadic Max, Min, Sum and Mean are element-wise folds in the stitch flow
(transform/stack_reduction.py).

TVM's importer makes them ``stack`` and a reduction over the stacked axis: a column reduction
over as many rows as inputs, whose partial sums of a large tensor did not fit a block (fuzz
graph L:9, Max of two (2048, 4096) tensors, fell back: "partial sums of the column reductions
need 16777216 B of shared memory per block")."""

from __future__ import annotations

import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_op_is_an_element_wise_fold(op: str) -> None:
    # three inputs, two of them broadcast, at 2 M elements
    shape = [512, 4096]
    nodes = [helper.make_node(op, ["a", "b", "c"], ["v"]),
             helper.make_node("Neg", ["v"], ["y"])]
    built = model(nodes, {"a": shape, "b": [1, 4096], "c": [512, 1]}, {"y": shape})
    scheduled = verify.compile_model(built, "stitch")
    assert "stack" not in scheduled.script()
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert not group.phases, group  # element-wise: no Global column reduction
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
