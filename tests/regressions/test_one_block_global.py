"""A Global group whose grid is one block buys no parallelism with its partial sums, so the
yardstick counts them: a mean over the first axis of (2, 4, 31) ran as one block with its 124
partial sums written to and read from global memory, because a Global group's partials were
never counted against TVM's fusion (with the LayerNorm behind it, 6448 B against TVM's flow's
4464; now TVM's kernel for the mean, 3472 B). Fuzz graph 9419:116.
Owner: transform/stitch_fuse.py (the yardstick check)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import global_bytes, model, needs_stitch

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


def _first_axis_mean_then_layer_norm() -> object:
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=0),
             helper.make_node("LayerNormalization", ["m", "gamma"], ["y"], axis=-2)]
    return model(nodes, {"x": [2, 4, 31]}, {"y": [4, 31]},
                 {"axes": np.array([0], np.int64),
                  "gamma": np.linspace(0.5, 1.5, 124, dtype=np.float32).reshape(4, 31)})


def test_a_one_block_global_group_moves_no_more_than_tvm() -> None:
    built = _first_axis_mean_then_layer_norm()
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not [g for g in plan.groups if g.phases and g.launch.grid == 1], str(plan)
    assert global_bytes(built, "stitch") <= global_bytes(built, "baseline")
    outcome = check_model(built, "stitch", resources=False)
    assert outcome.kind == "ok", outcome.error
