"""Decide how a fused group becomes one kernel: Local vs Regional per block, staging, mapping,
shared-memory budget.

Works on the fused PrimFunc of a group (FuseTIR's output), block by block:

- an output that is also read inside the kernel gets a shared copy for its readers;
- a spatial block whose result is read once, at one position, by one block is inlined
  (Local: computed in registers by its consumer); so is a block producing one value per row;
- any other intermediate is Regional: kept in shared memory for the thread block's rows;
  a reduction result stays in registers: TVM's cross-thread reduction leaves it with every
  thread of the row (a warp shuffle, or its shared staging slot after a barrier), so no
  thread reads a copy another thread wrote without a barrier between them;
- an input read at several places inside the row is staged in shared memory (read from
  global memory once); inputs read from other rows or by data-dependent indices are not;
- an input that runs of consecutive rows read alike (a bias, a scale, the mask row of a
  batch) is staged once per thread block, and each block then walks several rows in
  sequence (vertical packing) so that it is read once per block rather than once per row;
- then the thread mapping, and the shared-memory budget: over it, inputs staged per row are
  demoted (largest first) to registers, each thread holding the elements of the row it
  reads (``REGISTER_ROW_ELEMENTS`` at most), else to re-reads from global memory; then
  inputs staged per block are demoted, then
  packed rows are halved, then Regional intermediates are recomputed (inlined) instead; if it
  still does not fit, the group falls back with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from math import prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.target import Target

from ..analysis.roofline import GPU
from ..lowering import LoweredFunc, lower
from ..plan import (
    Buffer,
    BufferRole,
    Demotion,
    DemotionKind,
    Group,
    Launch,
    MappingKind,
    Phase,
    PhaseKind,
    StorageLevel,
    ThreadMapping,
)
from ..symbolic import is_symbolic, shape_values, symbolic_extent
from ..target import MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK, WARP_SIZE
from .blocks import (
    LOCAL,
    SHARED,
    add_unit_loops,
    cache_reused_outputs,
    child_blocks,
    load_count,
    name_of,
    prepare,
    readers,
    split_sinks,
    written_params,
)
from .emit import kernel
from .mapping import (
    divisors,
    flat_mapping,
    row_mapping,
    row_steps,
    row_vector,
    with_rows_per_block,
)
from .occupancy import (
    aligned_shared,
    cached_elements_cap,
    device_of,
    kernel_shared_bytes,
    launch_config,
)
from .phases import (
    BlockRole,
    Roles,
    assign_roles,
    column_reductions,
    column_view,
    copy_across_barrier,
    crossings,
    normalise_column,
    register_sum,
)
from .row_permutation import permute_rows
from .rows import (
    BlockRows,
    RowAccess,
    Unstitchable,
    access_rows,
    block_rows,
    error_summary,
    permuted_row,
    reads_own_element,
    row_elements,
    rows_sharing,
)
from .task_split import combine_per_reader, split_output_copies, split_parts, split_rows
from .vectors import lanes_fit_booleans

logger = logging.getLogger(__name__)


@dataclass
class _Staging:
    """A buffer kept in shared memory and its bytes for one row."""

    name: str
    role: BufferRole
    per_row: int
    note: str = ""
    block: str = ""  # writer block (for intermediates that may be recomputed)
    own: bool = False  # (an input) every reader reads only the element it is at

    def bytes_for(self, rows_per_block: int) -> int:
        """Shared bytes for ``rows_per_block`` rows at a time."""
        return self.per_row * rows_per_block


@dataclass
class _BlockShared:
    """An input read alike by ``span`` consecutive rows: staged once per thread block."""

    name: str
    size: int  # bytes one block stages
    span: int


@dataclass
class _Decisions:
    inlined: list[str] = field(default_factory=list)
    regional: list[_Staging] = field(default_factory=list)
    results: list[_Staging] = field(default_factory=list)  # reduction results (registers)
    staged: list[_Staging] = field(default_factory=list)
    held: list[_Staging] = field(default_factory=list)  # inputs held in registers
    block_shared: list[_BlockShared] = field(default_factory=list)
    global_reads: list[Buffer] = field(default_factory=list)
    demotions: list[Demotion] = field(default_factory=list)
    reductions: int = 0


def target_budget(target: Target | None) -> tuple[int, int]:
    """Shared-memory bytes and threads one block may use on ``target``."""
    if target is None:
        return MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK
    attrs = target.attrs
    smem = int(attrs.get("max_shared_memory_per_block", MAX_SHARED_MEMORY_PER_BLOCK))
    threads = int(attrs.get("max_num_threads", attrs.get("max_threads_per_block",
                                                          MAX_THREADS_PER_BLOCK)))
    return smem, threads


@dataclass(frozen=True)
class Decided:
    """A group with its kernel decisions, and its kernel lowered for the target (None when
    decided without one)."""

    group: Group
    lowered: LoweredFunc | None


def decide(func: tirx.PrimFunc, group: Group, rows: int | None,
           target: Target | None = None) -> Decided:
    """``group`` completed with its kernel decisions for ``func``; raises Unstitchable.

    The decisions are checked by scheduling ``func`` with them once (``kernel``) and, given a
    target, building it; the launch configuration is settled against the shared memory the
    built kernel really declares.
    """
    budget, max_threads = target_budget(target)
    gpu = device_of(target)
    fused, func = func, prepare(func)
    if rows is not None:
        func, moves = permute_rows(func)
        group = replace(group, permuted_copies=moves.copies, permuted_outputs=moves.outputs)
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    _check_flat_structure(sch)
    if rows is None:
        reused = cache_reused_outputs(sch, func, LOCAL)
        done = _decide_flat(sch, func, group, reused, max_threads, gpu)
    elif column_reductions(sch, rows):
        done = _decide_global(sch, func, group, rows, budget, max_threads, gpu)
    else:
        split = _decide_split(func, group, rows, budget, max_threads, gpu)
        if split is not None:
            try:
                return _built(fused, split, target, gpu)
            except (Unstitchable, ValueError) as err:  # a block per row instead
                logger.debug("task splitting of %s does not build: %s", group.ops,
                             error_summary(err))
        reused = cache_reused_outputs(sch, func, SHARED)
        done = _decide_rows(sch, func, group, rows, reused, budget, max_threads, gpu)
    return _built(fused, done, target, gpu)


def _built(fused: tirx.PrimFunc, done: Group, target: Target | None, gpu: GPU) -> Decided:
    """``done`` checked by scheduling ``fused`` with it and, given a target, building it, its
    launch settled against the shared memory the built kernel declares."""
    scheduled = _schedule(fused, done)  # emission prepares (and permutes) as decide does
    if target is None:
        return Decided(done, None)
    lowered = _lower(scheduled, done, target)
    settled = _settle_launch(done, lowered, gpu)
    if settled is not done:
        lowered = _lower(_schedule(fused, settled), settled, target)
    return Decided(settled, lowered)


def _schedule(func: tirx.PrimFunc, group: Group) -> tirx.PrimFunc:
    try:
        return kernel(func, group).func
    except Unstitchable:
        raise
    except Exception as err:  # noqa: BLE001 - any schedule error means: fall back
        raise Unstitchable(f"scheduling failed: {error_summary(err)}") from err


def _lower(scheduled: tirx.PrimFunc, group: Group, target: Target) -> LoweredFunc:
    try:
        return lower(scheduled, group.function or "stitched", target)
    except Exception as err:  # noqa: BLE001 - the kernel must build, or fall back
        raise Unstitchable(f"lowering failed: {error_summary(err)}") from err


def _settle_launch(group: Group, lowered: LoweredFunc, gpu: GPU) -> Group:
    """``group`` with its launch configuration recomputed from the shared memory its built
    kernel declares, when that differs from the plan's estimate; a persistent grid shrinks
    to the new wave if it must (its phases loop over more tasks per block)."""
    launch = group.launch
    declared = max((kernel_shared_bytes(lowered.kernel(k.kernel)) for k in lowered.launches),
                   default=0)
    if launch is None or declared == launch.shared_bytes:
        return group
    settled = _launch(gpu, launch.threads, declared, launch.grid)
    if group.phases:
        settled = replace(settled, grid=min(launch.grid, settled.wave))
    return replace(group, launch=settled)


def _check_flat_structure(sch: s_tir.Schedule) -> None:
    for block in child_blocks(sch):
        if sch.get_child_blocks(block):
            raise Unstitchable(f"block {name_of(sch, block)} has nested blocks")
        if len(sch.get_loops(block)) != len(sch.get(block).iter_vars):
            raise Unstitchable(f"block {name_of(sch, block)} is not in normal form")


def _decide_flat(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, reused: list[str],
                 max_threads: int, gpu: GPU) -> Group:
    """Element-wise group: each thread owns one element. A producer read once is inlined; one
    read more often is computed once into a register of the thread, if every reader reads the
    thread's own element (else it is recomputed); inputs read at several places likewise."""
    outputs = written_params(func, sch)
    sizes = {_elements(p) for p in outputs}
    if len(sizes) != 1:
        raise Unstitchable(f"outputs of different sizes {sorted(sizes)}")
    size = sizes.pop()
    size_expr = symbolic_extent(list(outputs[0].shape)) if is_symbolic(size) else ""
    inlined: list[str] = []
    kept: list[Buffer] = []
    for block in reversed(child_blocks(sch)):
        if _writes_param(sch, func, block):
            continue
        name = name_of(sch, block)
        buffer = sch.get(block).writes[0].source
        users = readers(sch, buffer, exclude=block)
        sites = sum(load_count(sch, u, buffer) for u in users)
        if (len(users) > 1 or sites > 1) and _element_aligned(sch, [block, *users], buffer, size):
            note = f"read by {len(users)} block(s) at {sites} place(s)"
            kept.append(Buffer(buffer.name, BufferRole.INTERMEDIATE, StorageLevel.REGISTER, 0, note,
                               name))
            continue
        try:
            sch.compute_inline(block)
        except Exception as err:  # noqa: BLE001
            raise Unstitchable(f"element-wise block {name} cannot be inlined: "
                               f"{error_summary(err)}") from err
        inlined.append(name)
    staged = []
    written = {p.name for p in written_params(func, sch)}
    for param in func.params:
        if param.name in written:
            continue
        users = readers(sch, param)
        sites = sum(load_count(sch, u, param) for u in users)
        if sites > 1 and _element_aligned(sch, users, param, size):
            staged.append(Buffer(param.name, BufferRole.INPUT, StorageLevel.REGISTER, 0,
                                 f"read at {sites} places"))
    buffers = tuple(Buffer(n, BufferRole.OUTPUT, StorageLevel.REGISTER, 0,
                           "written out and read inside the kernel") for n in reused)
    mapping = replace(flat_mapping(size, max_threads, _widest_element(sch, func), gpu),
                      rows_expr=size_expr)
    regions = [r for b in child_blocks(sch) for r in (*sch.get(b).reads, *sch.get(b).writes)]
    if (kept or staged or reused) and any(_reshaped(r) or _splits_vectors(r, mapping.vector)
                                          for r in regions):
        # a register copy of a reshaped access, or of a vector that runs over the end of the
        # innermost axis (fuzz graph 4242:320, (4, 256, 14, 14) in vectors of 4: wrong
        # numbers), would be a bounding box around the vector
        mapping = replace(mapping, vector=1)
    sinks, _ = split_sinks(sch)
    scalar = tuple(name_of(sch, b) for b in sinks
                   if not lanes_fit_booleans(sch.get(b), mapping.vector))
    return replace(group, mapping=mapping, inlined=tuple(inlined),
                   buffers=buffers + tuple(kept) + tuple(staged), shared_bytes=0,
                   shared_budget=0, scalar_blocks=scalar,
                   launch=_launch(gpu, mapping.threads_per_block, 0, _grid(mapping)))


