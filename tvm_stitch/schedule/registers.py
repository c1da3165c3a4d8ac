"""Inputs held in registers: a row too long for shared memory, copied once into the registers of
the threads that read it.

Every reader of such an input walks the row with the same element-to-thread mapping (thread
``t`` of ``P`` takes the elements ``t, t + P, t + 2P, ...`` of the row it is at), so each
thread reads only the elements it copied. ``hold_inputs`` gives the copy one slot per step of
the thread over its row (``element // P``): a local buffer is private to its thread, and the
thread walks one row at a time, so neither the row nor the thread needs a dimension (TVM's
compaction would otherwise keep the bounding box of a thread's strided elements: about the
whole row). It then lets the copy run over whole steps when that adds at most
``1 / WHOLE_STEPS_SLACK`` of the row: where the threads do not divide the row, the last step
reads the row's last element again instead of testing every step against the row's end
(those slots are never read; the test costs each unrolled load a predicate, and ptxas the
registers that keep a 32-slot row spill-free in a 1024-thread block). The extra loads hit
the cache line the step loads anyway, but the traffic count (which reads the TIR) includes
them.

The readers of a copy cannot run past the row's end (they write outputs, or reduce the row),
so ``guard_last_steps`` states their guard per step instead: TVM writes the row-end test of
step ``s`` and lane ``t`` as ``s * 64 + (t >> 4) < 1875`` (rows of 30000 on 1024 threads),
and nvcc, which does not bound ``threadIdx.x`` by the block size, keeps it on every unrolled
step; ``s < 29 or t < 304`` folds to true on all steps but the last. A softmax over rows of
30000 holding 30 elements per thread of a 1024-thread block with three element-wise outputs
spilled 40 to 48 B at the 64 registers of its launch bound (fuzz case stitch-s4242-g38), a
log-softmax and a floor on a persistent grid 44 B (fuzz 12027:159), and none so guarded. The
guard is restated on the finished kernel, which keeps the persistent grid's blocks whole (an
earlier split of the readers' walks copied blocks its phases are cut by: fuzz case
stitch-s2027-g139). A reduction's guard is restated once its cross-thread reduction is
lowered: TVM's LowerCrossThreadReduction takes no block under the restated guard for a
reduction (each thread reduced its own elements). Five reductions of a row of 30000 held
that way (a softmax, a log-softmax of it, their minima: fuzz 12029:422) spilled 8-24 B with
the guard on every step, none without. An input re-read from global memory by several blocks
is kept in registers by nvcc alike, and its readers' guards are restated the same way.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..plan import BufferRole, Group, StorageLevel
from .blocks import LOCAL, buffer_params

WHOLE_STEPS_SLACK = 16
"""A copy runs over whole steps when the elements past the row's end are at most this
fraction of the row (a 32000-element row over 1024 threads: 768 of 32768, about 1/42)."""


def held_inputs(group: Group) -> list[str]:
    """Names of the inputs ``group`` holds in registers."""
    return [b.name for b in group.buffers
            if b.role is BufferRole.INPUT and b.level is StorageLevel.REGISTER]


def hold_inputs(sch: s_tir.Schedule, group: Group) -> s_tir.Schedule:
    """``sch`` (a scheduled row group) with the register copies of the held inputs laid out
    and unguarded, as the module docstring says; a new schedule when a copy was unguarded."""
    names = [f"{name}_{LOCAL}" for name in held_inputs(group)]
    threads = group.mapping.threads_per_row
    for name in names:
        block = sch.get_sblock(name)
        dtype = str(sch.get(block).writes[0].source.shape[0].ty.dtype)
        # not injective over the buffer, only per thread and row: what local storage means
        sch.transform_layout(block, ("write", 0), tirx.IndexMap.from_func(
            lambda _row, e: (e // threads,), ndim=2, index_dtype=dtype),
            assume_injective_transform=True)
    return _unguarded_copies(sch, set(names)) if names else sch


def _unguarded_copies(sch: s_tir.Schedule, names: set[str]) -> s_tir.Schedule:
    """``sch`` with the register copies ``names`` (block names) run over whole steps
    (``_whole_steps``); a new schedule when one was."""
    func = sch.mod["main"]
    ana = _loop_ranges(func)
    unguarded = tvm_ffi.structural_map(
        func, [(s_tir.stmt.SBlockRealize, lambda r: _whole_steps(r, names, ana))])
    return sch if unguarded.same_as(func) else s_tir.Schedule(unguarded)


def _loop_ranges(func: tirx.PrimFunc) -> Analyzer:
    """An analyzer that knows the range of every loop variable of ``func``."""
    ana = Analyzer()

    def bind(loop: tirx.For) -> None:
        ana.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))

    tvm_ffi.structural_walk(func.body, [(tirx.For, bind)])
    return ana


def guard_last_steps(func: tirx.PrimFunc, group: Group) -> tirx.PrimFunc:
    """``func`` (the finished kernel of ``group``) with the row guard of every block that
    reads a held copy, or an input several blocks re-read from global memory, stated per
    step: ``step * P + t < L`` (``P`` threads, ``t`` the thread's lane, ``step`` over the
    ``ceil(L / P)`` steps) becomes ``step < L // P or t < L % P``, which the unrolled whole
    steps fold to true (see the module docstring). Restated on the finished kernel: a
    schedule cannot prove that a block under such a guard covers what it writes. Where a
    reduction is among those blocks, its cross-thread reduction is lowered first
    (``LowerCrossThreadReduction``, which TVM's pipeline runs again to no effect): the pass
    does not take a reduction under the restated guard for one, and each thread reduced its
    own elements."""
    names = _guarded_readers(func, group)
    if any(not _element_wise(b) for b in _sblocks(func) if b.name_hint in names):
        func = s_tir.transform.LowerCrossThreadReduction()(tvm.IRModule({"main": func}))["main"]
        names = _guarded_readers(func, group)
    if not names:
        return func
    ana = _loop_ranges(func)

    def restate(expr: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
        if isinstance(expr, tirx.And):
            return tirx.And(restate(expr.a), restate(expr.b))
        per_step = _per_step(expr, ana)
        return expr if per_step is None else per_step

    def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
        if realize.block.name_hint not in names:
            return realize
        predicate = restate(realize.predicate)
        if predicate.same_as(realize.predicate):
            return realize
        return s_tir.stmt.SBlockRealize(realize.iter_values, predicate, realize.block)

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlockRealize, on_realize)])


def _sblocks(func: tirx.PrimFunc) -> list[s_tir.stmt.SBlock]:
    """Every block of ``func``."""
    blocks: list[s_tir.stmt.SBlock] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.stmt.SBlock, blocks.append)])
    return blocks


def _element_wise(block: s_tir.stmt.SBlock) -> bool:
    """Whether ``block`` has data-parallel iterators only."""
    return all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in block.iter_vars)


def _guarded_readers(func: tirx.PrimFunc, group: Group) -> set[str]:
    """The blocks of ``func`` that read a held copy of ``group``, or an input several of its
    blocks re-read from global memory."""
    blocks = _sblocks(func)
    copies = {f"{name}_{LOCAL}" for name in held_inputs(group)}
    watched = [w.source for b in blocks if b.name_hint in copies for w in b.writes]
    inputs = {b.name for b in group.buffers
              if b.role is BufferRole.INPUT and b.level is StorageLevel.GLOBAL}
    for param in buffer_params(func):
        # nvcc keeps an input re-read by several blocks in registers between its unrolled
        # reads as it keeps a held copy: a guard on every step of a LayerNorm's reader over
        # rows of 32639 on 1024 threads cost 8 B of spills on sm_80 (fuzz case 818987:14)
        if param.name in inputs and sum(_reads(b, param) for b in blocks) > 1:
            watched.append(param)
    return {b.name_hint for b in blocks if any(_reads(b, buffer) for buffer in watched)}


def _reads(block: s_tir.stmt.SBlock, buffer: tirx.Buffer) -> bool:
    """Whether ``block`` reads ``buffer``."""
    return any(r.source.same_as(buffer) for r in block.reads)


def _per_step(guard: tvm.ir.PrimExpr, ana: Analyzer) -> tvm.ir.PrimExpr | None:
    """``guard`` stated per step if it is ``step * P + t < L`` over whole loops (``t`` in
    ``[0, P)``, ``step`` in ``[0, ceil(L / P))``, ``P`` not dividing ``L``); else None."""
    if not isinstance(guard, tirx.LT) or not isinstance(guard.b, tirx.IntImm) \
            or not isinstance(guard.a, tirx.Add):
        return None
    length = int(guard.b)
    for scaled, lane in ((guard.a.a, guard.a.b), (guard.a.b, guard.a.a)):
        if not (isinstance(scaled, tirx.Mul) and isinstance(scaled.a, tirx.Var)
                and isinstance(scaled.b, tirx.IntImm) and isinstance(lane, tirx.Var)):
            continue
        step, threads = scaled.a, int(scaled.b)
        lanes, steps = ana.const_int_bound(lane), ana.const_int_bound(step)
        if threads > 0 and length % threads and lanes.min_value == 0 \
                and lanes.max_value == threads - 1 and steps.min_value == 0 \
                and steps.max_value == length // threads:
            return tirx.Or(step < length // threads, lane < length % threads)
    return None


def _whole_steps(realize: s_tir.stmt.SBlockRealize, names: set[str], ana: Analyzer
                 ) -> s_tir.stmt.SBlockRealize:
    """A copy block whose only predicate is its element's bound, run over whole steps with
    its read clamped to the row; any other block unchanged. ``ana`` knows the loops'
    ranges."""
    block = realize.block
    if block.name_hint not in names or len(block.iter_vars) != 2:
        return realize
    element, binding = block.iter_vars[1], realize.iter_values[1]
    length = element.dom.extent
    if not tvm_ffi.structural_equal(ana.simplify(realize.predicate),
                                    ana.simplify(binding < length)):
        return realize
    padded = _padded(binding, ana)
    if (int(padded) - int(length)) * WHOLE_STEPS_SLACK > int(length):
        return realize
    last = length - tirx.IntImm(length.ty.dtype, 1)
    clamped = tirx.Min(element.var, last)

    def on_var(var: tvm.ir.Var) -> tvm.ir.PrimExpr:
        return clamped if var.same_as(element.var) else var

    store = block.body
    load = tvm_ffi.structural_map(store.value, [(tvm.ir.Var, on_var)])
    reads = [tvm_ffi.structural_map(r, [(tvm.ir.Var, on_var)]) for r in block.reads]
    steps = tirx.IterVar(tvm.ir.Range(tirx.IntImm(length.ty.dtype, 0), padded),
                         element.var, element.iter_type)
    body = tirx.BufferStore(store.buffer, load, store.indices)
    new = s_tir.stmt.SBlock([block.iter_vars[0], steps], reads, block.writes, block.name_hint,
                            body, block.init, block.alloc_buffers, block.match_buffers,
                            block.annotations)
    return s_tir.stmt.SBlockRealize(realize.iter_values, tirx.IntImm("bool", 1), new)


def _padded(binding: tvm.ir.PrimExpr, ana: Analyzer) -> tvm.ir.PrimExpr:
    """The extent of the whole steps ``binding`` walks: one past its largest value."""
    bound = ana.const_int_bound(binding)
    return tirx.IntImm(binding.ty.dtype, int(bound.max_value) + 1)
