"""Index arithmetic that wraps only outside the domains of the block iterators is unwrapped.

TVM legalizes a reshape into a block that reads its input at the flattened index taken
apart again: (128, 3) into (128, 1, 3) reads ``[(k // 3 + i + j) % 128, k % 3]``, which in
the block's domains (``i < 128``, ``j < 1``, ``k < 3``) is ``[i, k]``. The wrapped form hides
that the access is the block's own element: a reader that keeps it in a register caches a
box around the wrap instead (fuzz graph 4242:205: a value recomputed for every reader, and a
copy loop whose trip count is not a constant). Only the indices change; bindings, loops and
the rest of the function stay as they are, which schedule rules rely on. Divisions by
symbolic extents (a reshape between ``(batch * seq, d)`` and ``(batch, seq, d)``) are
settled too (``symbolic_division``).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from .symbolic_division import SymbolicDivision

_WRAPS = (tirx.FloorMod, tirx.FloorDiv, tirx.Mod, tirx.Div)


def _wraps(expr: tvm.ir.PrimExpr) -> int:
    found: list[tvm.ir.PrimExpr] = []
    tvm_ffi.structural_walk(expr, [(_WRAPS, found.append)])
    return len(found)


def unwrap_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every buffer index and accessed region that the domains of its blocks'
    iterators simplify to fewer divisions and remainders replaced by that simpler form."""
    ana = Analyzer()

    def bind(block: s_tir.SBlock) -> None:
        for iv in block.iter_vars:
            ana.bind(iv.var, iv.dom)

    tvm_ffi.structural_walk(func, [(s_tir.SBlock, bind)])
    division = SymbolicDivision(ana)

    def simpler(expr: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
        wraps = _wraps(expr)
        if not wraps:
            return expr
        simplified = division.settle(expr)
        return simplified if _wraps(simplified) < wraps else expr

    def on_load(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        indices = [simpler(i) for i in load.indices]
        if all(a.same_as(b) for a, b in zip(indices, load.indices, strict=True)):
            return load
        return tirx.BufferLoad(load.source, indices)

    def on_region(region: tvm.ir.TensorRegion) -> tvm.ir.TensorRegion:
        ranges = [tvm.ir.Range.from_min_extent(simpler(r.min), r.extent)
                  for r in region.region]
        if all(a.min.same_as(b.min) for a, b in zip(ranges, region.region, strict=True)):
            return region
        return tvm.ir.TensorRegion(region.source, ranges, region.ty)

    return tvm_ffi.structural_map(func, [(tvm.ir.TensorLoad, on_load),
                                         (tvm.ir.TensorRegion, on_region)])


__all__ = ["unwrap_indices"]
