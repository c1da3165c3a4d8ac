"""A minimum or maximum whose order the loop and block domains prove is settled.

Two readers of one value can reach the same element through indices spelled differently:
a flat kernel's reader through a reshape has ``bx * 1024 + tx * 4 - bx // 4 * 4096`` where
another has ``bx % 4 * 1024 + tx * 4``. TVM's analyzer proves them equal but keeps both
forms, so the region a producer computed at their thread must cover is a ``min`` and a
``max`` of the two: its loop has a run-time trip count, a register copy of it is indexed
at run time, and ptxas puts the copy in local memory (fuzz graph 1206:11). Settling each
``min``/``max`` that the domains order turns the trip count back into a constant and the
indices into ones that simplify to the lane.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from .symbolic_division import SymbolicDivision


def settle_bounds(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every ``min(a, b)`` and ``max(a, b)`` that the domains of its loops and
    block iterators order replaced by the side they choose (the first when equal), and the
    loop extents that changed simplified."""
    ana = Analyzer()
    bound: set[tirx.Var] = set()

    def bind(var: tirx.Var, dom: tvm.ir.Range) -> None:
        if var not in bound:
            bound.add(var)
            ana.bind(var, dom)

    def bind_loop(loop: tirx.For) -> None:
        bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))

    def bind_block(block: s_tir.SBlock) -> None:
        for iv in block.iter_vars:
            bind(iv.var, iv.dom)

    tvm_ffi.structural_walk(func, [(tirx.For, bind_loop), (s_tir.SBlock, bind_block)])
    division = SymbolicDivision(ana)  # indices taken apart by symbolic extents
    changed: list[bool] = []

    def on_min(node: tirx.Min) -> tvm.ir.PrimExpr:
        return _settled(node, node.a, node.b, smaller=True)

    def on_max(node: tirx.Max) -> tvm.ir.PrimExpr:
        return _settled(node, node.a, node.b, smaller=False)

    def _settled(node: tvm.ir.PrimExpr, a: tvm.ir.PrimExpr, b: tvm.ir.PrimExpr,
                 smaller: bool) -> tvm.ir.PrimExpr:
        for x, y in ((a, b), (division.settle(a), division.settle(b))):
            if ana.can_prove(x <= y if smaller else x >= y):
                changed.append(True)
                return a
            if ana.can_prove(y <= x if smaller else y >= x):
                changed.append(True)
                return b
        return node

    settled = tvm_ffi.structural_map(func, [(tirx.Min, on_min), (tirx.Max, on_max)])
    if not changed:
        return func

    def on_loop(loop: tirx.For) -> tirx.For:
        extent = ana.simplify(loop.extent)
        if extent.same_as(loop.extent) or tvm_ffi.structural_equal(extent, loop.extent):
            return loop
        return tirx.For(loop.loop_var, loop.min, extent, loop.kind, loop.body,
                        loop.thread_binding, loop.annotations)

    return tvm_ffi.structural_map(settled, [(tirx.For, on_loop)])


__all__ = ["settle_bounds"]
