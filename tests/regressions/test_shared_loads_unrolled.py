"""Loads from shared memory are in flight too (fuzz seed 12028 graph 363): rows of
20000-30000 float32, two of them, a block of 1024 threads a row holding the input x in
registers (20-30 elements a thread) for a mean, a ``where``, a maximum and a difference, and
``x == 0.5`` staged in shared memory for its transpose and the ``where``. nvcc unrolled the
transpose's loop whole and issued every load of it from shared memory first: 72 B spilled on
sm_80 at rows of 20000, 264 B at 28000, 92 B at 30000, at the 64 registers of the launch
bound. The plan now bounds the unrolling of loops that load from shared memory beside a held
row as of those that stream from global memory, in the room the held elements leave
(``decisions.unrolling.bound_unrolling``); and where a reader of the held row (the
``where``, unrolled whole) loads from shared memory at each element, the held elements and
those loads together fit ``decisions.budget.HELD_AND_LOADS_REGISTERS`` or x is re-read from
global memory instead (rows of 26000 spilled 16 B holding 26). With its six outputs a row of
more than 28 elements a thread is not held at all (``decisions.budget._row_registers``).
Owner: schedule/decisions (unrolling.py, budget.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import verify
from tvm_stitch.plan import DemotionKind, StitchPlan, StorageLevel
from tvm_stitch.testing.differential import check_model


def _transpose_beside_held_row(width: int) -> onnx.ModelProto:
    """Fuzz graph 12028:363 over rows of ``width``."""
    shape = [2, width]
    scalars = {"c0": 0.25, "c2": 0.5, "c3": 1.5, "c4": 1.5}
    nodes = [helper.make_node("Sub", ["x", "c0"], ["v0"]),
             helper.make_node("ReduceMean", ["v0", "c1"], ["v1"], keepdims=0),
             helper.make_node("Equal", ["x", "c2"], ["v2"]),
             helper.make_node("Where", ["v2", "v0", "c3"], ["v3"]),
             helper.make_node("Min", ["v3", "c4"], ["v4"]),
             helper.make_node("Transpose", ["v2"], ["v6"], perm=[1, 0]),
             helper.make_node("Max", ["x", "s"], ["v7"])]
    constants = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in scalars.items()]
    constants.append(numpy_helper.from_array(np.array([1], np.int64), "c1"))
    floats = {"v0": shape, "v1": [2], "v4": shape, "v7": shape}
    graph = helper.make_graph(
        nodes, "held_row_transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [*(helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in floats.items()),
         helper.make_tensor_value_info("v6", TensorProto.BOOL, shape[::-1])],
        initializer=constants)
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    built.ir_version = 8
    onnx.checker.check_model(built)
    return built


@pytest.mark.parametrize("width", [20000, 24000])
def test_a_transpose_from_shared_memory_beside_a_held_row_does_not_spill(width: int) -> None:
    built = _transpose_beside_held_row(width)
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    x = next(b for b in group.buffers if b.name == "x")
    assert (x.level, group.mapping.threads_per_row) == (StorageLevel.REGISTER, 1024)
    transpose = [u for u in group.unrolled if "transpose" in u.block]
    assert transpose and all(u.steps < -(-width // 1024) for u in transpose), group.unrolled
    _matches_without_spills(built)


@pytest.mark.parametrize("width", [26000, 28000])
def test_a_held_row_read_beside_shared_loads_is_re_read_instead(width: int) -> None:
    built = _transpose_beside_held_row(width)
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    x = next(b for b in group.buffers if b.name == "x")
    assert x.level is StorageLevel.GLOBAL
    steps = -(-width // 1024)
    (reread,) = [d for d in group.demotions if d.kind is DemotionKind.HELD_REREAD]
    assert (reread.subject, reread.before, reread.after) == ("x", steps, 2 * steps)
    _matches_without_spills(built)


def test_a_row_beside_six_outputs_past_the_cap_is_re_read_without_being_held() -> None:
    built = _transpose_beside_held_row(30000)
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    x = next(b for b in group.buffers if b.name == "x")
    assert x.level is StorageLevel.GLOBAL
    assert [d.subject for d in group.demotions if d.kind is DemotionKind.REREAD] == ["x"]
    assert not any(d.kind is DemotionKind.HELD_REREAD for d in group.demotions)
    _matches_without_spills(built)


def _matches_without_spills(built: onnx.ModelProto) -> None:
    outcome = check_model(built, "stitch", triage=False)  # onnxruntime on the SIMT runner
    assert outcome.kind == "ok", outcome.error
    assert outcome.violations == []  # ptxas on sm_80 and sm_90: no spills, no stack frame
