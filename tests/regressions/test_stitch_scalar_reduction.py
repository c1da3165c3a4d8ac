"""A reduction over every axis to a 0-d result. TVM's dlight Reduction rule fails on all of
them (the baseline flow crashes with "Check failed: block_realize == old_block_realize_"). The
stitch flow stitches most, but lists some as fallbacks (a leading dimension of 1: "block x_red
does not iterate over the 1 rows first"; one long row: "needs task splitting over several
blocks"), and then silently returns that PrimFunc unscheduled when dlight fails on it: no thread
bindings, so neither CUDA nor the SIMT runner can launch it, and no error says why. Found by
scripts/fuzz.py --seed 2 (graph 4) and --seed 3 (graphs 71 and 97), shrunk.
The long row (2 x 30000) is fixed: task splitting spreads it over 100 blocks (Global
stitching, tvm_stitch/schedule/task_split.py).
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


@pytest.mark.xfail(strict=True,
                   reason="stitch flow: a fallback whose dlight schedule fails is returned "
                          "unscheduled, without an error (full reduction to a scalar with a "
                          "leading 1)")
@pytest.mark.parametrize("shape", [[1, 8], [1, 8, 1]])
def test_stitch_reduces_to_a_scalar_where_it_falls_back(shape: list[int]) -> None:
    outcome = check_model(_mean_of_all(shape), "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error
