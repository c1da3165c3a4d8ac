"""A row held in registers beside many outputs (fuzz seed 12043 graph 288).

A float32 softmax over 2 rows of 30000 beside ``n = -x`` and two outputs ``|n|``: x was held
in registers, 30 elements a thread of 1024, within the 32 registers a held row may take
(``decisions.budget.REGISTER_ROW_ELEMENTS``), and ptxas spilled 8 B on sm_90: each of the
four outputs is written in a loop over the held elements with its own addresses. Beside
four outputs or more a held row now takes at most 28 registers
(``decisions.budget.MANY_OUTPUTS_ROW_REGISTERS``); x is read again from global memory,
still fewer bytes than TVM's four kernels move.
Owner: schedule/decisions (budget.py)."""

from __future__ import annotations

import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan, StorageLevel
from tvm_stitch.testing.differential import check_model


def _softmax_beside(width: int, magnitudes: int):
    """softmax(x) over rows of (2, width), ``-x`` and ``magnitudes`` outputs ``|-x|``."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1),
             helper.make_node("Neg", ["x"], ["n"])]
    nodes += [helper.make_node("Abs", ["n"], [f"a{i}"]) for i in range(magnitudes)]
    outputs = {name: [2, width] for name in ["y", "n", *(f"a{i}" for i in range(magnitudes))]}
    return model(nodes, {"x": [2, width]}, outputs, {})


@pytest.mark.nvcc
@pytest.mark.parametrize("magnitudes,level", [(1, StorageLevel.REGISTER),
                                              (2, StorageLevel.GLOBAL)])
def test_a_row_beside_four_outputs_is_held_in_fewer_registers(
        magnitudes: int, level: StorageLevel) -> None:
    built = _softmax_beside(30000, magnitudes)
    outcome = check_model(built, "stitch", cost=True)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    assert not outcome.costlier, outcome.costlier
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    assert next(b.level for b in group.buffers if b.name == "x") is level, group
