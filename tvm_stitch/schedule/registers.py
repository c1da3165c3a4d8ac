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

The element-wise readers of a copy cannot run past the row's end (they write outputs), so
``hold_inputs`` splits their walk instead: the whole steps first, unguarded (TVM proves them
inside the row), then the last, partial step under the row's guard. nvcc does not bound
``threadIdx.x`` by the block size and so kept the guard on every unrolled step: a softmax
over rows of 30000 holding 30 elements per thread of a 1024-thread block with three
element-wise outputs spilled 40 to 48 B at the 64 registers of its launch bound (fuzz case
stitch-s4242-g38), and none once only the last step was guarded. A reduction's walk stays
whole: TVM lowers one reduction block to one cross-thread reduction. An input re-read from
global memory by several blocks is kept in registers by nvcc alike, and its element-wise
readers' walks are split the same way.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..plan import BufferRole, Group, StorageLevel
from .blocks import LOCAL, buffer_params, name_of, readers

WHOLE_STEPS_SLACK = 16
"""A copy runs over whole steps when the elements past the row's end are at most this
fraction of the row (a 32000-element row over 1024 threads: 768 of 32768, about 1/42)."""


def held_inputs(group: Group) -> list[str]:
    """Names of the inputs ``group`` holds in registers."""
    return [b.name for b in group.buffers
            if b.role is BufferRole.INPUT and b.level is StorageLevel.REGISTER]


def hold_inputs(sch: s_tir.Schedule, group: Group) -> s_tir.Schedule:
    """``sch`` (a scheduled row group) with the register copies of the held inputs laid out
    and unguarded, and the last steps of their readers, and of the readers of inputs re-read
    from global memory, guarded apart, as the module docstring says; a new schedule when a
    copy was unguarded."""
    names = [f"{name}_{LOCAL}" for name in held_inputs(group)]
    threads = group.mapping.threads_per_row
    for name in names:
        block = sch.get_sblock(name)
        dtype = str(sch.get(block).writes[0].source.shape[0].ty.dtype)
        # not injective over the buffer, only per thread and row: what local storage means
        sch.transform_layout(block, ("write", 0), tirx.IndexMap.from_func(
            lambda _row, e: (e // threads,), ndim=2, index_dtype=dtype),
            assume_injective_transform=True)
    if names:
        sch = _unguarded_copies(sch, set(names))
    if not group.phases:
        # A persistent grid's phases are later cut out of the kernel by block: the partition
        # copies a reader's block, and the float16 persistent grid of fuzz seed 2027, graph 139
        # then spilled and passed its arrays shifted on the SIMT runner.
        copies = [sch.get(sch.get_sblock(name)).writes[0].source for name in names]
        _guard_last_step(sch, copies + _reread_inputs(sch, group), threads)
    return sch


def _unguarded_copies(sch: s_tir.Schedule, names: set[str]) -> s_tir.Schedule:
    """``sch`` with the register copies ``names`` (block names) run over whole steps
    (``_whole_steps``); a new schedule when one was."""
    func = sch.mod["main"]
    ana = Analyzer()

    def bind(loop: tirx.For) -> None:
        ana.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))

    tvm_ffi.structural_walk(func.body, [(tirx.For, bind)])
    unguarded = tvm_ffi.structural_map(
        func, [(s_tir.stmt.SBlockRealize, lambda r: _whole_steps(r, names, ana))])
    return sch if unguarded.same_as(func) else s_tir.Schedule(unguarded)


def _reread_inputs(sch: s_tir.Schedule, group: Group) -> list[tirx.Buffer]:
    """The inputs ``group`` reads from global memory in several blocks: nvcc keeps them in
    registers between their unrolled reads as it keeps a held copy, and a guard on every
    step of a reader cost a LayerNorm over rows of 32639 on 1024 threads, 32 elements per
    thread, 8 B of spills at its 64 registers on sm_80 (fuzz case 818987:14)."""
    names = {b.name for b in group.buffers
             if b.role is BufferRole.INPUT and b.level is StorageLevel.GLOBAL}
    return [b for b in buffer_params(sch.mod["main"])
            if b.name in names and len(readers(sch, b)) > 1]


def _guard_last_step(sch: s_tir.Schedule, buffers: list[tirx.Buffer], threads: int) -> None:
    """Split the element walk of every element-wise block that reads one of ``buffers``
    into its whole steps and its last step, where ``threads`` do not divide the block's row:
    only the last step then keeps the row's guard."""
    users = sorted({name_of(sch, b) for buffer in buffers for b in readers(sch, buffer)})
    for name in users:
        block = sch.get_sblock(name)
        iters = sch.get(block).iter_vars
        if any(int(iv.iter_type) != tirx.IterVar.DataPar for iv in iters):
            continue
        elements = iters[-1].dom.extent
        loop = sch.get_loops(block)[-1]
        steps = sch.get(loop).extent
        if not isinstance(elements, tirx.IntImm) or not isinstance(steps, tirx.IntImm) \
                or not int(elements) % threads or int(steps) < 2 \
                or int(steps) != -(-int(elements) // threads):
            continue
        sch.loop_partition(loop, [int(steps) - 1, None])


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
