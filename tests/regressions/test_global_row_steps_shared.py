"""A Global group whose row tiles walk several rows in sequence keeps one row of each
on-chip intermediate, as its plan counts.

Fuzz graphs 4242:59 and :228 (large 0.05): a column LogSoftmax over (3, 2048) and the
element-wise ops after it, on one tile of three rows in sequence, fell back with "a block of
1024 threads with 90112 B of shared memory cannot launch": TVM sized each shared
intermediate for the three rows its block walks, where the plan has one (33 KB). Indexed
by the row's place in the block, the rows in sequence reuse one row of shared memory
(schedule/emit.py, ``_index_rows_in_block``). A column softmax of so few rows is strided
rows of a transposed view now (``mixed_reductions``): a column maximum subtracted stands in
for it."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def test_rows_in_sequence_of_a_global_tile_share_one_row_of_shared_memory() -> None:
    shape = [3, 2048]
    nodes = [helper.make_node("ReduceMax", ["x", "a0"], ["m"], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["s"]),
             helper.make_node("Abs", ["s"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Abs", ["t"], ["u"]),
             helper.make_node("Mul", ["u", "u"], ["y"])]
    built = model(nodes, {"x": shape}, {"t": shape, "u": shape, "y": shape},
                  {"half": np.array(0.5, np.float32), "a0": np.array([0], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.phases and group.mapping.row_steps > 1, group
    assert group.launch.shared_bytes <= group.shared_bytes, (group.launch, group.shared_bytes)
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_column_results_of_a_tile_walking_rows_in_sequence_are_not_indexed_by_row() -> None:
    # fuzz graphs 4242:1017 and :1063: indexing every on-chip buffer whose first extent was
    # the row count by the row's place in the block also hit the staged column maximum of a
    # softmax over axis 0 of (4, 2, 8) (max error inf) and the copies of a (32, 4, 128)
    # float16 column max; only the plan's per-row buffers are indexed so
    for shape in ([4, 2, 8], [4, 4, 8], [5, 3, 7]):
        built = model([helper.make_node("Softmax", ["x"], ["y"], axis=-3)], {"x": shape},
                      {"y": shape})
        outcome = check_model(built, "stitch")
        assert outcome.kind == "ok" and not outcome.violations, (shape, outcome.error)
    nodes = [helper.make_node("ReduceMax", ["x", "a0"], ["m"], keepdims=1),
             helper.make_node("ReduceMean", ["m", "a01"], ["y"], keepdims=0),
             helper.make_node("Neg", ["x"], ["n1"]),
             helper.make_node("Neg", ["x"], ["n2"])]
    built = model(nodes, {"x": [32, 4, 128]}, {"y": [128], "n1": [32, 4, 128],
                                                "n2": [32, 4, 128]},
                  {"a0": np.array([-3], np.int64), "a01": np.array([0, 1], np.int64)},
                  elem_type=TensorProto.FLOAT16)
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
