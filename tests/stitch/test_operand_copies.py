"""Copies next to a matmul join the matmul's kernel (``graph.operands``): attention's head
split, key transpose and head merge, read or written through by the matmuls around them,
instead of kernels of their own (under TVM's fusion, three of them per attention)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.graph.copies import Copy, copy_kind
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model

RNG = np.random.default_rng(0)


def _legalized(op) -> tvm.tirx.PrimFunc:
    x = relax.Var("x", relax.TensorType((2, 8, 4, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for gv, f in mod.functions_items() if gv.name_hint != "main"]
    return func


@pytest.mark.parametrize(("op", "kind"), [
    (lambda x: relax.op.reshape(x, (2, 8, 64)), Copy.VIEW),
    (lambda x: relax.op.permute_dims(x, (0, 2, 1, 3)), Copy.ROWS),
    (lambda x: relax.op.permute_dims(x, (0, 1, 3, 2)), Copy.PERMUTED),
    (lambda x: relax.op.broadcast_to(x, (3, 2, 8, 4, 16)), Copy.REPEATED),
    (lambda x: relax.op.strided_slice(x, axes=[1], begin=[2], end=[6]), Copy.SLICED),
    (lambda x: relax.op.flip(x, 3), Copy.PERMUTED),
    (lambda x: relax.op.exp(x), None),
    (lambda x: relax.op.sum(x, axis=[3]), None),
])
def test_copies_are_told_apart_by_what_they_do_to_the_innermost_axis(op, kind) -> None:
    assert copy_kind(_legalized(op)) == kind


def test_copies_of_symbolic_shape_are_told_apart_too() -> None:
    """A transpose of a ``(batch * seq, 256)`` value takes ``batch`` and ``seq`` as shape
    parameters (its input's shape does not define them) and a reshape from ``(batch, seq,
    256)`` indexes through divisions by ``seq``: still a copy that moves the innermost axis,
    and a view (a dynamic training graph's weight gradients read through both)."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType((batch, seq, 256), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, (batch * seq, 256)))
            out = bb.emit_output(relax.op.permute_dims(rows, [1, 0]))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    kinds = {gv.name_hint: copy_kind(f) for gv, f in mod.functions_items()
             if gv.name_hint != "main"}
    assert kinds == {"reshape": Copy.VIEW, "transpose": Copy.PERMUTED}, kinds


def attention(batch: int, seq: int, heads: int, dim: int, dtype=np.float32) -> onnx.ModelProto:
    """Multi-head self-attention as exported from PyTorch: projections with bias, heads split
    by Reshape + Transpose, keys transposed for the scores, heads merged back."""

    def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(value.astype(dtype), name)

    hidden = heads * dim
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    consts = [_const(f"w{n}", RNG.standard_normal((hidden, hidden)) / np.sqrt(hidden))
              for n in "qkvo"]
    consts += [_const(f"b{n}", RNG.standard_normal(hidden) * 0.1) for n in "qkvo"]
    consts += [numpy_helper.from_array(np.array([batch, seq, heads, dim], np.int64), "split"),
               numpy_helper.from_array(np.array([batch, seq, hidden], np.int64), "merge"),
               _const("scale", np.array(1 / np.sqrt(dim)))]
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}m"]),
                  helper.make_node("Add", [f"{n}m", f"b{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "split"], [f"{n}r"]),
                  helper.make_node("Transpose", [f"{n}r"], [f"{n}h"], perm=perm)]
    nodes += [helper.make_node("Mul", ["qh", "scale"], ["qs"]),
              helper.make_node("MatMul", ["qs", "kh"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ct", "merge"], ["cm"]),
              helper.make_node("MatMul", ["cm", "wo"], ["om"]),
              helper.make_node("Add", ["om", "bo"], ["y"])]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", elem, [batch, seq, hidden])],
        [helper.make_tensor_value_info("y", elem, [batch, seq, hidden])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mem_kernels(model: onnx.ModelProto, flow: str) -> tuple[int, int, int]:
    report = analyze(verify.compile_model(model, flow))
    return (len(report.kernels), report.mem_kernels,
            sum(k.traffic.global_bytes for k in report.kernels))


def test_attention_reads_and_writes_its_heads_through_the_matmuls() -> None:
    # BERT-base's head width (64) and 128 tokens: dlight's tiles need no padding
    model = attention(batch=2, seq=128, heads=2, dim=64)
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    through = {c.op: c for c in plan.compute if c.absorbed}
    # the query and value projections write their heads split, the scores read the keys
    # split and transposed (and the scaled queries), the context writes the heads merged
    assert len(through) == 4, plan
    assert not any(r.first in through for r in plan.refusals), plan
    (group,) = plan.groups
    assert [op.partition(":")[2] for op in group.ops] == ["softmax"], plan
    assert any(c.writes_through for c in plan.compute) and any(
        c.reads_through for c in plan.compute)
    stitch, baseline = _mem_kernels(model, "stitch"), _mem_kernels(model, "baseline")
    assert stitch[1] == 1 < baseline[1], (stitch, baseline)  # the softmax alone
    assert stitch[0] < baseline[0] and stitch[2] < baseline[2], (stitch, baseline)
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_padded_matmul_reads_through_copies_but_writes_through_none() -> None:
    # 16-wide heads: dlight pads the tiles, and TVM 0.27 guards the padded stores by the
    # merged index of the head merge; the matmul writes its result as it is instead
    model = attention(batch=2, seq=16, heads=2, dim=16)
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    padded = [r for r in plan.refusals if "pads the matmul" in r.reason]
    assert padded, plan
    refused = {r.first for r in padded}
    assert all(not c.writes_through for c in plan.compute if c.op in refused), plan
    stitch, baseline = _mem_kernels(model, "stitch"), _mem_kernels(model, "baseline")
    assert stitch[0] <= baseline[0] and stitch[1] < baseline[1] and stitch[2] <= baseline[2]
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.slow  # tensor-core matmuls on the SIMT runner: about 3 min on 2 cores
def test_tensor_core_matmuls_read_and_write_through_copies() -> None:
    # float16 with every extent above 64: dlight tensorizes each matmul (wmma fragments),
    # reading its operands and writing its result through the absorbed copies
    model = attention(batch=1, seq=128, heads=2, dim=128, dtype=np.float16)
    scheduled = verify.compile_model(model, "stitch", "cuda:sm_90")
    plan = StitchPlan.of_module(scheduled)
    assert sum(1 for c in plan.compute if c.absorbed) == 4, plan
    tensorized = [gv.name_hint for gv, f in scheduled.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and "tvm_mma_sync" in f.script()]
    assert len(tensorized) >= 4, tensorized
    outcome = check_model(model, "stitch", "cuda:sm_90")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
