"""Element-wise groups that walk rows: an input that runs of rows read alike (a bias) is
loaded into registers once per thread, not once per element.

A flat kernel gives each thread one vector of the output and reads the bias at every
element (from the L1 or L2 cache; the traffic counter counts it as read: bias + GELU on
(8192, 3072) moves 1.5x its compulsory bytes). Here the output is seen as rows of its last
axis: each thread owns the same ``vector`` columns of every row (``threads_per_row *
vector`` is the row, over one or more blocks side by side), a block's threads hold
``rows_per_block`` rows at a time and walk ``row_steps`` such groups in sequence (vertical
packing), as many as still fill a wave of blocks, so the bias is read once per thread for
all of them; with rows too few for two steps a block, the group stays flat.
Everything else a thread keeps is its own vector of a row, in registers: intermediates read
at several places, inputs read at several places, outputs also read inside the kernel.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from tvm import s_tir, tirx

from ...analysis.roofline import GPU
from ...plan import Buffer, BufferRole, Group, MappingKind, StorageLevel, ThreadMapping
from ..blocks import child_blocks, name_of, readers, written_params
from ..mapping import BLOCK_THREADS, divisors, row_steps, row_vector
from ..occupancy import cached_elements_cap
from ..rows import Unstitchable, block_rows, reads_own_element
from .chosen import WALK_CHOICES, check_applicable, chosen_vector
from .flat import HELD_LANES
from .rows import check_alignment, decide_inlining, decide_staging
from .state import Decisions, cap_text, launch_of, widest_element


def walk_rows(func: tirx.PrimFunc, sch: s_tir.Schedule) -> int:
    """The rows an element-wise group walks: its outputs' shape but the last axis; raises
    Unstitchable when the outputs differ in shape, have one axis or a symbolic one."""
    shapes = {tuple(p.shape) for p in written_params(func, sch)}
    if len(shapes) != 1:
        raise Unstitchable("outputs of different shapes: no common rows to walk")
    shape = list(shapes.pop())
    if len(shape) < 2 or not all(isinstance(d, tirx.IntImm) for d in shape):
        raise Unstitchable("outputs of one axis or of a symbolic shape: no rows to walk")
    return prod(int(d) for d in shape[:-1])


def decide_row_walk(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, rows: int,
                    reused: list[str], max_threads: int, gpu: GPU) -> Group:
    """Element-wise group over ``rows`` rows: Local or registers per block, inputs read alike
    by runs of rows kept in registers across the row steps; raises Unstitchable when no
    input is read so (a flat kernel serves as well) or a thread cannot own whole vectors of
    the row."""
    check_applicable(group.choices, WALK_CHOICES, "a row-walking")
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    if any(info.is_reduction for info in infos.values()):
        raise Unstitchable("a reduction: the rows are not element-wise")
    check_alignment(sch, infos, rows)
    dec = Decisions()
    decide_inlining(sch, func, infos, rows, dec)
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    decide_staging(sch, func, infos, rows, dec)
    if not dec.block_shared:
        raise Unstitchable("no input is read alike by runs of rows: nothing to keep across "
                           "row steps")
    for kept in dec.regional:
        _check_own(sch, infos, rows, sch.get(sch.get_sblock(kept.block)).writes[0].source)
    for other in [s for s in dec.staged if not s.own]:  # as a flat kernel reads it
        dec.staged.remove(other)
        dec.global_reads.append(Buffer(other.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       f"{other.note}, at other elements than the reader's: "
                                       "re-read (served by the cache)"))
    length = next(iter(infos.values())).elements
    vector = chosen_vector(row_vector(length, widest_element(sch, func)), group.choices)
    if (dec.regional or reused) and vector > HELD_LANES:  # as a flat kernel's (fuzz 2612:22)
        if group.choices.vector is not None:
            raise Unstitchable(f"vectors of {vector}: threads that keep intermediates in "
                               f"registers take at most {HELD_LANES} elements per access")
        vector = HELD_LANES
    accesses = length // vector
    per_row = max(d for d in divisors(accesses) if d <= min(BLOCK_THREADS, max_threads))
    packed = max(d for d in divisors(rows) if d * per_row <= BLOCK_THREADS)
    mapping = ThreadMapping(MappingKind.ROW_WALK, rows, length, packed, per_row, vector=vector)
    span = min(b.span for b in dec.block_shared)
    # an element-wise thread has one access in flight per row it walks: unlike a row group,
    # the walk keeps every block slot of the GPU busy (a whole wave)
    wave = launch_of(gpu, mapping.threads_per_block, 0).wave
    steps = group.choices.row_steps or row_steps(mapping, wave, span, whole_wave=True)
    if (rows // packed) % steps or span % (packed * steps):
        raise Unstitchable(f"{steps} row steps of {packed} rows do not divide runs of {span} "
                           f"rows")
    if steps == 1 and not group.choices.walk_rows:
        # each thread reads the bias for one row, as a flat kernel does, on fewer threads
        # when the rows are few: flat spreads them wider (bias + GELU at (32, 1024))
        raise Unstitchable("too few rows to walk more than one per block and still fill a "
                           "wave of blocks")
    mapping = replace(mapping, row_steps=steps)
    launch = launch_of(gpu, mapping.threads_per_block, 0, mapping.blocks)
    kept = len(dec.regional) + len(dec.staged) + len(dec.block_shared) + len(reused)
    if kept * vector > cached_elements_cap(launch):
        raise Unstitchable(f"each thread would keep {kept * vector} elements in registers, "
                           f"more than {cap_text(launch)}")
    buffers = [Buffer(n, BufferRole.OUTPUT, StorageLevel.REGISTER, 0,
                      "written out and read inside the kernel") for n in reused]
    buffers += [Buffer(s.name, s.role, StorageLevel.REGISTER, 0, s.note, s.block)
                for s in dec.regional + dec.staged]
    buffers += [Buffer(b.name, BufferRole.INPUT, StorageLevel.REGISTER, 0,
                       f"read alike by runs of {b.span} rows: once per thread for its "
                       f"{steps} row(s) in sequence", per_block=True)
                for b in dec.block_shared]
    return replace(group, mapping=mapping, inlined=tuple(dec.inlined),
                   buffers=tuple(buffers) + tuple(dec.global_reads), shared_bytes=0,
                   shared_budget=0, launch=launch)


def _check_own(sch: s_tir.Schedule, infos: dict, rows: int, buffer: tirx.Buffer) -> None:
    """Raise Unstitchable unless every reader of the intermediate ``buffer`` reads only the
    element it is at: a thread's registers hold no other thread's elements."""
    for block in readers(sch, buffer):
        info = infos[name_of(sch, block)]
        for region in sch.get(block).reads:
            if region.source.same_as(buffer) and not reads_own_element(info, region, rows):
                raise Unstitchable(f"{name_of(sch, block)} reads {buffer.name} at other "
                                   "elements of its row")
