"""A column-space value squared is recomputed by its square, not kept in global memory.

Fuzz graph 12044:202 (costlier than TVM's flow): ``(|-mean(x, axis 0)| + 0.5) ** 2`` over
x of (2, 128) beside the mean expanded to (4, 128). The column phase of its Global kernel
computes on the column means; a column-space block read once by one other is computed by
it, but the square reads ``|-m| + 0.5`` twice (``y * y``), so it was kept in a buffer of its
own, written to global memory and read back: 5,632 B where 4,608 do. A value read at most
twice at one index is recomputed now (``global_stitch._inline_column_space``).
Owner: schedule/decisions (global_stitch.py)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


def test_a_squared_column_value_is_recomputed_by_its_square() -> None:
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("Neg", ["m"], ["n"]),
             helper.make_node("Abs", ["n"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["h"]),
             helper.make_node("Pow", ["h", "two"], ["y"]),
             helper.make_node("Expand", ["m", "shape"], ["e"])]
    built = model(nodes, {"x": [2, 128]}, {"e": [4, 128], "y": [1, 128]},
                  {"axes": np.array([0], np.int64), "half": np.array(0.5, np.float32),
                   "two": np.array(2.0, np.float32), "shape": np.array([4, 128], np.int64)})
    scheduled = verify.compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.phases, group
    (kernel, _) = analyze(scheduled).kernels  # the expand is TVM's
    assert not any(n.startswith("T_add") for n in kernel.traffic.buffers), kernel.traffic
    assert kernel.traffic.global_bytes == 4608
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
