"""Emit the schedule of one stitched group: the plan's decisions as TIR schedule primitives.

The result is one kernel. Every block is first rewritten to iterate over (row, element).
Sinks (blocks whose result leaves the kernel) are tiled as ``rows -> (blockIdx.x, serial
steps, threadIdx.y)`` and ``row elements -> (threadIdx.x, serial)``; their block and step
loops are merged, every other block is computed at the step loop with its own row loop on
threadIdx.y and element loop over threadIdx.x, and inputs shared by all rows of a block are
staged before the steps. So a thread block walks its rows phase by phase: Local producers
are inlined (registers), Regional ones live in shared memory (TVM's ThreadSync puts the
barriers between phases), reductions become cross-thread reductions over threadIdx.x.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..plan import Group, MappingKind, ThreadMapping
from .blocks import (
    LOCAL,
    SCOPES,
    SHARED,
    add_unit_loops,
    cache_reused_outputs,
    child_blocks,
    name_of,
    narrow_indices,
    readers,
)
from .rows import Unstitchable, block_rows, prefix_split


def emit(func: tirx.PrimFunc, group: Group) -> s_tir.Schedule:
    """Schedule ``func`` (the fused PrimFunc of ``group``) as the plan says: one kernel."""
    if group.mapping is None:
        raise Unstitchable(f"group {group.id} has no thread mapping")
    func = narrow_indices(func)
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    cache_reused_outputs(sch, func, on_chip_scope(group.mapping))
    for name in group.inlined:
        sch.compute_inline(sch.get_sblock(name))
    block_caches: list[str] = []
    for buf in group.buffers:
        scope = SCOPES.get(buf.level)
        if scope is None:
            continue
        if buf.role == "intermediate":
            block = sch.get_sblock(buf.block)
            index = next(i for i, w in enumerate(sch.get(block).writes)
                         if w.source.name == buf.name)
            sch.set_scope(block, index, scope)
        elif buf.role == "input":
            cache = stage_input(sch, func, buf.name, scope)
            if buf.per_block:
                block_caches.append(name_of(sch, cache))
    if group.mapping.kind is MappingKind.FLAT:
        _map_flat(sch, group.mapping)
    else:
        _map_rows(sch, group.mapping, group.mapping.rows, block_caches)
    return sch


def on_chip_scope(mapping: ThreadMapping) -> str:
    """Where a kernel keeps what it reuses: registers when each thread owns its elements
    (flat mapping), shared memory when the threads of a row share them."""
    return LOCAL if mapping.kind is MappingKind.FLAT else SHARED


def stage_input(sch: s_tir.Schedule, func: tirx.PrimFunc, name: str, scope: str) -> SBlockRV:
    """Stage input parameter ``name`` on chip (``scope``) for every block that reads it."""
    param = next((p for p in func.params if p.name == name), None)
    if param is None:
        raise Unstitchable(f"no input {name}")
    users = readers(sch, param, affine=True)
    if not users:
        raise Unstitchable(f"nothing reads {name} at known places")
    index = next(i for i, r in enumerate(sch.get(users[0]).reads) if r.source.same_as(param))
    return sch.cache_read(users[0], index, scope, consumer_blocks=users)


def _sinks(sch: s_tir.Schedule) -> tuple[list[SBlockRV], list[SBlockRV]]:
    blocks = child_blocks(sch)
    sinks, others = [], []
    for b in blocks:
        written = [w.source for w in sch.get(b).writes]
        used = any(readers(sch, buf, exclude=b) for buf in written)
        (others if used else sinks).append(b)
    return sinks, others


def _map_flat(sch: s_tir.Schedule, mapping: ThreadMapping) -> None:
    """One element per thread: every sink's loops fused and split over (blockIdx.x,
    threadIdx.x), the sinks merged under one thread, the kept producers computed at it."""
    sinks, others = _sinks(sch)
    heads, threads = [], []
    for block in sinks:
        loops = sch.get_loops(block) or [sch.add_unit_loop(block)]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        outer, thread = sch.split(fused, [None, mapping.rows_per_block])
        heads.append(outer)
        threads.append(thread)
    bx = sch.merge(*heads) if len(heads) > 1 else heads[0]
    tx = sch.merge(*threads) if len(threads) > 1 else threads[0]
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    for block in reversed(others):
        sch.compute_at(block, tx, preserve_unit_loops=True)


def _flatten_rows(sch: s_tir.Schedule, rows: int, skip: list[str]) -> None:
    """Rewrite every block to iterate over exactly (row, element), and every buffer the kernel
    allocates to a (row, element) layout: a row space spread over several dimensions then maps
    to threads like a matrix does, the regions compute-at derives for a block's rows stay
    exact, and a block with one value per row (or a single row) gets a unit iterator of the
    kernel's index type instead of a 32-bit unit loop."""
    for block in child_blocks(sch):
        for index, region in enumerate(sch.get(block).writes):
            shape = [int(d) for d in region.source.shape]
            if region.source.scope() == "global":
                continue
            kb = prefix_split(shape, rows)
            if kb is None or (kb <= 1 and len(shape) - kb <= 1):
                continue
            layout = _row_element_map(list(range(kb)), shape[:kb],
                                      list(range(kb, len(shape))), shape[kb:])
            dtype = str(region.source.shape[0].ty.dtype)
            sch.transform_layout(block, ("write", index),
                                 tirx.IndexMap.from_func(layout, ndim=len(shape),
                                                         index_dtype=dtype))
    for block in child_blocks(sch):
        if name_of(sch, block) in skip:
            continue
        info = block_rows(sch, block, rows)
        elem_pos = [p for p in range(info.num_row_iters, len(info.iters))
                    if not (info.is_reduction and info.iters[p].kind == "S")]
        row_pos = list(range(info.num_row_iters))
        if len(info.iters) == 2 and row_pos == [0] and elem_pos == [1]:
            continue
        if all(i.extent == 1 for i in info.iters):
            # a scalar block: its iterators are bound to constants, not to loops
            while len(sch.get_loops(block)) < 2:
                sch.add_unit_loop(block)
            continue
        index_map = _row_element_map(row_pos, [info.iters[p].extent for p in row_pos],
                                     elem_pos, [info.iters[p].extent for p in elem_pos])
        dtype = str(info.iters[0].var.ty.dtype)
        sch.transform_block_layout(
            block, tirx.IndexMap.from_func(index_map, ndim=len(info.iters), index_dtype=dtype))


