"""Rows too few to fill the GPU take a thread per element; a vector then gives some threads
no whole vector (fuzz graph 2612:294: 16 rows of 8 on 8 threads in vectors of 4 left six
threads idle under a condition, and TVM could not place the barrier after the staged
intermediate outside it: "Cannot insert syncs inside condition", the group fell back). A
kernel that does not build in the rules' vectors is decided again in scalar accesses.
Owner: schedule/decisions/__init__.py (``decide``)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model, needs_stitch

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


def test_few_short_rows_stitch_without_idle_vector_threads() -> None:
    nodes = [helper.make_node("Add", ["x", "c"], ["a"]),
             helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("ReduceMin", ["a", "axes"], ["m"], keepdims=1),
             helper.make_node("Max", ["e", "two"], ["y"])]
    built = model(nodes, {"x": [8, 2, 8]}, {"e": [8, 2, 8], "m": [8, 2, 1], "y": [8, 2, 8]},
                  {"c": np.linspace(-1, 1, 8).astype(np.float32),
                   "axes": np.array([2], np.int64), "two": np.array(2.0, np.float32)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks and len(plan.groups) == 1, plan
    (group,) = plan.groups
    assert group.mapping.vector == 1 and group.choices.vector == 1, group
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
