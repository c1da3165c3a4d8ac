"""A read that TVM's lowering simplifies away is not staged (``blocks.load_count``): the
staged copy would be written and never read, and TVM's storage rewrite then laid the next
shared buffer over it with no barrier between the two writes, so some threads' copies
landed after the values that replaced them. Fuzz graph 9001:85 (shrunk): ``x - Cast(x)``,
a cast to its own type (a view of ``x``), so ``x - x``, folded to 0. Owner:
schedule/blocks.py, schedule/decisions/rows.py (``decide_staging``, ``decide_inlining``)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from regression_models import model, needs_stitch

from tvm_stitch.plan import BufferRole, StitchPlan, StorageLevel
from tvm_stitch.testing.differential import check_model
from tvm_stitch.verify import compile_model

pytestmark = needs_stitch


def test_a_difference_of_a_value_and_its_view_is_not_staged() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["same"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["x", "shape"], ["view"]),
             helper.make_node("Sub", ["x", "same"], ["zero"]),
             helper.make_node("Abs", ["zero"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("Reciprocal", ["b"], ["two"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=0)]
    built = model(nodes, {"x": [8, 8, 5]}, {"view": [8, 4, 2, 5], "two": [8, 8, 5], "m": [8]},
                  {"shape": np.array([8, 4, 2, 5], np.int64), "half": np.array(0.5, np.float32),
                   "axes": np.array([1, 2], np.int64)})
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error
    (group,) = StitchPlan.of_module(compile_model(built, "stitch")).groups
    # x is read only as x - x: not staged (the block of |x - x| is, for its two readers)
    assert not [b for b in group.buffers if b.role is BufferRole.INPUT
                and b.level is StorageLevel.SHARED], group.buffers


def test_an_intermediate_read_only_as_its_own_difference_is_inlined() -> None:
    # exp(x) - exp(x): the exponential's block was staged in shared memory, "read by 1
    # block(s) at 0 place(s)" once the difference is simplified, a copy written and never read
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Sub", ["e", "e"], ["d"]),
             helper.make_node("Add", ["d", "half"], ["b"]),
             helper.make_node("Reciprocal", ["b"], ["two"]),
             helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=0)]
    built = model(nodes, {"x": [8, 40]}, {"two": [8, 40], "m": [8]},
                  {"half": np.array(0.5, np.float32), "axes": np.array([1], np.int64)})
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error
    (group,) = StitchPlan.of_module(compile_model(built, "stitch")).groups
    assert not [b for b in group.buffers if "at 0 place" in b.note], group.buffers
