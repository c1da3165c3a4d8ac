"""Unrolling: how far nvcc may unroll a thread's loop over its row elements.

nvcc unrolls a short loop over a thread's elements fully, a long one a few steps at a time
(``occupancy.unrolled_steps``), and issues every load of the steps it unrolls before the
first use. A block that streams inputs from global memory (read once, neither held nor
cached in registers), or beside a held row reads Regional intermediates in shared memory
(``rows.shared_reads``), then has all their elements of those steps in flight, a register
each; where that exceeds what the thread's register cap leaves beside its cached and held
elements (``occupancy.loads_room``), the plan bounds the unrolling of that block's element
loop (``Group.unrolled``; emission annotates the loop). Still a register's worth of loads in
flight per element the room allows: far more than a memory-bound kernel needs to cover the
latency.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ...plan import MappingKind, ThreadMapping, Unrolled
from ...symbolic import shape_values
from ..blocks import buffer_params, child_blocks, name_of, written_params
from ..occupancy import FULL_UNROLL_STEPS, unrolled_steps
from ..rows import BlockRows, row_elements
from ..vectors import spatial_block


def bound_unrolling(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                    mapping: ThreadMapping, on_chip: set[str], shared: frozenset[str],
                    room: int, held: frozenset[str], vector_reads: bool = False,
                    rolled: frozenset[str] = frozenset()) -> tuple[Unrolled, ...]:
    """The row blocks (``infos``) of ``sch`` whose element loops, as nvcc would unroll them
    under ``mapping``, would have more elements of what they load (the inputs of ``func``
    they stream, other than ``on_chip``: staged, held or cached in registers; and the
    ``shared`` intermediates) in flight than ``room``, each with the most steps that keep
    within it and divide its loop (emission unrolls runs of them; one at least). Reductions
    read one element a step, or with ``vector_reads`` (``Choices.vector_reads``) a vector.
    A block reading one of the ``rolled`` inputs (``rows.rolled_rereads``) unrolls fewer
    steps than it has, so that nvcc keeps none of their elements in registers from one loop
    to the next. A block reading an input ``held`` in registers (``registers.hold_inputs``)
    is left whole: its loop indexes the held copy, which only a fully unrolled loop keeps in
    registers. None for rows of run-time length (a loop nvcc does not unroll) or a mapping
    without an element loop per thread."""
    if mapping.length_expr or mapping.kind not in (MappingKind.BLOCK_PER_ROW,
                                                   MappingKind.WARP_PER_ROW,
                                                   MappingKind.STRIDED_ROWS):
        return ()
    written = {p.name for p in written_params(func, sch)}
    loaded = {p.name for p in buffer_params(func)
              if p.name not in written and p.name not in on_chip} | shared
    bounded = []
    for block in child_blocks(sch):
        name, stmt = name_of(sch, block), sch.get(block)
        info = infos.get(name)
        inputs = {r.source.name: r.source for r in stmt.reads if r.source.name in loaded}
        if info is None or not inputs or any(r.source.name in held for r in stmt.reads):
            continue
        lanes = mapping.vector if spatial_block(stmt) or vector_reads else 1
        steps = -(-info.elements // (mapping.threads_per_row * lanes))
        per_step = sum(lanes if _streams_rows(p, info, mapping.rows) else 1
                       for p in inputs.values())
        longest = steps - 1 if steps > 1 and rolled & inputs.keys() else steps
        if longest == steps and _nvcc_steps(steps, stmt) * per_step <= room:
            continue
        fitting = min(longest, max(1, room // per_step))
        run = max(d for d in range(1, fitting + 1) if steps % d == 0)
        if run < steps:  # a loop of one step has nothing to bound
            bounded.append(Unrolled(name, run, lanes, per_step))
    return tuple(bounded)


SMALL_BODY_FULL_UNROLL_STEPS = 2 * FULL_UNROLL_STEPS
"""Most steps of a reduction's loop over a thread's row elements that nvcc may unroll fully:
a LayerNorm's variance over a row of 65535 on 1024 threads (64 steps, a load, a subtraction
and a multiply-add each) was unrolled whole under ``--use_fast_math`` on sm_80: 64 registers
and 20 B spilled where runs of 32 took 64 and none (fuzz graph 818016:38)."""


def _nvcc_steps(steps: int, block: s_tir.stmt.SBlock) -> int:
    """Steps of a block's loop of ``steps`` that nvcc may unroll at once: a reduction's small
    body up to ``SMALL_BODY_FULL_UNROLL_STEPS`` whole, else ``occupancy.unrolled_steps``."""
    if not spatial_block(block) and steps <= SMALL_BODY_FULL_UNROLL_STEPS:
        return steps
    return unrolled_steps(steps)


def _streams_rows(param: tirx.Buffer, info: BlockRows, rows: int) -> bool:
    """Whether ``param`` has as many elements per row as ``info``'s block visits (or an
    unknown count), a load of its own for each lane; else it is broadcast over the row (a
    scale per channel, a scalar), and its lanes at a step share at most a load or so."""
    return shape_values(param.shape) is None or row_elements(param, rows) >= info.elements


def bound_row_walk(sch: s_tir.Schedule, func: tirx.PrimFunc, mapping: ThreadMapping, rows: int,
                   per_tile: set[str], room: int) -> int:
    """Rows of a tile's walk (``mapping.row_steps`` rows, one at a time, of a Global row
    phase) that nvcc may unroll at once, or 0 where it may unroll the whole walk: each row
    loads its elements of the inputs of ``func`` a thread reads from global memory (all but
    the ``per_tile`` ones, staged or held once per tile), nvcc issues the loads of every row
    of an unrolled walk before their first use (across the barriers between rows), and
    those of the rows it unrolls must fit ``room`` (``occupancy.loads_room``). The most rows
    that fit and divide the walk, one at least. A column mean of (2048, 4096) beside an
    element-wise output (fuzz graph 12016:477), 16 rows a tile, a float4 of the staged row
    per thread and row, 4 partial sums per thread in registers at a cap of 64: the whole walk
    unrolled took 84 registers where the cap allows 64 (8 B spilled on sm_80 and sm_90);
    runs of 2 to 8 rows, 63 and none."""
    if mapping.rows_expr or mapping.row_steps <= 1:
        return 0  # a run-time walk is a loop nvcc does not unroll
    written = {p.name for p in written_params(func, sch)}
    loads = sum(-(-min(row_elements(p, rows), mapping.row_length) // mapping.threads_per_row)
                for p in buffer_params(func)
                if p.name not in written and p.name not in per_tile)
    if unrolled_steps(mapping.row_steps) * loads <= room:
        return 0
    fitting = max(1, room // max(loads, 1))
    return max(d for d in range(1, fitting + 1) if mapping.row_steps % d == 0)


__all__ = ["bound_row_walk", "bound_unrolling"]