def _element_aligned(sch: s_tir.Schedule, blocks: list, buffer: tirx.Buffer, size: int
                     ) -> bool:
    """Whether every access of ``blocks`` to ``buffer`` touches the element the block is at,
    counting elements of the ``size``-element iteration space in row-major order, without
    wrapping around it: an index such as ``i % size`` is the element itself for every real
    element, but a thread past the last one (a partial block) would stage the range between
    its wrapped and unwrapped index in its registers."""
    for block in blocks:
        try:
            info = block_rows(sch, block, size)
        except Unstitchable:
            return False
        stmt = sch.get(block)
        for region in (*stmt.reads, *stmt.writes):
            if not region.source.same_as(buffer):
                continue
            if access_rows(info, region, size) is not RowAccess.ALIGNED \
                    or _wraps_around(region):
                return False
    return True


def _splits_vectors(region: tvm.ir.TensorRegion, vector: int) -> bool:
    """Whether vectors of ``vector`` consecutive elements of ``region``'s buffer may run over
    the end of its innermost axis (its extent is not a multiple of the width)."""
    shape = list(region.source.shape)
    if vector == 1 or not shape:
        return False
    last = shape[-1]
    return not isinstance(last, tirx.IntImm) or int(last) % vector != 0


def _wraps_around(region: tvm.ir.TensorRegion) -> bool:
    """Whether the region's indices wrap around (``i % n``)."""
    found: list[tvm.ir.PrimExpr] = []
    for r in region.region:
        tvm_ffi.structural_walk(r.min, [((tirx.FloorMod, tirx.Mod), found.append)])
    return bool(found)


