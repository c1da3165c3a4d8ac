"""Keep the guard of a cross-thread reduction's write-back.

TVM 0.27's LowerCrossThreadReduction gives the block that writes a cross-thread reduction's
result the clauses of the reduction block's predicate that name no reduction loop, collected
from its ``And`` nodes only: a predicate of one clause (``row < n``, the guard of a partial
last block of packed rows, or of a persistent grid's last tasks) is dropped, and the threads
past the end write their row's result out of bounds (a 2000-row sum packed 24 rows per block
wrote 16 floats past its output). Stated twice, ``p && p``, the clause is kept.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx


def _is_true(expr: object) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == 1


def keep_write_back_guards(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the one-clause predicate of every reduction block stated as ``p && p``,
    which LowerCrossThreadReduction keeps on the write-back."""

    def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
        predicate = realize.predicate
        reduces = any(iv.iter_type == tirx.IterVar.CommReduce for iv in realize.block.iter_vars)
        if not reduces or _is_true(predicate) or isinstance(predicate, tirx.And):
            return realize
        return s_tir.stmt.SBlockRealize(realize.iter_values, tirx.And(predicate, predicate),
                                        realize.block)

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlockRealize, on_realize)])
