"""Copies: ops whose every output element is one input element, moved (reshape, transpose,
expand_dims, broadcast_to, strided_slice).

A copy next to a matmul need not be a kernel of its own: the matmul can read its operand
through the copy's index map, or write its result through it (``graph.operands``). Whether
that keeps the matmul's accesses contiguous depends on what the copy does to the innermost
axis, so copies are told apart by that.
"""

from __future__ import annotations

from enum import StrEnum
from math import prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..symbolic import dim_value, shape_values
from ..transform.symbolic_division import SymbolicDivision


class Copy(StrEnum):
    """What a copy does to the order of elements."""

    VIEW = "view"  # the same elements in the same order: a reshape, which launches nothing
    ROWS = "rows"  # a bijection that moves whole runs of the innermost axis
    PERMUTED = "permuted"  # a bijection that breaks the innermost axis (a transpose of it)
    REPEATED = "repeated"  # some input elements are copied more than once (a broadcast)
    SLICED = "sliced"  # some input elements are not copied (a slice)


def copy_kind(func: tirx.PrimFunc) -> Copy | None:
    """What ``func`` does if it is a copy: one block that stores, at its own position of its
    one output, one element of its one input; None for anything else. Symbolic extents
    (a batch, a sequence length) are compared through their stand-ins and proved on with
    the real expressions."""
    params = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    # Other parameters may only be shape values (a transpose of a (batch * seq, d) input
    # takes batch and seq, which its input's shape does not define).
    if len(params) != 2 or any(not str(p.ty.dtype).startswith("int")
                               for p in func.params if p not in params):
        return None
    src, dst = params
    src_shape, dst_shape = list(src.shape), list(dst.shape)
    src_dims, dst_dims = shape_values(src_shape), shape_values(dst_shape)
    if src_dims is None or dst_dims is None:
        return None
    blocks: list[s_tir.stmt.SBlock] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.stmt.SBlock, blocks.append)])
    blocks = [b for b in blocks if b.iter_vars]
    if len(blocks) != 1:
        return None
    block = blocks[0]
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tvm.ir.TensorLoad):
        return None
    load = store.value
    iters = [iv.var for iv in block.iter_vars]
    if not (store.buffer.same_as(dst) and load.source.same_as(src)
            and all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)
            and len(store.indices) == len(iters)
            and all(i.same_as(v) for i, v in zip(store.indices, iters, strict=True))):
        return None
    ana = Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
    settle = SymbolicDivision(ana).settle
    source = _flat([settle(i) for i in load.indices], src_shape)
    if prod(src_dims) < prod(dst_dims):
        return Copy.REPEATED
    if prod(src_dims) > prod(dst_dims):
        return Copy.SLICED
    if not _bijective(load.indices, block, src_shape):
        return None
    if ana.can_prove_equal(source, _flat(iters, dst_shape)):
        return Copy.VIEW
    moving = [iv for iv in block.iter_vars if dim_value(iv.dom.extent) != 1]
    return Copy.ROWS if not moving or _unit_stride(source, moving, ana) else Copy.PERMUTED


def _flat(indices, shape: list[tvm.ir.PrimExpr]) -> tvm.ir.PrimExpr:
    flat = tirx.const(0, "int64")
    for index, extent in zip(indices, shape, strict=True):
        flat = flat * tirx.Cast("int64", extent) + tirx.Cast("int64", index)
    return flat


def _bijective(indices, block: s_tir.stmt.SBlock, shape: list[tvm.ir.PrimExpr]) -> bool:
    """Whether the load indices map the block's iteration space one-to-one into ``shape``
    (a legal op stays in bounds, so with equal sizes that is onto all of it)."""
    dom = {iv.var: tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent)
           for iv in block.iter_vars}
    found = tvm.sym.detect_iter_map(list(indices), dom, check_level="bijective")
    return len(found.indices) == len(shape)


def _unit_stride(source: tvm.ir.PrimExpr, iters: list[tirx.IterVar], ana: Analyzer) -> bool:
    """Whether one step along the innermost of ``iters`` (the output axes longer than one) is
    one step in the input, from the first element: the copy moves runs of the input's
    innermost axis whole."""
    step = ana.simplify(_at(source, iters, 1) - _at(source, iters, 0))
    return isinstance(step, tirx.IntImm) and int(step) == 1


def _at(expr: tvm.ir.PrimExpr, iters: list[tirx.IterVar], last: int) -> tvm.ir.PrimExpr:
    """``expr`` with every iterator 0 but the innermost, which is ``last``."""
    values = {iv.var: tirx.const(0, str(iv.var.ty.dtype)) for iv in iters}
    values[iters[-1].var] = tirx.const(last, str(iters[-1].var.ty.dtype))

    def on_var(v: tvm.ir.Var) -> tvm.ir.PrimExpr:
        return next((c for var, c in values.items() if var.same_as(v)), v)

    return tvm_ffi.structural_map(expr, [(tvm.ir.Var, on_var)])
