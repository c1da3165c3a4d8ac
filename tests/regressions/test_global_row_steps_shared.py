"""A Global group whose row tiles walk several rows in sequence keeps one row of each
on-chip intermediate, as its plan counts.

Fuzz graphs 4242:59 and :228 (large 0.05): a column LogSoftmax over (3, 2048) and the
element-wise ops after it, on one tile of three rows in sequence, fell back with "a block of
1024 threads with 90112 B of shared memory cannot launch": TVM sized each shared
intermediate for the three rows its block walks, where the plan has one (33 KB). Indexed
by the row's place in the block, the rows in sequence reuse one row of shared memory
(schedule/emit.py, ``_index_rows_in_block``)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def test_rows_in_sequence_of_a_global_tile_share_one_row_of_shared_memory() -> None:
    shape = [3, 2048]
    nodes = [helper.make_node("LogSoftmax", ["x"], ["s"], axis=0),
             helper.make_node("Abs", ["s"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Abs", ["t"], ["u"]),
             helper.make_node("Mul", ["u", "u"], ["y"])]
    built = model(nodes, {"x": shape}, {"t": shape, "u": shape, "y": shape},
                  {"half": np.array(0.5, np.float32)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.phases and group.mapping.row_steps > 1, group
    assert group.launch.shared_bytes <= group.shared_bytes, (group.launch, group.shared_bytes)
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