def _reshaped(region: tvm.ir.TensorRegion) -> bool:
    """Whether the region's indices divide or wrap the iteration space (a reshape)."""
    found: list[tvm.ir.PrimExpr] = []
    kinds = (tirx.FloorMod, tirx.Mod, tirx.FloorDiv, tirx.Div)
    for r in region.region:
        tvm_ffi.structural_walk(r.min, [(kinds, found.append)])
    return bool(found)


def _writes_param(sch: s_tir.Schedule, func: tirx.PrimFunc, block) -> bool:
    return any(any(p.same_as(w.source) for p in func.params) for w in sch.get(block).writes)


def _decide_rows(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, rows: int,
                 reused: list[str], budget: int, max_threads: int, gpu: GPU) -> Group:
    """Row group: every block walks the ``rows`` rows first (checked), then its elements."""
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    _check_alignment(sch, infos, rows, permuted=group.permuted_outputs)
    dec = _Decisions()
    _decide_inlining(sch, func, infos, rows, dec)
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    _decide_staging(sch, func, infos, rows, dec)
    dec.reductions = sum(1 for info in infos.values() if info.is_reduction)
    length = max(info.elements for info in infos.values())
    vector = row_vector(length, _widest_element(sch, func))
    if is_symbolic(rows):  # packed rows: the last block's rows past the end are guarded
        rows_expr = symbolic_extent([i.size for i in next(iter(infos.values())).row_iters])
        mapping = replace(row_mapping(rows, length, None, max_threads, gpu, vector),
                          rows_expr=rows_expr)
    else:
        mapping = row_mapping(rows, length, rows, max_threads, gpu, vector)
    mapping = _fit_budget(sch, dec, mapping, budget)
    mapping = _pack_vertically(dec, mapping, gpu)
    if not dec.held:  # a vector would give a thread other elements than its registers hold
        mapping = replace(mapping, vector=vector)
    shared = _shared_bytes(dec, mapping)
    launch = _launch(gpu, mapping.threads_per_block, shared, _grid(mapping))
    reread, per_row = _register_cache(sch, func, dec, mapping, infos)
    if per_row > cached_elements_cap(launch):
        raise Unstitchable(f"each thread would keep {per_row} elements of the inputs it "
                           f"re-reads ({', '.join(reread)}) in registers, more than "
                           f"{_cap_text(launch)}: rows of {length} need more threads than "
                           "a block has")
    return replace(group, mapping=mapping, inlined=tuple(dec.inlined),
                   buffers=_buffers(dec, mapping, reused),
                   shared_bytes=shared, shared_budget=budget,
                   demotions=tuple(dec.demotions), launch=launch)


SPLIT_THREADS = 512
"""Threads per block of a split row group: each part of a row gets at least that many
elements."""

SPLIT_MIN_LENGTH = 2048
"""Rows shorter than this are never split (a block per row is then short work anyway)."""


def _decide_split(func: tirx.PrimFunc, group: Group, rows: int, budget: int,
                  max_threads: int, gpu: GPU) -> Group | None:
    """Task splitting: a row group with fewer rows than the GPU has SMs, and long rows, split
    each row over several blocks (``task_split``) and stitched Globally over the sub-rows;
    None when the rows should not or cannot be split (a block per row then)."""
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    length = max(block_rows(sch, b, rows).elements for b in child_blocks(sch))
    threads = min(SPLIT_THREADS, max_threads)
    if rows >= gpu.sms or length < SPLIT_MIN_LENGTH:
        return None
    parts = split_parts(rows, length, _launch(gpu, threads, 0).wave, threads)
    if parts == 1:
        return None
    try:
        split_rows(sch, func, rows, parts)
        done = _decide_global(sch, func, group, rows * parts, budget, max_threads, gpu,
                              threads=threads, split=parts)
    except Exception as err:  # noqa: BLE001 - cannot split: a block per row instead
        logger.debug("no task splitting for %s: %s", group.ops, error_summary(err))
        return None
    return replace(done, row_split=parts)


