"""A reduction result whose register copy compute-at refuses keeps its loads.

Fuzz graphs 12040:190 and 12045 (one graph each): a LayerNorm over (5, 5) of x (200, 5, 5)
and a softmax of it down the 200 rows, one Global group. Emission gives every block that
reads a reduction result across threads a register copy of it (``schedule.results``), by
``compute_at`` of a cache read; TVM refused it there ("The scope ... is not a stage
pipeline"), the whole group fell back with "scheduling failed". The copy is tried on a copy
of the schedule first now, and a reader whose copy TVM refuses keeps its loads of the
result: the kernel builds, and the group is measured against TVM's fusion like any other.
Owner: schedule/results.py."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform import stitch_fuse
from tvm_stitch.tuning.tasks import extract_tasks


def test_a_global_group_whose_result_copies_tvm_refuses_still_builds(monkeypatch) -> None:
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["n"], axis=1, epsilon=1e-5),
             helper.make_node("Softmax", ["n"], ["y"], axis=0)]
    built = model(nodes, {"x": [200, 5, 5]}, {"y": [200, 5, 5]},
                  {"g": np.linspace(0.5, 1.5, 25, dtype=np.float32).reshape(5, 5)})
    (task,) = extract_tasks(import_model(built), "cuda:sm_90")
    decided = decide(task.func, task.group, task.rows, task.target)
    assert decided.group.phases and decided.lowered is not None, decided.group
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not any("scheduling failed" in f.reason for f in plan.fallbacks), plan
    # it moves more bytes than TVM's two kernels and falls back; taken all the same, it is
    # right on the SIMT runner
    monkeypatch.setattr(stitch_fuse, "_worse", lambda *_: None)
    assert StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
