"""A column phase sums each column in its thread's register even when the columns do not
fill its last task: the threads past the last column store nothing.

Fuzz graph 12035:4: a softmax down the 2 rows of (2, 32, 255), whose input an element-wise
op and a column maximum also read, and whose rows a mean also reduces (so it stays Global,
not strided rows), on tasks of 1024
threads over 8160 columns. The sums were added in place in global memory, because the
store out of a register that ``reverse_compute_at`` placed kept the partial task's guard for
one result of the softmax's pair and not for the other (it wrote past the end: a double
free in the SIMT run): 3 writes and 4 reads of each sum, 1,666,936 B where TVM's five
kernels move 881,536 B. Owners: schedule/phases.py (``register_sum``),
transform/guarded_updates.py (``stores_within_columns``), schedule/emit.py."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import BufferRole, StitchPlan, StorageLevel
from tvm_stitch.testing.differential import check_model


def test_column_sums_of_a_partial_task_are_registers() -> None:
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=0),
             helper.make_node("Sub", ["x", "c"], ["d"]),
             helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=0),
             helper.make_node("Abs", ["s"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("Reciprocal", ["b"], ["r"]),
             helper.make_node("ReduceMean", ["s", "last"], ["p"], keepdims=1)]
    built = model(nodes, {"x": [2, 32, 255]}, {"d": [2, 32, 255], "m": [32, 255],
                                               "r": [2, 32, 255], "p": [2, 32, 1]},
                  {"c": np.linspace(-1, 1, 255, dtype=np.float32),
                   "axes": np.array([0], np.int64), "half": np.array(0.5, np.float32),
                   "last": np.array([-1], np.int64)})
    scheduled = verify.compile_model(built, "stitch")
    group, _ = StitchPlan.of_module(scheduled).groups
    assert group.phases and group.mapping.threads_per_block == 1024, group
    sums = [b for b in group.buffers if b.role is BufferRole.SUM]
    assert sums and all(b.level is StorageLevel.REGISTER for b in sums), group
    kernel = analyze(scheduled).kernels[0]
    for name in ("T_softmax_expsum", "T_softmax_maxelem"):
        traffic = kernel.traffic.buffers[name]
        assert traffic.write_bytes == traffic.size_bytes, traffic  # stored once
    outcome = check_model(built, "stitch", cost=True)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