def _decide_global(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, rows: int,
                   budget: int, max_threads: int, gpu: GPU, threads: int | None = None,
                   split: int = 1) -> Group:
    """Group with column reductions (Global stitching): row phases and column phases
    (``phases``) on a persistent grid of at most one wave, one row per block at a time.

    Row blocks are decided as in a Regional group, each column reduction keeps a partial sum
    per row tile in shared memory (``accumulator``) that it writes out (``partial``), and the
    next column phase combines them; when the partial sums of all column reductions would
    take more than a quarter of the shared budget, each thread keeps its columns' sums in
    registers instead (``_partial_sums_in_registers``). A row intermediate read in a later
    phase is recomputed there (inlined): nothing but global memory survives a grid barrier.
    ``threads`` fixes the block size (else the row mapping's). Row blocks must stay in their
    rows, except in rows split into ``split`` sub-rows (task splitting), which write their
    row's elements by design.
    """
    if is_symbolic(rows):
        raise Unstitchable("symbolic row count: Global stitching needs a persistent grid "
                           "capped at one wave, and the rows per block that needs are only "
                           "known at run time")
    for name in column_reductions(sch, rows):
        normalise_column(sch, sch.get_sblock(name))
    roles = assign_roles(sch, rows)
    reused = cache_reused_outputs(sch, func, SHARED, writers=set(roles.of_kind(BlockRole.ROW)))
    if split > 1:
        split_output_copies(sch, reused, rows // split, split)
    roles = assign_roles(sch, rows)
    dec = _Decisions()
    _decide_inlining(sch, func, _row_infos(sch, rows, roles), rows, dec)
    _inline_column_space(sch, func, assign_roles(sch, rows), dec)
    roles = _inline_crossings(sch, rows, dec)
    sch = combine_per_reader(sch, func)
    roles = assign_roles(sch, rows)
    infos = _row_infos(sch, rows, roles)
    if split == 1:
        _check_alignment(sch, infos, rows, among_rows=True)
    columns = {name: column_view(sch, sch.get_sblock(name)) for name in roles.columns}
    _decide_staging(sch, func, {**infos, **columns}, rows, dec, roles.levels)
    dec.reductions = sum(1 for info in infos.values() if info.is_reduction)
    length = max([i.elements for i in infos.values()] + list(roles.columns.values()))
    per_row = threads or row_mapping(rows, length, 1, max_threads, gpu).threads_per_row
    mapping = ThreadMapping(MappingKind.BLOCK_PER_ROW, rows, length, 1,
                            max(per_row, WARP_SIZE))
    _keep_partials_global(sch, roles, dec)
    accumulators = {name: roles.columns[name] * _bytes(sch.get(sch.get_sblock(name)).writes[0]
                                                        .source)
                    for name in roles.columns}
    needed = sum(accumulators.values())
    in_registers: dict[str, int] = {}  # column reduction -> partial sums per thread
    if budget - needed < budget * 3 // 4:
        in_registers = _partial_sums_in_registers(roles, mapping)
        dec.demotions.append(Demotion(DemotionKind.PARTIAL_SUMS_IN_REGISTERS,
                                      after=sum(in_registers.values()), used=needed,
                                      budget=budget))
        accumulators = {}
    mapping = _fit_budget(sch, dec, mapping, budget - sum(accumulators.values()))
    vector = row_vector(length, _widest_element(sch, func))
    # As in a row group (a vector would not follow held registers), and only when every
    # thread gets a whole vector: the block's threads are sized for scalar accesses, and
    # fewer threads on more elements each keep more in registers (fuzz case g469 spilled).
    if not dec.held and length >= mapping.threads_per_row * vector:
        mapping = replace(mapping, vector=vector)
    roles = assign_roles(sch, rows)
    # An input staged once per block covers the block's whole rows, not a tile of its columns
    # (tiling columns then read the staged copy at the wrong columns).
    # Nor do registers, which hold a thread's columns of every row of its tile.
    options = [] if dec.block_shared or in_registers \
        else _column_tile_options(roles, mapping.threads_per_block)
    most = max(options, default=1)
    accumulators = {name: size // most + (mapping.threads_per_block * _bytes(
        sch.get(sch.get_sblock(name)).writes[0].source) if most > 1 else 0)
        for name, size in accumulators.items()}
    staged = _phase_inputs(sch, roles, rows, budget - _shared_bytes(dec, mapping)
                           - sum(accumulators.values()))
    shared = _shared_bytes(dec, mapping) + sum(accumulators.values()) \
        + sum(b.shared_bytes for b in staged)
    launch = _launch(gpu, mapping.threads_per_block, shared)
    tiles, column_tiles = _tiles(options, roles, rows, mapping.threads_per_block, launch.wave,
                                 rows * length)
    reread, per_row = _register_cache(sch, func, dec, mapping, infos)
    sums = sum(in_registers.values())  # held for the whole tile, as the row walk's elements
    cap = cached_elements_cap(launch)
    if sums + per_row > cap:
        if sums:
            raise Unstitchable(f"partial sums of the column reductions need {needed} B of "
                               f"shared memory per block, more than a quarter of {budget} B, "
                               f"and in registers {sums} per thread, which with the "
                               f"{per_row} elements of the inputs it re-reads per row are "
                               f"more than {_cap_text(launch)}: needs tiles of columns")
        raise Unstitchable(f"each thread would keep {per_row} elements of the inputs it "
                           f"re-reads ({', '.join(reread)}) in registers per row, more than "
                           f"{_cap_text(launch)}")
    if rows // tiles * per_row + sums > cap:
        held = f"{', '.join(reread)}: {rows // tiles * per_row} elements"
        held += f", and {sums} partial sums" if sums else ""
        capped = _fewest_tiles(rows, (cap - sums) // per_row)
        if capped <= launch.wave:
            dec.demotions.append(Demotion(
                DemotionKind.FEWER_ROW_TILES, before=tiles, after=capped,
                detail=f"a tile of {rows // tiles} rows would keep the inputs each thread "
                       f"re-reads ({held}) in registers, more than {_cap_text(launch)}"))
            tiles, column_tiles = capped, 1
        else:
            # Tiles of many rows: nvcc unrolls a short row walk (and then holds every row's
            # elements), not a long one, which reloads; checked by ptxas in the tests
            # (tests/stitch/test_targets.py, test_register_cache.py).
            dec.demotions.append(Demotion(
                DemotionKind.ROW_TILES_KEPT, before=tiles, after=capped,
                detail=f"tiles within the register cap ({held} > {_cap_text(launch)}) would "
                       f"take {capped} tiles, more than one wave of {launch.wave} blocks"))
    mapping = replace(mapping, row_steps=rows // tiles)
    for b in list(dec.block_shared):
        if b.span % mapping.row_steps:
            dec.block_shared.remove(b)
            dec.global_reads.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"shared by runs of {b.span} rows, not by the "
                                           f"{mapping.row_steps} rows of a tile"))
    phases = _phases(roles, tiles, mapping.threads_per_block, column_tiles)
    grid = min(launch.wave, max(p.tasks for p in phases))
    partials = tuple(
        Buffer(name, BufferRole.PARTIAL, StorageLevel.GLOBAL, 0,
               f"{tiles} x {roles.columns[name]} partial sums, combined in the next phase",
               name) for name in roles.columns)
    accumulated = tuple(
        Buffer(name, BufferRole.ACCUMULATOR, StorageLevel.REGISTER, 0,
               f"partial sum of the block's row tile, {in_registers[name]} column(s) per "
               "thread", name, registers=in_registers[name]) if name in in_registers
        else Buffer(name, BufferRole.ACCUMULATOR, StorageLevel.SHARED, accumulators[name],
                    "partial sum of the block's row tile", name)
        for name in (*accumulators, *in_registers))
    return replace(group, mapping=mapping, inlined=tuple(dec.inlined),
                   buffers=_buffers(dec, mapping, reused) + accumulated + partials + staged
                   + _column_sums(sch, phases, mapping.threads_per_block),
                   shared_bytes=shared, shared_budget=budget,
                   demotions=tuple(dec.demotions), launch=replace(launch, grid=grid),
                   phases=phases)


