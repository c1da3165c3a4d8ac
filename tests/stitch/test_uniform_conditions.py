"""A concatenation's condition that is the same for every lane of a vector is stated once per
vector (``transform.uniform_conditions``): LLaMA's rotary embedding (rotate_half: Slice, Neg,
Concat) read a thread's four floats with four scalar loads per source, and in float16 its
eight lanes stayed scalar; now every global access moves 16 bytes. Counted with nvcc's PTX;
numbers on the SIMT runner against onnxruntime."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from stitch_helpers import (
    compile_cuda,
    global_accesses,
    module_cuda_source,
    spills,
    stack_frames,
)
from tvm import tirx

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform.uniform_conditions import lane_uniform


def _rope(shape: list[int], dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """``x * cos + rotate_half(x) * sin`` over the last axis of ``shape`` (B, heads, S, D),
    rotate_half as LLaMA's exporters write it: ``Concat(-x[..., D/2:], x[..., :D/2])``."""
    *_, seq, dim = shape
    kind = np.float32 if dtype == TensorProto.FLOAT else np.float16
    angles = np.outer(np.arange(seq), np.linspace(0, 1, dim))
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array(np.cos(angles)[None, None].astype(kind), "cos"),
             numpy_helper.from_array(np.sin(angles)[None, None].astype(kind), "sin"),
             ints("zero", [0]), ints("half", [dim // 2]), ints("end", [dim]), ints("last", [3])]
    nodes = [helper.make_node("Slice", ["x", "zero", "half", "last"], ["x1"]),
             helper.make_node("Slice", ["x", "half", "end", "last"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["neg"]),
             helper.make_node("Concat", ["neg", "x1"], ["rot"], axis=3),
             helper.make_node("Mul", ["x", "cos"], ["a"]),
             helper.make_node("Mul", ["rot", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", dtype, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@functools.cache
def _lowered(shape: tuple[int, ...], dtype: int):
    model = _rope(list(shape), dtype)
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    return model, scheduled, group


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_rotary_embedding_moves_whole_vectors(dtype, arch) -> None:
    """LLaMA-7B's heads at a real length: (1, 32, 512, 128); no spills, no stack."""
    _, scheduled, group = _lowered((1, 32, 512, 128), dtype)
    assert group.mapping.vector == (4 if dtype == TensorProto.FLOAT else 8), group.mapping
    assert not group.scalar_blocks, group.scalar_blocks
    source = module_cuda_source(scheduled, arch)
    accesses = global_accesses(source, arch)
    assert accesses and all(".v4." in a for a in accesses), accesses
    report = compile_cuda(source, arch)
    assert all(s == (0, 0) for s in spills(report)) and not any(stack_frames(report)), report


def _attention_inputs(batch: int, seq: int, width: int) -> onnx.ModelProto:
    """DIEN's attention inputs: ``Concat(q, k, q - k, q * k)`` of a query broadcast over
    the sequence of behaviours, pieces of ``width`` (36: no power of two)."""
    query = helper.make_tensor_value_info("q", TensorProto.FLOAT, [batch, 1, width])
    keys = helper.make_tensor_value_info("k", TensorProto.FLOAT, [batch, seq, width])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, 4 * width])
    shape = numpy_helper.from_array(np.array([batch, seq, width], np.int64), "shape")
    nodes = [helper.make_node("Expand", ["q", "shape"], ["qe"]),
             helper.make_node("Sub", ["qe", "k"], ["d"]),
             helper.make_node("Mul", ["qe", "k"], ["p"]),
             helper.make_node("Concat", ["qe", "k", "d", "p"], ["y"], axis=2)]
    graph = helper.make_graph(nodes, "attention_inputs", [query, keys], [out], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.nvcc
def test_concatenated_attention_inputs_move_whole_vectors() -> None:
    """At DIEN's real size (512 x 100 behaviours of 36)."""
    model = _attention_inputs(512, 100, 36)
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.vector == 4 and not group.scalar_blocks, group
    accesses = global_accesses(module_cuda_source(scheduled, "sm_90"), "sm_90")
    assert accesses and all(".v4." in a for a in accesses), accesses
    small = _attention_inputs(64, 16, 36)  # enough blocks for vectors of 4
    scheduled = pipeline.lower(import_model(small), "cuda:sm_90", "stitch")
    assert StitchPlan.of_module(scheduled).groups[0].mapping.vector == 4
    # onnxruntime's numbers on the SIMT runner, and ptxas' limits for sm_80 and sm_90
    outcome = check_model(small, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.parametrize(("shape", "dtype"), [((2, 4, 64, 64), TensorProto.FLOAT),
                                              ((2, 4, 64, 64), TensorProto.FLOAT16),
                                              ((2, 3, 16, 66), TensorProto.FLOAT)])
def test_rotary_embedding_matches_onnxruntime(shape, dtype) -> None:
    """Halves of 32 (aligned) and of 33 (rows of 66 in vectors of 2: the condition changes
    inside a vector and stays per lane)."""
    model, scheduled, _ = _lowered(shape, dtype)
    assert verify.run_simt(scheduled, model).ok




J = tvm.ir.Var("j", "int32")
K = tvm.ir.Var("k", "int32")


@pytest.mark.parametrize(("cond", "vector", "uniform"), [
    (32 <= J, 4, True), (32 <= J, 8, True), (32 <= J, 64, False), (33 <= J, 4, False),
    (J < 32, 4, True), (J <= 32, 4, False), (J <= 31, 4, True), (J > 31, 8, True),
    (J * 2 < 32, 4, False), (J < K, 4, False), (J - K * 4 < 8, 4, True),
    (tirx.And(16 <= J, J < 48), 8, True), (tirx.Or(J < 16, 49 <= J), 8, False),
    (tirx.Not(J < 16), 4, True), (K < 3, 4, True),
    (32 <= J - tirx.floormod(J, 4), 4, True), (32 <= tirx.floordiv(J, 4) * 4, 4, True),
    (tirx.Cast("float32", J) < tirx.FloatImm("float32", 32.0), 4, False)])
def test_lane_uniform(cond, vector, uniform) -> None:
    assert lane_uniform(cond, J, vector) is uniform