def _row_element_map(row_pos: list[int], row_extents: list[int], elem_pos: list[int],
                     elem_extents: list[int]):
    """Index map from a block's iterators to (linear row, linear element); a missing part
    becomes the constant 0."""

    def index_map(*vs):
        zero = tirx.IntImm(vs[0].ty.dtype, 0) if vs else 0
        row = _linear([vs[p] for p in row_pos], row_extents) if row_pos else zero
        elem = _linear([vs[p] for p in elem_pos], elem_extents) if elem_pos else zero
        return [row, elem]

    return index_map


def _linear(vs: list, extents: list[int]):
    index = vs[0]
    for v, n in zip(vs[1:], extents[1:], strict=True):
        index = index * n + v
    return index


def _map_rows(sch: s_tir.Schedule, mapping: ThreadMapping, rows: int,
              block_caches: list[str]) -> None:
    """Row mapping over blocks in (row, element) form (``_flatten_rows``): a thread block
    walks ``row_steps`` groups of ``rows_per_block`` rows; the phases of each group are
    computed in that loop, inputs staged for the whole block (``block_caches``) before it."""
    _flatten_rows(sch, rows, block_caches)
    sinks, others = _sinks(sch)
    caches = [b for b in others if name_of(sch, b) in block_caches]
    others = [b for b in others if name_of(sch, b) not in block_caches]
    heads, steps, bindings = [], [], []
    for block in sinks:
        row, elem = _two_loops(sch, block)
        outer, step, row_in_block = sch.split(
            row, [None, mapping.row_steps, mapping.rows_per_block])
        heads.append(outer)
        steps.append(step)
        bindings.append((row_in_block, _thread_loop(sch, elem, mapping)))
    bx = sch.merge(*heads) if len(heads) > 1 else heads[0]
    step = sch.merge(*steps) if len(steps) > 1 else steps[0]
    sch.bind(bx, "blockIdx.x")
    for row_in_block, thread in bindings:
        _bind_threads(sch, mapping, row_in_block, thread)
    for block in reversed(others):
        sch.compute_at(block, step, preserve_unit_loops=True)
        loops = sch.get_loops(block)[2:]
        if len(loops) != 2:
            raise Unstitchable(f"block {name_of(sch, block)}: compute-at made {len(loops)} "
                               "loops for (row, element)")
        _bind_threads(sch, mapping, loops[0], _thread_loop(sch, loops[1], mapping))
    for block in caches:
        sch.compute_at(block, bx, preserve_unit_loops=True)
        loops = sch.get_loops(block)[1:]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        _, row_in_block, thread = sch.split(
            fused, [None, mapping.rows_per_block, mapping.threads_per_row])
        _bind_threads(sch, mapping, row_in_block, thread)


def _two_loops(sch: s_tir.Schedule, block: SBlockRV) -> tuple[LoopRV, LoopRV]:
    loops = sch.get_loops(block)
    if len(loops) != 2:
        raise Unstitchable(f"block {name_of(sch, block)} is not in (row, element) form")
    return loops[0], loops[1]


def _thread_loop(sch: s_tir.Schedule, elem: LoopRV, mapping: ThreadMapping) -> LoopRV:
    """Split the element loop over ``threads_per_row`` threads, the thread loop outside
    (consecutive threads read consecutive elements); returns the thread loop."""
    serial, thread = sch.split(elem, [None, mapping.threads_per_row])
    sch.reorder(thread, serial)
    return thread


def _bind_threads(sch: s_tir.Schedule, mapping: ThreadMapping, row_in_block: LoopRV,
                  thread: LoopRV) -> None:
    if mapping.rows_per_block > 1:
        sch.bind(row_in_block, "threadIdx.y")
    sch.bind(thread, "threadIdx.x")
