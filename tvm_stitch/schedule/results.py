"""Reduction results read once per row into each thread's registers.

TVM lowers a reduction across the threads of a block (``LowerThreadAllreduce``) by leaving
its result in a one-slot shared buffer that thread 0 writes and every thread then reads, and
every read of the result becomes a ``volatile`` load of that slot: nvcc must load it again
at each use, and cannot compute what depends on it alone once per row. A LayerNorm's output
loop loaded its three sums six times per element and took a reciprocal square root per
element; a softmax's a logarithm per element.

Each block that reads such a result gets its own copy of it, made at the innermost thread
loop above the block's element loop: one volatile load per thread and row, then a register
that nvcc hoists out of the element loop with whatever depends on it only. The copies have
the scope ``RESULT_SCOPE``: TVM's StorageRewrite otherwise reuses a result's slot for the
copy made by its last reader (an in-place update it finds for a copy of equal size and
scope), and the copy vanishes into the volatile slot again.

Besides the instructions, a copy saves registers: nvcc holds the loads of an unrolled
element loop that it cannot merge. A log-softmax of erf of a log-softmax over rows of 4096
(256 threads, four elements a thread) spilled 8 B at the 48 registers of its launch bound on
sm_90 with the results read in the loop (fuzz case stitch-s9420-g11); with the copies it
takes 40 registers and spills nothing.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..transform.expressions import uses
from .blocks import LOCAL, child_blocks, name_of, readers

RESULT_SCOPE = f"{LOCAL}.result"
"""Thread-local, as ``local``, under a scope of its own (see the module docstring)."""


def results_in_registers(sch: s_tir.Schedule) -> None:
    """Give every block of ``sch`` (mapped to threads) that reads the result of a reduction
    across threads (a thread-local buffer, which TVM makes the shared slot) its own register
    copy of that result, made once per row of the thread."""
    crossing = _cross_thread_reductions(sch)
    for block in child_blocks(sch):
        if name_of(sch, block) not in crossing:
            continue
        for region in sch.get(block).writes:
            if region.source.scope() != LOCAL:  # a partial sum, written out for a combine
                continue
            for reader in readers(sch, region.source, exclude=block):
                at = _innermost_thread_loop(sch, reader)
                if at is None:  # a block of one thread: its loads are not volatile
                    continue
                index = next(i for i, r in enumerate(sch.get(reader).reads)
                             if r.source.same_as(region.source))
                try:
                    _copy_at(sch.copy(), reader, index, at)
                except s_tir.ScheduleError:
                    continue  # compute-at refuses the scope: the reader keeps its loads
                _copy_at(sch, reader, index, at)


def _copy_at(sch: s_tir.Schedule, reader: SBlockRV, index: int, at: LoopRV) -> None:
    """Copy the ``index``-th buffer ``reader`` reads into ``RESULT_SCOPE`` at ``at``."""
    copy = sch.cache_read(reader, index, RESULT_SCOPE, consumer_blocks=[reader])
    sch.compute_at(copy, at)


def _thread_loops(sch: s_tir.Schedule, block: SBlockRV) -> list[LoopRV]:
    """The loops of ``block`` bound to a thread index, outermost first."""
    return [loop for loop in sch.get_loops(block)
            if (binding := sch.get(loop).thread_binding) is not None
            and binding.thread_tag.startswith("threadIdx")]


def _innermost_thread_loop(sch: s_tir.Schedule, block: SBlockRV) -> LoopRV | None:
    loops = _thread_loops(sch, block)
    return loops[-1] if loops else None


def _cross_thread_reductions(sch: s_tir.Schedule) -> set[str]:
    """Names of the blocks of ``sch`` that reduce across threads: a reduction iterator of
    theirs is bound to a loop over a thread index."""
    realizes: dict[str, s_tir.stmt.SBlockRealize] = {}

    def visit(realize: s_tir.stmt.SBlockRealize) -> None:
        realizes[realize.block.name_hint] = realize

    tvm_ffi.structural_walk(sch.mod["main"].body, [(s_tir.stmt.SBlockRealize, visit)])
    found = set()
    for block in child_blocks(sch):
        name = name_of(sch, block)
        realize = realizes.get(name)
        if realize is None:
            continue
        threads = [sch.get(loop).loop_var for loop in _thread_loops(sch, block)]
        reduced = [value for iv, value in zip(realize.block.iter_vars, realize.iter_values,
                                              strict=True)
                   if int(iv.iter_type) == tirx.IterVar.CommReduce]
        if any(uses(value, var) for value in reduced for var in threads):
            found.add(name)
    return found


__all__ = ["RESULT_SCOPE", "results_in_registers"]
