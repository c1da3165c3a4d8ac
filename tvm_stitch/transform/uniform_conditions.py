"""A condition that picks between two sources of an element (the halves of a concatenation,
the rotated half of a rotary embedding) is the same for every lane of an aligned vector when
its boundary falls on a multiple of the vector: ``32 <= j`` for vectors of 4 or 8. TVM's
VectorizeLoop cannot see that: it types the condition as a vector of booleans and runs the
lanes one by one, every load a scalar (LLaMA's rotary embedding read a thread's four floats
with four loads per source), or, for eight lanes, cannot type it at all. Stated at the
vector's first lane (``32 <= j // 4 * 4``), which is equal for every ``j``, it simplifies to
one condition per vector, and each branch loads whole vectors (also where ``j`` is itself a
remainder by a width that is no power of two: DIEN's concatenation of four pieces of 36;
``j - j % 4`` would not simplify there).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from .expressions import substituted, uses

_COMPARISONS = (tirx.LT, tirx.LE, tirx.GT, tirx.GE)
IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def lane_uniform(cond: tvm.ir.PrimExpr, var: tvm.ir.Var, vector: int) -> bool:
    """Whether ``cond`` has the same value at ``var = vector * q + l`` for every lane
    ``l < vector`` of every vector ``q``: conjunctions, disjunctions and negations of
    comparisons that do not depend on ``var``, or that move with it by one per lane and
    change sign only at a multiple of ``vector``."""
    if not uses(cond, var):
        return True
    if isinstance(cond, (tirx.And, tirx.Or)):
        return lane_uniform(cond.a, var, vector) and lane_uniform(cond.b, var, vector)
    if isinstance(cond, tirx.Not):
        return lane_uniform(cond.a, var, vector)
    if not isinstance(cond, _COMPARISONS) or not str(var.ty.dtype).startswith("int"):
        return False
    # as ``e >= 0``
    e = {tirx.LT: lambda a, b: b - a - 1, tirx.LE: lambda a, b: b - a,
         tirx.GT: lambda a, b: a - b - 1, tirx.GE: lambda a, b: a - b}[type(cond)](cond.a,
                                                                             cond.b)
    dtype = str(var.ty.dtype)
    if str(e.ty.dtype) != dtype:  # a comparison of values, not of positions
        return False
    q, lane = tvm.ir.Var("vector_index", dtype), tvm.ir.Var("lane", dtype)
    ana = Analyzer()
    ana.bind(q, tvm.ir.Range(0, 1 << 30))
    ana.bind(lane, tvm.ir.Range(0, vector))
    first = substituted(e, var, q * tirx.IntImm(dtype, vector))
    moved = ana.simplify(substituted(e, var, q * tirx.IntImm(dtype, vector) + lane) - first)
    if isinstance(moved, tirx.IntImm) and int(moved) == 0:
        return True
    found = ana.modular_set(first)
    if found.coeff % vector:
        return False
    if ana.can_prove_equal(moved, lane):  # lanes >= 0 from the first one that is
        return found.base % vector == 0
    if ana.can_prove_equal(moved, -lane):
        return found.base % vector == vector - 1
    return False


def uniform_conditions(func: tirx.PrimFunc, vector: int) -> tirx.PrimFunc:
    """``func`` with each ``if_then_else`` condition that depends on its block's innermost
    iterator but is ``lane_uniform`` for ``vector`` lanes stated at the vector's first lane:
    the same value for every element, so the function computes the same."""
    if vector == 1:
        return func

    def on_block(block: s_tir.SBlock) -> s_tir.SBlock:
        if not block.iter_vars:
            return block
        inner = block.iter_vars[-1].var
        dtype = str(inner.ty.dtype)
        first = tirx.floordiv(inner, tirx.IntImm(dtype, vector)) * tirx.IntImm(dtype, vector)

        def on_call(call: tvm.ir.Call) -> tvm.ir.PrimExpr:
            if not call.op.same_as(IF_THEN_ELSE):
                return call
            cond, then, other = call.args
            if not uses(cond, inner) or not lane_uniform(cond, inner, vector):
                return call
            return tirx.if_then_else(substituted(cond, inner, first), then, other)

        body = tvm_ffi.structural_map(block.body, [(tvm.ir.Call, on_call)])
        if body.same_as(block.body):
            return block
        return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                            body, block.init, block.alloc_buffers, block.match_buffers,
                            block.annotations)

    return tvm_ffi.structural_map(func, [(s_tir.SBlock, on_block)])


__all__ = ["IF_THEN_ELSE", "lane_uniform", "uniform_conditions"]
