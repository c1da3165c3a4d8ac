"""Telling compute-intensive PrimFuncs (matmul, convolution) from memory-intensive ones.

A PrimFunc is a contraction when one of its reduction blocks accumulates the product of two
loaded tensors, ``acc[...] = acc[...] + a[...] * b[...]``, and one of them is reused: its
indices leave out a spatial iterator of the block (of extent > 1), so each of its elements
meets several elements of the other (``A[i, k]`` in ``C[i, j] += A[i, k] * B[k, j]``). TVM's
``matmul``, ``NT_matmul``, batched matmul, ``conv*d`` and dense all legalize to that shape,
before and after dlight schedules them (through cache stages and rfactor). Not contractions:
squaring one value (``x[i] * x[i]`` in a sum of squares), products of computed values (a
variance's ``(x - m) * (x - m)``), and products of two tensors at the same element
(``dgamma[j] += dy[i, j] * xhat[i, j]`` in a stitched LayerNorm backward), whose every loaded
element is used once. A matmul tensorized for tensor cores (dlight's float16 Matmul) keeps
no such update: a block that calls a matrix multiply-accumulate intrinsic (``tvm_mma_sync``,
PTX ``mma``/``wgmma``/``tcgen05`` MMAs) is a contraction too. Only blocks are inspected, so a
hand-written PrimFunc without blocks counts as memory-intensive.
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..plan import GROUP_ATTR
from .guards import IF_THEN_ELSE


def _loaded(expr: tvm.ir.PrimExpr) -> tvm.ir.TensorLoad | None:
    """The load ``expr`` is, looking through casts and padding (``if_then_else(c, load, 0)``)."""
    while True:
        if isinstance(expr, tirx.Cast):
            expr = expr.value
        elif (isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op)
              and expr.op.name == IF_THEN_ELSE):
            expr = expr.args[1]
        else:
            return expr if isinstance(expr, tvm.ir.TensorLoad) else None


def _reused(load: tvm.ir.TensorLoad, spatial: list[tirx.Var]) -> bool:
    """Whether ``load`` leaves out one of the block's ``spatial`` iterators."""
    used: list[tirx.Var] = []
    for index in load.indices:
        tvm_ffi.structural_walk(index, [(tirx.Var, used.append)])
    return any(not any(v.same_as(u) for u in used) for v in spatial)


def _is_accumulated_product(store: tirx.BufferStore, spatial: list[tirx.Var]) -> bool:
    value = store.value
    if not isinstance(value, tirx.Add):
        return False
    for acc, term in ((value.a, value.b), (value.b, value.a)):
        acc_load = _loaded(acc)
        if acc_load is None or not acc_load.source.same_as(store.buffer):
            continue
        if not isinstance(term, tirx.Mul):
            continue
        lhs, rhs = _loaded(term.a), _loaded(term.b)
        if lhs is None or rhs is None:
            continue
        if any(x.source.same_as(store.buffer) for x in (lhs, rhs)):
            continue
        if lhs.source.same_as(rhs.source) and tvm_ffi.structural_equal(lhs.indices, rhs.indices):
            continue  # x * x: a square, not a contraction
        if _reused(lhs, spatial) or _reused(rhs, spatial):
            return True
    return False


_MMA = re.compile(r"tirx\.(tvm_b?mma_sync"
                  r"|ptx(_legacy)?\.(mma|wgmma_(?!fence|commit|wait)|tcgen05_mma))")
"""Matrix multiply-accumulate intrinsics: the update of a tensorized matmul."""


def _calls_mma(block: s_tir.SBlock) -> bool:
    found = []

    def on_call(call: tvm.ir.Call) -> None:
        if isinstance(call.op, tvm.ir.Op) and _MMA.match(call.op.name):
            found.append(call.op.name)

    tvm_ffi.structural_walk(block.body, [(tvm.ir.Call, on_call)])
    return bool(found)


def is_contraction_block(block: s_tir.SBlock) -> bool:
    """True for a reduction block whose update multiplies two loaded tensors, one of them
    reused across a spatial iterator of the block, or calls a tensor-core MMA."""
    if _calls_mma(block):
        return True
    if not any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in block.iter_vars):
        return False
    spatial = [iv.var for iv in block.iter_vars
               if int(iv.iter_type) == tirx.IterVar.DataPar and not _unit(iv)]
    return isinstance(block.body, tirx.BufferStore) \
        and _is_accumulated_product(block.body, spatial)


def _unit(iv: tirx.IterVar) -> bool:
    extent = iv.dom.extent
    return isinstance(extent, tirx.IntImm) and int(extent) == 1


def has_contraction(func: tirx.PrimFunc) -> bool:
    """True when ``func`` contains a matmul- or convolution-like reduction block. A stitched
    kernel (``plan.GROUP_ATTR``) never does: the stitch flow groups memory-intensive ops only,
    and its register copies are indexed by a thread's slot rather than by the tensor's
    indices (a held row of ``dy`` read as ``dy_local[column // threads]`` looks reused
    across the row tiles of a ``dgamma`` sum)."""
    if func.attrs is not None and GROUP_ATTR in func.attrs:
        return False
    found = False

    def visit(block: s_tir.SBlock) -> None:
        nonlocal found
        found = found or is_contraction_block(block)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)])
    return found
