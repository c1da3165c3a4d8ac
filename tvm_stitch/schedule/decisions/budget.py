"""The shared-memory budget: demote staging, packing and Regional intermediates until a
block fits."""

from __future__ import annotations

from dataclasses import replace

from tvm import s_tir, tirx

from ...plan import Buffer, BufferRole, Demotion, DemotionKind, StorageLevel, ThreadMapping
from ..blocks import child_blocks, inline, readers
from ..mapping import with_rows_per_block
from ..rows import Unstitchable
from ..vectors import HALF_MATH_CALLS, half_math_calls
from .state import Decisions, Staging, bytes_of, shared_bytes_of


def fit_budget(sch: s_tir.Schedule, dec: Decisions, mapping: ThreadMapping,
               budget: int, registers: int = 0) -> ThreadMapping:
    """Demote staging one buffer at a time until the block's shared memory fits ``budget``;
    an input staged per row whose readers read only their own elements goes to registers
    when each thread holds few enough of them (``hold``; ``registers`` per thread are
    already taken, by a Global group's partial sums), else to global memory; and a held
    input whose readers load too much from shared memory beside it goes to global memory
    after all (``_reread_beside_shared_loads``)."""
    while shared_bytes_of(dec, mapping) > budget:
        used = shared_bytes_of(dec, mapping)
        if dec.staged:
            victim = max(dec.staged, key=lambda s: s.bytes_for(mapping.rows_per_block))
            dec.staged.remove(victim)
            if hold(sch, dec, victim, mapping, registers):
                dec.demotions.append(Demotion(DemotionKind.HELD_IN_REGISTERS, victim.name,
                                              used=used, budget=budget))
                continue
            dec.global_reads.append(Buffer(victim.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           "demoted: re-read from global memory"))
            dec.demotions.append(Demotion(DemotionKind.REREAD, victim.name, used=used,
                                          budget=budget))
        elif dec.block_shared:
            victim = max(dec.block_shared, key=lambda b: b.size)
            dec.block_shared.remove(victim)
            dec.global_reads.append(Buffer(victim.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           "demoted: re-read from global memory"))
            dec.demotions.append(Demotion(DemotionKind.BLOCK_INPUT_REREAD, victim.name,
                                          used=used, budget=budget))
            if not dec.block_shared:
                mapping = replace(mapping, row_steps=1)
        elif mapping.rows_per_block > 1:
            dec.demotions.append(Demotion(DemotionKind.FEWER_ROWS_PER_BLOCK,
                                          before=mapping.rows_per_block,
                                          after=mapping.rows_per_block // 2, used=used,
                                          budget=budget))
            mapping = with_rows_per_block(mapping, mapping.rows_per_block // 2)
        elif dec.regional:
            victim = max(dec.regional, key=lambda s: s.per_row)
            try:
                inline(sch, sch.get_sblock(victim.block))
            except Exception as err:  # noqa: BLE001
                raise Unstitchable(
                    f"{used} B of shared memory > {budget} B and {victim.name} cannot be "
                    "recomputed") from err
            dec.regional.remove(victim)
            dec.inlined.append(victim.block)
            dec.demotions.append(Demotion(DemotionKind.RECOMPUTED, victim.name, used=used,
                                          budget=budget))
        else:
            raise Unstitchable(f"{used} B of shared memory > {budget} B with every "
                               "staged buffer demoted")
    _reread_beside_shared_loads(sch, dec, mapping)
    return mapping


REGISTER_ROW_ELEMENTS = 32
"""Most registers the elements of a row one thread holds take (an input that does not fit in
shared memory): 32 of the 64 registers a thread of a 1024-thread block may use at full
occupancy. An element narrower than 32 bits takes two (``_element_registers``)."""


MANY_OUTPUTS = 4
"""Outputs a kernel writes from which its held elements of a row take at most
``MANY_OUTPUTS_ROW_REGISTERS`` registers."""

MANY_OUTPUTS_ROW_REGISTERS = 28
"""Most registers the held elements of a row take beside ``MANY_OUTPUTS`` or more outputs,
each written in a loop over them with its own addresses. ptxas on a float32 softmax over
rows of L on 1024 threads beside ``-x`` and k outputs ``|-x|`` (fuzz 12043:288, k = 2 at
30000): 31 held beside 3 outputs, none spilled; 30 held beside 4, 5 or 6 outputs, 8 to 24 B
spilled; 29 held beside up to 8 outputs, none."""


def _row_registers(sch: s_tir.Schedule) -> int:
    """Most registers the elements of a row one thread holds may take in the kernel of
    ``sch``: ``REGISTER_ROW_ELEMENTS``, or ``MANY_OUTPUTS_ROW_REGISTERS`` where it writes
    ``MANY_OUTPUTS`` outputs or more."""
    written = {w.source.name for b in child_blocks(sch) for w in sch.get(b).writes}
    outputs = sum(p.name in written for p in sch.mod["main"].params)
    return MANY_OUTPUTS_ROW_REGISTERS if outputs >= MANY_OUTPUTS else REGISTER_ROW_ELEMENTS


def _element_registers(param: tirx.Buffer) -> int:
    """Registers one held element of ``param`` is budgeted: one, or two for a type narrower
    than 32 bits, whose readers keep it widened as well as at its own type (a LayerNorm
    reads it as float32, an element-wise output as float16). ptxas on a float16 LayerNorm
    over rows of 20000 on 1024 threads beside ``|x|``, 20 elements held: 32 B spilled on
    sm_90 (64 B beside ``|x|`` and ``sign(x)`` at 24000; 16 B with none on sm_80 at
    30000); at 16384 none; float32 rows of 32768 beside ``|x|``, 32 held, none."""
    return 2 if param.dtype.bits < 32 else 1


def hold(sch: s_tir.Schedule, dec: Decisions, staging: Staging, mapping: ThreadMapping,
         taken: int = 0) -> bool:
    """Hold the input ``staging`` in its threads' registers instead (``dec.held``), if every
    reader reads only its own elements and its elements a thread holds take at most
    ``REGISTER_ROW_ELEMENTS`` registers (``_row_registers``: fewer beside many outputs) with
    the ``taken`` it already keeps (never for a row of symbolic length: a loop of run-time
    extent holds nothing); whether it is held. A
    column reduction's 30 partial sums per thread and a held input of 30 more spilled (fuzz
    graph 1207:27). Nor beside ``vectors.HALF_MATH_CALLS`` transcendentals on float16."""
    param = next(p for p in sch.mod["main"].params if p.name == staging.name)
    slots = _register_slots(staging, mapping, param)
    if not staging.own or _registers_held(staging, mapping, param) + taken > _row_registers(sch) \
            or mapping.length_expr \
            or half_math_calls(sch, child_blocks(sch)) >= HALF_MATH_CALLS:
        return False
    dec.held.append(replace(staging, note=f"{slots} element(s) of the row per thread"))
    return True


HELD_AND_LOADS_REGISTERS = 48
"""Most registers the held elements of a row and the loads from shared memory beside them in
their readers' loops take in a thread (those loops index the held copy, so nvcc unrolls them
whole and issues every load first): three quarters of the 64 a thread of 1024 may use. Fuzz
12028:363, a ``where`` of a held row and of a boolean intermediate in shared memory, over rows
of 24000 on 1024 threads (24 held elements and 24 loads) keeps within 64 registers; over
26000, 16 B spilled on sm_80 in one order of its blocks, over 30000 52 B."""


def _reread_beside_shared_loads(sch: s_tir.Schedule, dec: Decisions,
                                mapping: ThreadMapping) -> None:
    """Re-read from global memory each held input of ``dec`` whose elements a thread holds,
    with the Regional intermediates one of its readers loads from shared memory at each of
    them, take more than ``HELD_AND_LOADS_REGISTERS`` registers under ``mapping``."""
    regional = {s.name for s in dec.regional}
    params = {p.name: p for p in sch.mod["main"].params}
    for held in list(dec.held):
        param = params[held.name]
        loads = max((len({r.source.name for r in sch.get(b).reads} & regional)
                     for b in readers(sch, param)), default=0)
        slots = _register_slots(held, mapping, param)
        registers = _registers_held(held, mapping, param)
        if loads and registers + slots * loads > HELD_AND_LOADS_REGISTERS:
            dec.held.remove(held)
            dec.global_reads.append(Buffer(held.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           "demoted: re-read from global memory"))
            dec.demotions.append(Demotion(DemotionKind.HELD_REREAD, held.name,
                                          before=registers, after=registers + slots * loads,
                                          budget=HELD_AND_LOADS_REGISTERS))


def held_registers(sch: s_tir.Schedule, dec: Decisions, mapping: ThreadMapping) -> int:
    """Registers the inputs ``dec`` holds take in each thread under ``mapping``."""
    params = {p.name: p for p in sch.mod["main"].params}
    return sum(_registers_held(h, mapping, params[h.name]) for h in dec.held)


def _registers_held(staging: Staging, mapping: ThreadMapping, param: tirx.Buffer) -> int:
    """Registers the elements of the input ``staging`` (``param``) each thread holds take."""
    return _register_slots(staging, mapping, param) * _element_registers(param)


def _register_slots(staging: Staging, mapping: ThreadMapping, param: tirx.Buffer) -> int:
    """Elements of its row each thread would hold of the input ``staging`` kept in registers:
    each of ``threads_per_row`` threads takes one element per step."""
    return -(-staging.per_row // bytes_of(param) // mapping.threads_per_row)