def _column_sums(sch: s_tir.Schedule, phases: tuple[Phase, ...], threads: int
                 ) -> tuple[Buffer, ...]:
    """Where each column phase sums the partials it combines (a thread per column): in a
    register stored once where ``phases.register_sum`` allows it, else in place in global
    memory."""
    sums = []
    for phase in phases:
        if phase.kind is not PhaseKind.COLUMNS:
            continue
        for name in phase.combines:
            result = sch.get(sch.get_sblock(name)).writes[0].source
            if register_sum(result, threads):
                sums.append(Buffer(result.name, BufferRole.SUM, StorageLevel.REGISTER, 0,
                                   "summed in a register, stored once", name))
            else:
                sums.append(Buffer(result.name, BufferRole.SUM, StorageLevel.GLOBAL, 0,
                                   "summed in place: not one axis of whole threads of "
                                   f"{threads}", name))
    return tuple(sums)


def _partial_sums_in_registers(roles: Roles, mapping: ThreadMapping) -> dict[str, int]:
    """Partial sums per thread of each column reduction kept in registers: a row phase maps
    column ``c`` of every row of its tile to thread ``c % P`` of its ``P`` threads
    (``emit._thread_loop``), so a thread sums the same ``ceil(width / P)`` columns over the
    whole tile and no other thread touches them: registers, and no shared memory."""
    threads = mapping.threads_per_row
    return {name: -(-width // threads) for name, width in roles.columns.items()}


def _phase_inputs(sch: s_tir.Schedule, roles: Roles, rows: int, room: int
                  ) -> tuple[Buffer, ...]:
    """Results of column phases that a later row phase reads, staged in shared memory for
    that phase's readers: once per block when no reader's index depends on the row (a mean
    per column), else once per row when it is one value per row (a split row's maximum);
    within ``room`` bytes."""
    found: list[Buffer] = []
    for name, kind in roles.kinds.items():
        if kind not in (BlockRole.COLUMN, BlockRole.COLUMN_SPACE, BlockRole.COMBINE):
            continue
        block = sch.get_sblock(name)
        buffer = sch.get(block).writes[0].source
        by_level: dict[int, list[str]] = {}
        for user in readers(sch, buffer, exclude=block, affine=True):
            user_name = name_of(sch, user)
            if roles.kinds[user_name] in (BlockRole.ROW, BlockRole.COLUMN) \
                    and roles.levels[user_name] > roles.levels[name]:
                by_level.setdefault(roles.levels[user_name], []).append(user_name)
        size = prod(int(d) for d in buffer.shape) * _bytes(buffer)
        for users in by_level.values():
            per_block = all(_row_independent(sch, u, buffer, rows, roles) for u in users)
            staged = size if per_block else _bytes(buffer)
            if staged > room or (not per_block and size > rows * _bytes(buffer)):
                continue
            room -= staged
            note = ("read alike by every row: once per block" if per_block
                    else "one value per row: once per row")
            found.append(Buffer(buffer.name, BufferRole.PHASE_INPUT, StorageLevel.SHARED, staged,
                                note, users[0], per_block))
    return tuple(found)


def _row_independent(sch: s_tir.Schedule, name: str, buffer: tirx.Buffer, rows: int,
                     roles: Roles) -> bool:
    """Whether block ``name`` reads ``buffer`` at places that do not depend on its row."""
    block = sch.get_sblock(name)
    info = column_view(sch, block) if roles.kinds[name] is BlockRole.COLUMN \
        else block_rows(sch, block, rows)
    return all(rows_sharing(info, r) == rows for r in sch.get(block).reads
               if r.source.same_as(buffer))


def _launch(gpu: GPU, threads: int, shared_bytes: int, grid: int = 0) -> Launch:
    try:
        return launch_config(gpu, threads, shared_bytes, grid)
    except ValueError as err:
        raise Unstitchable(str(err)) from err


def _keep_partials_global(sch: s_tir.Schedule, roles: Roles, dec: _Decisions) -> None:
    """Reduction results that a later phase combines (split rows) stay in global memory."""
    combines = set(roles.of_kind(BlockRole.COMBINE))
    for result in list(dec.results):
        block = sch.get_sblock(result.block)
        buffer = sch.get(block).writes[0].source
        if any(name_of(sch, r) in combines for r in readers(sch, buffer, exclude=block)):
            dec.results.remove(result)


def _row_infos(sch: s_tir.Schedule, rows: int, roles: Roles) -> dict[str, BlockRows]:
    return {name: block_rows(sch, sch.get_sblock(name), rows)
            for name in roles.of_kind(BlockRole.ROW)}


def _inline_column_space(sch: s_tir.Schedule, func: tirx.PrimFunc, roles: Roles,
                         dec: _Decisions) -> None:
    """A column-space block read once, by one column-space block, is computed by it."""
    for name in reversed(roles.of_kind(BlockRole.COLUMN_SPACE)):
        block = sch.get_sblock(name)
        if _writes_param(sch, func, block):
            continue
        buffer = sch.get(block).writes[0].source
        users = readers(sch, buffer, exclude=block)
        if len(users) == 1 and load_count(sch, users[0], buffer) == 1 \
                and roles.kinds[name_of(sch, users[0])] is BlockRole.COLUMN_SPACE:
            sch.compute_inline(block)
            dec.inlined.append(name)


def _inline_crossings(sch: s_tir.Schedule, rows: int, dec: _Decisions) -> Roles:
    """Recompute every row intermediate read in a later phase where it is read; returns the
    roles that result. A row reduction's result cannot be recomputed element by element: it
    is copied to global memory for the later readers (``copy_across_barrier``; a mean of
    every row that a softmax over the rows reads, fuzz graph 4242:150)."""
    kept: list[str] = []
    while True:
        roles = assign_roles(sch, rows)
        found = [(p, c) for p, c in crossings(sch, roles) if p not in kept]
        if not found:
            break
        producer, consumer = found[0]
        if sch.get(sch.get_sblock(producer)).init is not None:
            kept.append(producer)
            continue
        try:
            sch.compute_inline(sch.get_sblock(producer))
        except Exception as err:  # noqa: BLE001
            raise Unstitchable(f"{producer} is read by {consumer} after a grid barrier and "
                               f"cannot be recomputed: {error_summary(err)}") from err
        dec.regional = [r for r in dec.regional if r.block != producer]
        dec.inlined.append(producer)
    for producer in kept:
        roles = assign_roles(sch, rows)  # with the copies made so far
        later = {c for p, c in crossings(sch, roles) if p == producer}
        buffer = sch.get(sch.get_sblock(producer)).writes[0].source
        copy = copy_across_barrier(sch, producer, later)
        dec.global_reads.append(Buffer(buffer.name, BufferRole.CROSSING, StorageLevel.GLOBAL, 0,
                                       f"reduction result copied out ({copy}) for "
                                       f"{', '.join(sorted(later))} after a grid barrier",
                                       producer))
    return assign_roles(sch, rows)


MIN_TILE_ROWS = 8
"""Rows of a row tile at least, when the rows allow, in a group with column reductions: each
tile writes one row of partial sums and the next phase reads it back, so this keeps that
traffic under a quarter of the input's."""


SMALL_GLOBAL_ELEMENTS = 1 << 16
"""A Global group's row phases over at most this many elements may run on few row tiles
(as few as one, when no divisor of a prime row count fits the wave): the work is too small
for the parallelism to matter, and one kernel still replaces TVM's several."""


def _row_tiles(rows: int, wave: int, partial_sums: bool, elements: int) -> int:
    """Row tiles of a persistent grid: the most that divide the rows and fit one wave (with
    ``partial_sums``, also no more than a tile per ``MIN_TILE_ROWS`` rows). Fewer than an
    eighth of that is refused unless the row phases walk at most ``SMALL_GLOBAL_ELEMENTS``
    ``elements``."""
    most = min(wave, max(1, rows // MIN_TILE_ROWS)) if partial_sums else wave
    tiles = max(d for d in divisors(rows) if d <= most)
    if tiles * 8 < min(rows, most) and elements > SMALL_GLOBAL_ELEMENTS:
        raise Unstitchable(f"{rows} rows do not split into about one wave of {most} tiles "
                           f"(at most {tiles})")
    return tiles


def _fewest_tiles(rows: int, max_steps: int) -> int:
    """The fewest row tiles (a divisor of ``rows``) of at most ``max_steps`` rows each."""
    return min(d for d in divisors(rows) if rows // d <= max(max_steps, 1))


def _register_cache(sch: s_tir.Schedule, func: tirx.PrimFunc, dec: _Decisions,
                    mapping: ThreadMapping, infos: dict[str, BlockRows]
                    ) -> tuple[list[str], int]:
    """The inputs that several blocks read from global memory, and how many of their
    elements one thread then keeps in registers per row of its block: nvcc fully unrolls a
    thread's loops over its elements and holds an input it reads again from the first read
    to the last (``occupancy.REGISTERS_PER_CACHED_ELEMENT``). An input that a row block
    (``infos``) reads out of the row's order (through a transpose) counts twice: each of its
    elements also keeps an address of its own (fuzz case g1337 spilled at the cap)."""
    on_chip = {s.name for s in dec.staged} | {b.name for b in dec.block_shared}
    written = {p.name for p in written_params(func, sch)}
    reread = [p for p in func.params
              if p.name not in on_chip | written and len(readers(sch, p)) > 1]
    vector = mapping.vector  # a thread's accesses are vectors of this many elements
    per_thread = -(-mapping.row_length // (mapping.threads_per_row * vector)) * vector
    doubled = {p.name for p in reread if _read_out_of_order(sch, p, infos, mapping.rows)}
    return ([p.name + (" read out of order, counted twice" if p.name in doubled else "")
             for p in reread], per_thread * (len(reread) + len(doubled)))


def _read_out_of_order(sch: s_tir.Schedule, param: tirx.Buffer, infos: dict[str, BlockRows],
                       rows: int) -> bool:
    for block in readers(sch, param):
        info = infos.get(name_of(sch, block))
        if info is None:
            continue
        for region in sch.get(block).reads:
            if region.source.same_as(param) \
                    and access_rows(info, region, rows) is RowAccess.ALIGNED \
                    and row_elements(param, rows) == info.elements \
                    and not reads_own_element(info, region, rows):
                return True
    return False


def _cap_text(launch: Launch) -> str:
    return (f"{cached_elements_cap(launch)} (half of the {launch.max_registers} registers a "
            f"thread of {launch.threads} may use)")


def _column_tile_options(roles: Roles, threads: int) -> list[int]:
    """Column tiles per row tile, best first, when the row phases only accumulate column
    reductions (no block needs whole rows) of one width: a task then takes a tile of its row
    tile's columns rather than all of them, so that fewer, longer row tiles fill the GPU and
    fewer rows of partial sums go through global memory. Warp-wide tiles (one reduction: the
    block's warps take parts of the tile's rows, lanes, and add up their sums in shared
    memory), or a column per thread."""
    widths = set(roles.columns.values())
    if roles.of_kind(BlockRole.ROW) or len(widths) != 1:
        return []
    width = widths.pop()
    options = []
    if len(roles.columns) == 1 and threads % WARP_SIZE == 0 and width % WARP_SIZE == 0 \
            and width > WARP_SIZE:
        options.append(width // WARP_SIZE)
    if width % threads == 0 and width > threads:
        options.append(width // threads)
    return options


def _tiles(options: list[int], roles: Roles, rows: int, threads: int, wave: int,
           elements: int) -> tuple[int, int]:
    """Row tiles and column tiles per row tile of the row phases: the first of ``options``
    (``_column_tile_options``) whose lanes (threads per tile column) divide the rows of a row
    tile, with as many row tiles as then fit ``wave`` tasks; else no column tiles."""
    partial_sums = bool(roles.columns)
    for column_tiles in options:
        if column_tiles > wave:  # not even one row tile's column tiles fit the wave
            continue
        tiles = _row_tiles(rows, wave // column_tiles, partial_sums, elements)
        width = next(iter(roles.columns.values())) // column_tiles
        if (rows // tiles) % (threads // width) == 0:
            return tiles, column_tiles
    return _row_tiles(rows, wave, partial_sums, elements), 1


def _phases(roles: Roles, tiles: int, threads: int, column_tiles: int = 1
            ) -> tuple[Phase, ...]:
    """Row phases (``tiles`` tasks, times ``column_tiles``) and column phases (a task per
    ``threads`` columns), by level; a column reduction is in the row phase of its partial
    sums and in the next column phase, which combines them; a combine block of a row phase
    is among its ``combines``."""
    levels: dict[int, list[str]] = {}
    for name, kind in roles.kinds.items():
        level = roles.levels[name]
        levels.setdefault(level, []).append(name)
        if kind is BlockRole.COLUMN:
            levels.setdefault(level + 1, []).append(name)
    phases = []
    for level in sorted(levels):
        names = tuple(levels[level])
        if level % 2 == 0:
            partials = tuple(n for n in names if roles.kinds[n] is BlockRole.COLUMN)
            combines = tuple(n for n in names if roles.kinds[n] is BlockRole.COMBINE)
            phases.append(Phase(PhaseKind.ROWS, names, tiles * column_tiles, partials=partials,
                                combines=combines, column_tiles=column_tiles))
        else:
            width = max(roles.widths[n] for n in names)
            combines = tuple(n for n in names if n in roles.combines)
            phases.append(Phase(PhaseKind.COLUMNS, names, -(-width // threads), combines=combines))
    return tuple(phases)


def _check_alignment(sch: s_tir.Schedule, infos: dict[str, BlockRows], rows: int,
                     among_rows: bool = False, permuted: tuple[str, ...] = ()) -> None:
    """Every write, and every read of a buffer the kernel produces, must stay in the row;
    with ``among_rows`` (a Global group), only reads of what the row blocks of ``infos``
    produce: the results of column phases and of combinations are read across rows by
    design. The outputs ``permuted`` may be written a whole row elsewhere
    (``row_permutation``), and are then read by no block. Only the blocks of ``infos`` are
    checked."""
    blocks = child_blocks(sch)
    produced = {w.source.name for b in blocks
                if not among_rows or name_of(sch, b) in infos for w in sch.get(b).writes}
    for block in blocks:
        info = infos.get(name_of(sch, block))
        if info is None:  # not a row block (a column reduction of a Global group)
            continue
        stmt = sch.get(block)
        for region in stmt.writes:
            if region.source.name in permuted and permuted_row(info, region, rows):
                continue
            if access_rows(info, region, rows) is not RowAccess.ALIGNED:
                raise Unstitchable(f"block {info.name} writes {region.source.name} outside "
                                   "its row")
        for region in stmt.reads:
            if region.source.name in permuted:
                raise Unstitchable(f"block {info.name} reads {region.source.name}, written at "
                                   "permuted rows")
            if region.source.name in produced \
                    and access_rows(info, region, rows) is not RowAccess.ALIGNED:
                raise Unstitchable(f"block {info.name} reads {region.source.name} from other "
                                   "rows")


def _decide_inlining(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                     rows: int, dec: _Decisions) -> None:
    """Local (inline) or Regional (shared) for every block that writes an intermediate."""
    for block in reversed(child_blocks(sch)):
        name = name_of(sch, block)
        info = infos.get(name)
        if info is None or _writes_param(sch, func, block):
            continue
        buffer = sch.get(block).writes[0].source
        if info.is_reduction:
            dec.results.append(_Staging(buffer.name, BufferRole.INTERMEDIATE,
                                        row_elements(buffer, rows) * _bytes(buffer),
                                        "reduction result", name))
            continue
        users = readers(sch, buffer, exclude=block)
        sites = sum(load_count(sch, u, buffer) for u in users)
        gathered = len(readers(sch, buffer, exclude=block, affine=True)) < len(users)
        if gathered or not info.element_iters or (len(users) == 1 and sites == 1):
            try:
                sch.compute_inline(block)
                dec.inlined.append(name)
                continue
            except Exception as err:  # noqa: BLE001 - not inlinable: keep it Regional
                if gathered:
                    raise Unstitchable(f"{buffer.name} is read at data-dependent places and "
                                       f"cannot be recomputed: {error_summary(err)}") from err
        note = f"read by {len(users)} block(s) at {sites} place(s)"
        dec.regional.append(_Staging(buffer.name, BufferRole.INTERMEDIATE,
                                     row_elements(buffer, rows) * _bytes(buffer), note, name))


def _decide_staging(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                    rows: int, dec: _Decisions, levels: dict[str, int] | None = None) -> None:
    """Inputs read at several places of their row are staged per row; inputs that whole runs
    of rows read alike are candidates for staging once per thread block. Only inputs whose
    readers all walk rows (``infos``) are staged, and with ``levels`` (the phases of a Global
    group) only those read in one phase: staged data does not outlive its phase."""
    written = {p.name for p in written_params(func, sch)}
    for param in func.params:
        if param.name in written or _single_value(param):
            continue
        users = readers(sch, param, affine=True)
        names = [name_of(sch, u) for u in users]
        if any(n not in infos for n in names) or (
                levels is not None and len({levels[n] for n in names}) > 1):
            continue
        sites = sum(load_count(sch, u, param) for u in users)
        regions = [(infos[name_of(sch, u)], r) for u in users for r in sch.get(u).reads
                   if r.source.same_as(param)]
        if not regions:
            continue
        kinds = {access_rows(info, r, rows) for info, r in regions}
        span = min(rows_sharing(info, r) for info, r in regions)
        if kinds == {RowAccess.ALIGNED} and span == 1:
            per_row = row_elements(param, rows)
            own = all(reads_own_element(info, r, rows) for info, r in regions)
            if sites >= 2:
                dec.staged.append(_Staging(param.name, BufferRole.INPUT, per_row * _bytes(param),
                                           f"read at {sites} places in the row", own=own))
            elif any(info.elements > per_row for info, _ in regions):
                dec.staged.append(_Staging(param.name, BufferRole.INPUT, per_row * _bytes(param),
                                           "broadcast over the row: read once per row"))
        elif sites >= 2 and all(permuted_row(info, r, rows) for info, r in regions):
            dec.staged.append(_Staging(param.name, BufferRole.INPUT,
                                       row_elements(param, rows) * _bytes(param),
                                       f"read at {sites} places in a permuted row"))
        elif span > 1 and len(param.shape) > 0:
            size = _elements(param) * span // rows * _bytes(param)
            dec.block_shared.append(_BlockShared(param.name, max(size, _bytes(param)), span))
        elif sites >= 2:
            dec.global_reads.append(Buffer(param.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"read at {sites} places, not row-aligned"))


def _single_value(buffer: tirx.Buffer) -> bool:
    """Whether ``buffer`` holds one value. Every thread reads that same word, which the
    cache serves; staging it would be a copy loop without loops."""
    return all(isinstance(d, tirx.IntImm) and int(d) == 1 for d in buffer.shape)


def _pack_vertically(dec: _Decisions, mapping: ThreadMapping, gpu: GPU) -> ThreadMapping:
    """Walk several groups of rows per block in sequence (vertical packing): as few as keep
    the grid within one wave, or, when inputs are read alike by runs of rows, as many as
    leave half a wave of blocks, so that those are staged once per block; inputs that no
    block then shares are left in global memory."""
    if is_symbolic(mapping.rows):
        for b in dec.block_shared:
            runs = "every row" if is_symbolic(b.span) else f"runs of {b.span} rows"
            dec.global_reads.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"read alike by {runs}; symbolic row count, no "
                                           "vertical packing: re-read (served by the L2 "
                                           "cache)"))
        dec.block_shared.clear()
        return mapping
    wave = _launch(gpu, mapping.threads_per_block, _shared_bytes(dec, mapping)).wave
    if dec.block_shared:
        span = min(b.span for b in dec.block_shared)
        mapping = replace(mapping, row_steps=row_steps(mapping, wave, span))
    rows_per_block = mapping.rows_per_block * mapping.row_steps
    for b in list(dec.block_shared):
        if rows_per_block == 1 or b.span % rows_per_block:
            dec.block_shared.remove(b)
            dec.global_reads.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"shared by runs of {b.span} rows, one row per "
                                           "block: re-read (served by the L2 cache)"))
    if not dec.block_shared:
        mapping = replace(mapping, row_steps=row_steps(mapping, wave))
    return mapping


def _grid(mapping: ThreadMapping) -> int:
    """The blocks a mapping launches; 0 when the row count is symbolic (known at run time)."""
    return 0 if mapping.rows_expr else mapping.blocks


def _elements(buffer: tirx.Buffer) -> int:
    """Elements of ``buffer``; a symbolic dimension counts as its stand-in."""
    shape = shape_values(buffer.shape)
    if shape is None:
        raise Unstitchable(f"{buffer.name} has a dimension that is not a product of shape "
                           "variables")
    return prod(shape)


def _bytes(buffer: tirx.Buffer) -> int:
    return max(buffer.dtype.bits * buffer.dtype.lanes // 8, 1)


def _widest_element(sch: s_tir.Schedule, func: tirx.PrimFunc) -> int:
    """Bytes of the widest element any block reads or writes, parameters and intermediates
    alike: a vector must fit ``VECTOR_BYTES`` in every dtype it is applied to (a float16
    kernel that normalises in float32 takes four lanes, not eight)."""
    regions = (r for b in child_blocks(sch) for r in (*sch.get(b).reads, *sch.get(b).writes))
    return max([_bytes(p) for p in func.params] + [_bytes(r.source) for r in regions])


def _shared_bytes(dec: _Decisions, mapping: ThreadMapping) -> int:
    """Shared memory of the staged buffers and the reductions' scratch, each array aligned as
    TVM declares it: a cross-thread reduction stages one value per warp (``red_buf_staging``)
    and broadcasts its result (``red_result``)."""
    rpb = mapping.rows_per_block
    data = sum(aligned_shared(s.bytes_for(rpb)) for s in dec.regional + dec.staged)
    data += sum(aligned_shared(b.size) for b in dec.block_shared)
    warps = -(-mapping.threads_per_block // WARP_SIZE)
    return data + dec.reductions * (aligned_shared(warps * 4) + aligned_shared(4))


def _fit_budget(sch: s_tir.Schedule, dec: _Decisions, mapping: ThreadMapping,
                budget: int) -> ThreadMapping:
    """Demote staging one buffer at a time until the block's shared memory fits ``budget``;
    an input staged per row whose readers read only their own elements goes to registers
    when each thread holds few enough of them (``registers``), else to global memory."""
    while _shared_bytes(dec, mapping) > budget:
        used = _shared_bytes(dec, mapping)
        if dec.staged:
            victim = max(dec.staged, key=lambda s: s.bytes_for(mapping.rows_per_block))
            dec.staged.remove(victim)
            slots = _register_slots(victim, mapping, sch)
            if victim.own and slots <= REGISTER_ROW_ELEMENTS:
                dec.held.append(replace(victim, note=f"{slots} element(s) of the row per "
                                                     "thread"))
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
                sch.compute_inline(sch.get_sblock(victim.block))
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
    return mapping


REGISTER_ROW_ELEMENTS = 32
"""Most elements of a row one thread holds in registers (an input that does not fit in shared
memory): 32 of the 64 registers a thread of a 1024-thread block may use at full occupancy."""


def _register_slots(staging: _Staging, mapping: ThreadMapping, sch: s_tir.Schedule) -> int:
    """Elements of its row each thread would hold of the input ``staging`` kept in registers:
    each of ``threads_per_row`` threads takes one element per step."""
    param = next(p for p in sch.mod["main"].params if p.name == staging.name)
    return -(-staging.per_row // _bytes(param) // mapping.threads_per_row)


def _buffers(dec: _Decisions, mapping: ThreadMapping, reused: list[str]) -> tuple[Buffer, ...]:
    rpb = mapping.rows_per_block
    out: list[Buffer] = []
    for name in reused:
        cached = f"{name}_shared"
        kept = any(s.name == cached for s in dec.regional)
        level = StorageLevel.SHARED if kept else StorageLevel.REGISTER
        out.append(Buffer(name, BufferRole.OUTPUT, level, 0,
                          "written out and read inside the kernel"))
    for s in dec.regional + dec.staged:
        out.append(Buffer(s.name, s.role, StorageLevel.SHARED, s.bytes_for(rpb), s.note,
                          s.block))
    for s in dec.results + dec.held:
        out.append(Buffer(s.name, s.role, StorageLevel.REGISTER, 0, s.note, s.block))
    rows = mapping.rows_per_block * mapping.row_steps
    for b in dec.block_shared:
        out.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.SHARED, b.size,
                          f"read alike by runs of {b.span} rows: once per block of {rows} rows",
                          per_block=True))
    out.extend(dec.global_reads)
    return tuple(out)
