"""A reduction over every axis to a 0-d result. TVM's dlight Reduction rule fails on all of
them (the baseline flow crashes with "Check failed: block_realize == old_block_realize_"). The
stitch flow stitches most, but lists some as fallbacks (a leading dimension of 1: "block x_red
does not iterate over the 1 rows first"; one long row: "needs task splitting over several
blocks"), and then returned that PrimFunc as dlight's GeneralReduction scheduled it: bound
inside serial loops the host would run (a kernel launch per element), which the SIMT runner
cannot launch. Found by scripts/fuzz.py --seed 2 (graph 4) and --seed 3 (graphs 71 and 97),
shrunk. The long row (2 x 30000) is fixed: task splitting spreads it over 100 blocks (Global
stitching, tvm_stitch/schedule/task_split.py). The leading 1 is fixed too: a rule's schedule
that leaves host code does not count (the next rule, dlight's Fallback, schedules it), and a
function no rule schedules runs one thread per loop nest (tvm_stitch/schedule/rule.py).
Owner: graph/ and schedule/ (stitch flow)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model, needs_stitch

from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


def _mean_of_all(shape: list[int]) -> object:
    return model([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)],
                 {"x": shape}, {"y": []}, {"axes": np.arange(len(shape), dtype=np.int64)})


@pytest.mark.parametrize("shape", [[4, 8], [2, 300], [3, 5, 7], [2, 30000]])
def test_stitch_reduces_to_a_scalar(shape: list[int]) -> None:
    assert check_model(_mean_of_all(shape), "stitch", resources=False).kind == "ok"


@pytest.mark.parametrize("shape", [[1, 8], [1, 8, 1]])
def test_stitch_reduces_to_a_scalar_where_it_falls_back(shape: list[int]) -> None:
    outcome = check_model(_mean_of_all(shape), "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error


def test_a_reduction_to_one_value_that_keeps_its_dims_stitches() -> None:
    # fuzz graph 4242:14: a ReduceMean over every axis of (4, 2, 2, 3), keepdims=1, fell back
    # with "block T_divide is not in (row, element) form": its divide had four unit loops
    shape = [4, 2, 2, 3]
    built = model([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)],
                  {"x": shape}, {"y": [1, 1, 1, 1]}, {"axes": np.arange(4, dtype=np.int64)})
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
