"""Groups with column reductions (Global stitching): row and column phases on a
persistent grid, partial sums per row tile, and what crosses a grid barrier."""

from __future__ import annotations

from dataclasses import replace
from math import gcd, prod

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV

from ...analysis.roofline import GPU
from ...plan import (
    Buffer,
    BufferRole,
    Choices,
    Demotion,
    DemotionKind,
    Group,
    MappingKind,
    Phase,
    PhaseKind,
    StorageLevel,
    ThreadMapping,
)
from ...symbolic import is_symbolic, symbolic_extent
from ...target import WARP_SIZE
from ..blocks import (
    SHARED,
    buffer_params,
    cache_reused_outputs,
    inline,
    loads_of,
    name_of,
    readers,
    written_params,
)
from ..mapping import row_mapping, row_vector
from ..occupancy import (
    HELD_RESULTS_REGISTERS,
    aligned_shared,
    cached_room,
    launch_config,
    launch_for_grid,
    loads_room,
)
from ..phases import (
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
from ..rows import (
    BlockRows,
    Unstitchable,
    block_rows,
    error_summary,
    reads_own_position,
    rows_sharing,
)
from ..task_split import combine_per_reader, split_output_copies
from .budget import fit_budget, held_registers
from .chosen import (
    GLOBAL_CHOICES,
    check_applicable,
    chosen_column_tiles,
    chosen_threads,
    chosen_vector,
    reread_chosen,
)
from .rows import (
    check_alignment,
    decide_inlining,
    decide_staging,
    on_chip_inputs,
    register_cache,
    rolled_rereads,
    shared_reads,
)
from .state import (
    Decisions,
    Staging,
    bytes_of,
    cap_text,
    launch_of,
    plan_buffers,
    shared_bytes_of,
    widest_element,
    writes_param,
)
from .tiles import (
    MIN_TILE_ROWS,
    choose_tiles,
    column_tile_options,
    fewest_tiles,
    ragged_tiles,
    tile_threads,
    tiles_for_cached,
)
from .unrolling import bound_row_walk, bound_unrolling


def decide_global(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, rows: int,
                  budget: int, max_threads: int, gpu: GPU, threads: int | None = None,
                  split: int = 1, ragged: bool = False) -> Group:
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
    row's elements by design. ``ragged`` takes row tiles that do not divide the rows
    (``tiles.ragged_tiles``), and raises Unstitchable where there are none.
    """
    fixed_elsewhere = threads and group.choices.threads_per_row not in (None, threads)
    check_applicable(group.choices, GLOBAL_CHOICES - ({"threads_per_row"} if fixed_elsewhere
                                                      else set()) - (set() if split > 1
                                                                     else {"cluster"}),
                     "a split row" if split > 1 else "a Global")
    symbolic = is_symbolic(rows)
    if symbolic and split > 1:
        raise Unstitchable("symbolic row count: rows split over blocks are few and long, "
                           "never of a run-time count")
    for name in column_reductions(sch, rows):
        normalise_column(sch, sch.get_sblock(name))
    roles = assign_roles(sch, rows)
    reused = cache_reused_outputs(sch, func, SHARED, writers=set(roles.of_kind(BlockRole.ROW)))
    if split > 1:
        split_output_copies(sch, reused, rows // split, split)
    roles = assign_roles(sch, rows)
    dec = Decisions()
    decide_inlining(sch, func, _row_infos(sch, rows, roles), rows, dec)
    _inline_column_space(sch, func, assign_roles(sch, rows), dec)
    roles = _inline_crossings(sch, rows, dec)
    sch = combine_per_reader(sch, func)
    roles = assign_roles(sch, rows)
    infos = _row_infos(sch, rows, roles)
    check_alignment(sch, infos, rows, among_rows=True, permuted=group.permuted_outputs,
                    writes=split == 1)
    columns = {name: column_view(sch, sch.get_sblock(name)) for name in roles.columns}
    decide_staging(sch, func, {**infos, **columns}, rows, dec, roles.levels)
    choices = group.choices
    reread_chosen(dec, choices)
    dec.reductions = sum(1 for info in infos.values() if info.is_reduction)
    length = max([i.elements for i in infos.values()] + list(roles.columns.values()))
    if split > 1:
        _unstage_broadcasts(func, dec, length)
    per_row = threads or chosen_threads(row_mapping(rows, length, 1, max_threads, gpu)
                                        .threads_per_row, choices.threads_per_row, max_threads,
                                        "threads per row")
    mapping = ThreadMapping(MappingKind.BLOCK_PER_ROW, rows, length, 1,
                            max(per_row, WARP_SIZE),
                            rows_expr=_rows_expr(columns) if symbolic else "")
    _keep_partials_global(sch, roles, dec)
    # bytes per column of each column reduction's partial results (an online variance: 3)
    elements = {name: sum(bytes_of(w.source) for w in sch.get(sch.get_sblock(name)).writes)
                for name in roles.columns}
    accumulators = {name: roles.columns[name] * elements[name] for name in roles.columns}
    needed = sum(accumulators.values())
    in_registers: dict[str, int] = {}  # column reduction -> partial sums per thread
    tileable = needed > budget // 4 and not symbolic and split == 1 and threads is None
    by_column = tileable and _element_wise_rows(roles, infos, gpu, mapping)
    if tileable and (by_column or not infos):
        narrowed = _narrowed(sch, roles, dec, mapping, choices, length, by_column)
        by_column = by_column and narrowed is not None
        mapping = replace(mapping, threads_per_row=narrowed or mapping.threads_per_row)
    if by_column:
        _unstage_rows(sch, dec, needed, budget, rows)
    tiled = _tiles_for_sums(sch, roles, dec, mapping, choices, symbolic, accumulators,
                            elements, budget, gpu, rows * length, by_column) \
        if needed > budget // 4 else 1
    if tiled == 1 and needed > budget // 4:
        in_registers = _partial_sums_in_registers(sch, roles, mapping)
        accumulators = {n: size for n, size in accumulators.items() if n not in in_registers}
    else:
        accumulators = {n: _tiled(size, tiled, mapping, elements[n])
                        for n, size in accumulators.items()}
    held_sums = _held_sums(sch, in_registers)  # registers the partial sums take per thread
    if in_registers:
        dec.demotions.append(Demotion(DemotionKind.PARTIAL_SUMS_IN_REGISTERS, after=held_sums,
                                      used=needed, budget=budget))
    available = budget - sum(accumulators.values())
    reserve = _kept_reserve(sch, func, roles, infos, mapping, rows, dec, available, gpu) \
        if split > 1 else 0
    mapping = fit_budget(sch, dec, mapping, available - reserve, held_sums)
    vector = chosen_vector(row_vector(length, widest_element(sch, func)), choices)
    # As in a row group (a vector would not follow held registers), and only when every
    # thread gets a whole vector: the block's threads are sized for scalar accesses, and
    # fewer threads on more elements each keep more in registers (fuzz case g469 spilled).
    # Row blocks in column tiles take a column per thread, as the partial sums beside them.
    by_column = by_column and tiled > 1
    if not dec.held and length >= mapping.threads_per_row * vector and not by_column:
        mapping = replace(mapping, vector=vector)
    roles = assign_roles(sch, rows)
    options = [] if in_registers else _column_tiles(sch, roles, dec, mapping, choices, symbolic,
                                                    by_column)
    most = max(options, default=1)
    accumulators = {name: _tiled(roles.columns[name] * elements[name], max(most, tiled),
                                 mapping, elements[name]) for name in accumulators}
    staged = _phase_inputs(sch, roles, rows, budget - shared_bytes_of(dec, mapping)
                           - sum(accumulators.values()))
    shared = shared_bytes_of(dec, mapping) + sum(accumulators.values()) \
        + sum(b.shared_bytes for b in staged)
    launch = launch_of(gpu, mapping.threads_per_block, shared)
    # A run-time row count takes a wave of row tiles, each walking its share of the rows;
    # ragged tiles take ceil(rows / tiles) rows each, the last one's rows past the end
    # guarded as a run-time count's.
    may_be_ragged = not symbolic and split == 1 and tiled == 1 and bool(roles.columns)
    uneven = ragged_tiles(rows, launch.wave) if ragged and may_be_ragged else None
    if ragged and uneven is None:
        raise Unstitchable(f"no ragged row tiles: {rows} rows" + (
            f" split into a wave of {launch.wave} blocks as well by a divisor"
            if may_be_ragged
            else ", a run-time count, a split row, column tiles or no column reduction"))
    if symbolic or uneven:
        tiles, column_tiles = uneven or launch.wave, 1
    else:
        tiles, column_tiles = choose_tiles(
            options, roles, rows, mapping.threads_per_block, launch.wave, rows * length,
            beyond_wave=tiled > 1)
    if split > 1:  # before the register cap: an input kept on chip is not re-read
        phases = _phases(roles, tiles, mapping.threads_per_block, column_tiles,
                         {b.block for b in staged})
        kept = _kept_across_barriers(sch, func, roles, infos, phases,
                                     replace(mapping, row_steps=rows // tiles), rows)
        tasks = max(p.tasks for p in phases)
        for s in _fitting(kept, shared, budget, gpu, mapping.threads_per_block, tasks):
            dec.global_reads = [b for b in dec.global_reads if b.name != s.name]
            dec.staged.append(s)
            shared += aligned_shared(s.per_row)
        launch = launch_of(gpu, mapping.threads_per_block, shared)
    # a thread of a column tile walks its tile's part of each row
    walked = replace(mapping, row_length=length // column_tiles) if column_tiles > 1 \
        else mapping
    reread, per_row = register_cache(sch, func, dec, walked, infos)
    sums = held_sums  # held for the whole tile, as the row walk's elements
    room = cached_room(launch, sums)
    rolled: frozenset[str] = frozenset()
    if per_row > room:
        rolled, per_row = rolled_rereads(
            sch, func, dec, mapping, infos, per_row,
            f"more than the {room} a thread of {launch.threads} keeps beside {sums} partial "
            f"sums" if sums else f"more than {cap_text(launch)}")
    if per_row > room:
        if sums:
            raise Unstitchable(f"partial sums of the column reductions need {needed} B of "
                               f"shared memory per block, more than a quarter of {budget} B, "
                               f"and in registers {sums} per thread, which with the "
                               f"{per_row} elements of the inputs it re-reads per row need "
                               f"more than the {launch.max_registers} registers a thread of "
                               f"{launch.threads} may use: needs tiles of columns")
        raise Unstitchable(f"each thread would keep {per_row} elements of the inputs it "
                           f"re-reads ({', '.join(reread)}) in registers per row, more than "
                           f"{cap_text(launch)}")
    # A tile walks its rows in a loop that nvcc unrolls when it is short and static, and then
    # holds every row's re-read elements; a run-time walk holds one row's.
    walk = -(-rows // tiles)  # a ragged tile's rows; the rows of any other
    if not symbolic and walk * per_row > room:
        held = f"{', '.join(reread)}: {walk * per_row} elements"
        held += f", and {sums} partial sums" if sums else ""
        capped = -(-rows // max(room // per_row, 1)) if uneven \
            else fewest_tiles(rows, room // per_row)
        if capped <= launch.wave:
            dec.demotions.append(Demotion(
                DemotionKind.FEWER_ROW_TILES, before=tiles, after=capped,
                detail=f"a tile of {walk} rows would keep the inputs each thread "
                       f"re-reads ({held}) in registers, more than {cap_text(launch)}"))
            # partial sums sized for column tiles keep them, in rounds beyond the wave
            width = max(roles.columns.values(), default=0)
            lanes = mapping.threads_per_block * column_tiles // max(width, 1)
            keep = tiled > 1 and (rows // capped) % max(lanes, 1) == 0
            tiles, column_tiles = capped, column_tiles if keep else 1
        else:
            # Tiles of many rows: nvcc unrolls a short row walk (and then holds every row's
            # elements), not a long one, which reloads; checked by ptxas in the tests
            # (tests/stitch/test_targets.py, test_register_cache.py).
            dec.demotions.append(Demotion(
                DemotionKind.ROW_TILES_KEPT, before=tiles, after=capped,
                detail=f"tiles within the register cap ({held} > {cap_text(launch)}) would "
                       f"take {capped} tiles, more than one wave of {launch.wave} blocks"))
    elif per_row and not symbolic and not uneven and split == 1 and column_tiles == 1:
        # within the cap, but maybe not beside what the rest of the thread wants
        launch, tiles = tiles_for_cached(gpu, launch, rows, tiles, per_row, sums,
                                         bool(roles.columns), rows * length)
    mapping = replace(mapping, row_tiles=tiles, row_steps=MIN_TILE_ROWS) if symbolic \
        else replace(mapping, row_tiles=tiles, row_steps=-(-rows // tiles)) if uneven \
        else replace(mapping, row_steps=rows // tiles)
    for b in list(dec.block_shared):
        # a run-time tile may start anywhere: only what every row reads alike serves it; a
        # sub-row reads a slice of what its row shares (a group normalisation's channels)
        if split > 1 or ((b.span != rows) if symbolic or uneven
                         else b.span % mapping.row_steps):
            dec.block_shared.remove(b)
            dec.global_reads.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"shared by runs of {b.span} rows, not by the "
                                           + ("sub-rows of a split row" if split > 1 else
                                              "rows of a run-time tile" if symbolic else
                                              f"{mapping.row_steps} rows of a tile")))
    if column_tiles < tiled:  # the tiles the partial sums were sized for did not come
        raise Unstitchable(f"partial sums of the column reductions need {needed} B of shared "
                           f"memory per block, more than a quarter of {budget} B, sized for "
                           f"{tiled} column tiles, and the row phases take {column_tiles}")
    phases = _phases(roles, tiles, mapping.threads_per_block, column_tiles,
                     {b.block for b in staged})
    if not symbolic and not uneven and split == 1 and not dec.held:
        phases = _rows_after_columns(phases, rows, mapping.row_steps, launch.wave,
                                     length * widest_element(sch, func),
                                     sum(b.size for b in dec.block_shared), staged)
    grid = min(launch.wave, max(p.tasks for p in phases))
    partials = tuple(
        Buffer(name, BufferRole.PARTIAL, StorageLevel.GLOBAL, 0,
               f"{tiles} x {roles.columns[name]} partial sums, combined in the next phase",
               name) for name in roles.columns)
    results = _held_results(sch, in_registers)
    accumulated = tuple(
        Buffer(name, BufferRole.ACCUMULATOR, StorageLevel.REGISTER, 0,
               f"partial sum of the block's row tile, {in_registers[name]} column(s) per "
               f"thread{_results_text(sch, name, results[name])}", name,
               registers=in_registers[name], held_results=results[name])
        if name in in_registers
        else Buffer(name, BufferRole.ACCUMULATOR, StorageLevel.SHARED, accumulators[name],
                    "partial sum of the block's row tile", name)
        for name in (*accumulators, *in_registers))
    sums = _column_sums(sch, phases)
    if symbolic and any(b.level is StorageLevel.GLOBAL for b in sums):
        raise Unstitchable(f"symbolic row count: its column phase would sum a wave of "
                           f"{tiles} partial sums per column in place in global memory (a "
                           "sum of one value)")
    partial = {n: w for n, w in roles.columns.items() if w % mapping.threads_per_block}
    if symbolic and partial:
        # the traffic counter takes the guard of such a task's threads as always true, and
        # counts each of a wave of blocks combining the whole wave (2.3 GB for 4 columns)
        raise Unstitchable(f"symbolic row count: its column phase sums "
                           f"{max(partial.values())} columns on tasks of "
                           f"{mapping.threads_per_block} threads, the last one partial, "
                           "which over a wave of run-time tiles is not counted")
    launch = replace(launch_for_grid(gpu, launch, grid), grid=grid)
    room = loads_room(launch, per_row + held_registers(sch, dec, mapping), held_sums)
    unrolled = bound_unrolling(sch, func, infos, mapping,
                               on_chip_inputs(sch, func, dec, per_row) - rolled,
                               shared_reads(dec), room,
                               frozenset(h.name for h in dec.held), rolled=rolled)
    # a phase of lanes splits each tile's walk among its threads (``emit._map_lanes``)
    walk = 0 if any(p.lanes > 1 for p in phases) else bound_row_walk(
        sch, func, replace(walked, row_steps=mapping.row_steps, row_tiles=mapping.row_tiles),
        rows, {b.name for b in dec.block_shared} | {h.name for h in dec.held}, room)
    if walk:  # runs that divide every phase's walk longer than one run
        walk = gcd(walk, *(p.row_steps for p in phases if p.row_steps > walk))
    return replace(group, mapping=mapping, inlined=tuple(dec.inlined),
                   buffers=plan_buffers(dec, mapping, reused) + accumulated + partials + staged
                   + sums,
                   shared_bytes=shared, shared_budget=budget,
                   demotions=tuple(dec.demotions), launch=launch, phases=phases,
                   unrolled=unrolled, walk_unrolled=walk)


def _column_tiles(sch: s_tir.Schedule, roles: Roles, dec: Decisions, mapping: ThreadMapping,
                  choices: Choices, symbolic: bool, rows_by_column: bool = False) -> list[int]:
    """The column tile options of the row phases (``tiles.column_tile_options``), narrowed
    to the choices'; ``rows_by_column``: the row blocks may take them too
    (``_element_wise_rows``). An input staged once per block covers the block's whole rows,
    not a tile of its columns (tiling columns then read the staged copy at the wrong
    columns). An input staged per row is copied by the whole block at each row, where lanes
    would take parts of the tile's rows (fuzz graph 7321:1486, exp(x - x) of a softmax over
    a unit axis). Nor do registers, which hold a thread's columns of every row of its tile:
    the caller asks only before it keeps partial sums there."""
    if dec.block_shared or symbolic:
        return chosen_column_tiles([], choices)
    return chosen_column_tiles(column_tile_options(roles, mapping.threads_per_block,
                                                   lanes=not dec.staged,
                                                   element_wise_rows=rows_by_column), choices)


def _element_wise_rows(roles: Roles, infos: dict[str, BlockRows], gpu: GPU,
                       mapping: ThreadMapping) -> bool:
    """Whether the row phase, with its row blocks if any, takes column tiles of the partial
    sums (``decide_global`` narrows the block to a width that divides into them where need
    be): one row phase (no row block reads a column phase's result), each row block
    element-wise over a row as wide as the column reductions', and rows too few for their
    row tiles to fill half a wave (``MIN_TILE_ROWS`` rows each). Two rows of 30000 beside a
    mean over them (fuzz graph 3301:1959) then take 30 tasks of 1000 columns, where one task
    kept 30 partial sums per thread in registers beside the element-wise rows, and spilled;
    many rows keep their row tiles and their vectors."""
    widths = set(roles.columns.values())
    wave = launch_of(gpu, mapping.threads_per_block, 0).wave
    return len(widths) == 1 and mapping.rows // MIN_TILE_ROWS < wave // 2 \
        and all(roles.levels[n] == 0 for n in (*roles.columns, *infos)) \
        and all(not info.is_reduction and info.elements in widths for info in infos.values())


def _narrowed(sch: s_tir.Schedule, roles: Roles, dec: Decisions, mapping: ThreadMapping,
              choices: Choices, length: int, rows_by_column: bool) -> int | None:
    """Threads per block whose column tiles the row phase can take: the mapping's where it
    has some, else (unless the choices fix the threads) the most that divide ``length``
    into tiles as wide as the block (``tiles.tile_threads``); None when neither has any.
    Three column sums over 16000 columns kept 48 sums per thread in registers beside their
    rolled re-reads and spilled 72 B; blocks of 1000 threads take 16 tiles of 1000."""
    if _column_tiles(sch, roles, dec, mapping, choices, False, rows_by_column):
        return mapping.threads_per_row
    if choices.threads_per_row is not None:
        return None
    narrowed = tile_threads(length, mapping.threads_per_row)
    if narrowed is None or not _column_tiles(
            sch, roles, dec, replace(mapping, threads_per_row=narrowed), choices, False,
            rows_by_column):
        return None
    return narrowed


def _unstage_rows(sch: s_tir.Schedule, dec: Decisions, needed: int, budget: int,
                  rows: int) -> None:
    """Nothing staged per row for rows in column tiles (a task holds a part of each row):
    inputs are read from global memory again, intermediates recomputed by their readers."""
    demoted = [s.name for s in dec.staged + dec.regional]
    for staged in dec.staged:
        dec.global_reads.append(Buffer(staged.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       "re-read: rows in column tiles"))
    for regional in dec.regional:
        inline(sch, sch.get_sblock(regional.block))
        dec.inlined.append(regional.block)
    dec.staged.clear()
    dec.regional.clear()
    if demoted:
        dec.demotions.append(Demotion(DemotionKind.ROWS_IN_COLUMN_TILES, ", ".join(demoted),
                                      before=max(1, rows // MIN_TILE_ROWS), used=needed,
                                      budget=budget))


def _tiled(size: int, tiles: int, mapping: ThreadMapping, element: int) -> int:
    """Shared bytes of an accumulator of ``size`` bytes over a row tile's columns, when a
    task takes one of ``tiles`` tiles of them: its share, and with column tiles narrower
    than the block a slot per thread for the lanes' sums (of ``element`` bytes)."""
    share = size // tiles
    lanes = tiles > 1 and share // element < mapping.threads_per_block
    return share + (mapping.threads_per_block * element if lanes else 0)


def _tiles_for_sums(sch: s_tir.Schedule, roles: Roles, dec: Decisions, mapping: ThreadMapping,
                    choices: Choices, symbolic: bool, accumulators: dict[str, int],
                    elements: dict[str, int], budget: int, gpu: GPU, size: int,
                    rows_by_column: bool) -> int:
    """Column tiles per row tile that ``choose_tiles`` takes for accumulators too large for
    a quarter of the shared budget whole (``accumulators``: bytes over a row tile's
    columns), when their tiles fit it; else 1 (the partial sums are then kept in
    registers). A task on a tile of the columns keeps its sums of a tile on chip: eight
    rows of 49152 columns (a sum over the leading axis of (8, 12, 64, 64)) are 48 tiles of
    4 KB, where one task per row tile kept 48 sums per thread in registers, on one block.
    Tiles more than a wave of tasks are taken where no fewer fit and the sums alone would not
    fit a thread's registers: two rows of 301056 columns (a sum over the leading axis of (2,
    3136, 96)) take 294 tasks on 132 blocks, where 294 sums per thread fit nowhere."""
    options = _column_tiles(sch, roles, dec, mapping, choices, symbolic, rows_by_column)
    sums = _held_sums(sch, _partial_sums_in_registers(sch, roles, mapping))
    crowded = cached_room(launch_of(gpu, mapping.threads_per_block, 0), sums) < 0
    for beyond_wave in (False, True) if crowded else (False,):
        for tiles in options:
            shared = sum(_tiled(a, tiles, mapping, elements[n])
                         for n, a in accumulators.items())
            if shared > budget // 4:
                continue
            # what is staged beyond the budget is demoted later (``fit_budget``)
            wave = launch_of(gpu, mapping.threads_per_block,
                             min(budget, shared_bytes_of(dec, mapping) + shared)).wave
            if choose_tiles([tiles], roles, mapping.rows, mapping.threads_per_block, wave,
                            size, beyond_wave)[1] == tiles:
                return tiles
    return 1


def _kept_reserve(sch: s_tir.Schedule, func: tirx.PrimFunc, roles: Roles,
                  infos: dict[str, BlockRows], mapping: ThreadMapping, rows: int,
                  dec: Decisions, available: int, gpu: GPU) -> int:
    """Shared memory to leave free, when the rest of a split row group's staging is fitted,
    for the inputs it can keep on chip across its grid barriers (``_kept_across_barriers``,
    the smallest first, as many as fit beside the reductions' scratch with every sub-row's
    block resident): a kept input saves a read of it from global memory in every later
    phase, where an intermediate staged in its place only saves recomputing it from what is
    on chip (a group normalisation's ``x - mean`` of sub-rows of 8192 took 32 KB, and ``x``
    was read three times)."""
    phases = _phases(roles, rows, mapping.threads_per_block, 1, set())
    kept = _kept_across_barriers(sch, func, roles, infos, phases,
                                 replace(mapping, row_steps=1), rows)
    scratch = shared_bytes_of(Decisions(reductions=dec.reductions), mapping)
    return sum(aligned_shared(s.per_row) for s in _fitting(
        kept, scratch, available, gpu, mapping.threads_per_block, rows))


def _fitting(kept: list[Staging], shared: int, budget: int, gpu: GPU, threads: int,
             tasks: int) -> list[Staging]:
    """The inputs of ``kept`` to keep on chip, the smallest first, as long as the block's
    ``shared`` bytes with them stay within ``budget`` and a wave still holds ``tasks``
    blocks (every sub-row's block resident); the others are re-read in each phase that
    reads them, as a split row does."""
    chosen = []
    for s in sorted(kept, key=lambda s: s.per_row):
        more = shared + aligned_shared(s.per_row)
        if more <= budget and launch_config(gpu, threads, more).wave >= tasks:
            chosen.append(s)
            shared = more
    return chosen


def _unstage_broadcasts(func: tirx.PrimFunc, dec: Decisions, length: int) -> None:
    """Read from global memory the inputs of a split row group that are staged per sub-row
    although shorter than one (a group normalisation's scale and shift, a few channels per
    sub-row, broadcast over each channel's map): task splitting lays out as sub-rows only
    what is as long as the row."""
    params = {p.name: p for p in buffer_params(func)}
    for s in list(dec.staged):
        if s.role is BufferRole.INPUT and s.per_row < length * bytes_of(params[s.name]):
            dec.staged.remove(s)
            dec.global_reads.append(Buffer(s.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           "broadcast over a sub-row of a split row"))


def _kept_across_barriers(sch: s_tir.Schedule, func: tirx.PrimFunc, roles: Roles,
                          infos: dict[str, BlockRows], phases: tuple[Phase, ...],
                          mapping: ThreadMapping, rows: int) -> list[Staging]:
    """Inputs of a split row group that its row blocks read in several phases, each read at
    the block's own position of its sub-row (``reads_own_position``):
    staged per sub-row in shared memory in the first phase and kept there across the grid
    barriers. A block keeps its shared memory across a grid barrier, and here its sub-row
    too: every row phase has a task per sub-row (one sub-row per block at a time, no column
    tiles), so with every task resident at once (the caller checks the grid's wave) block
    ``b`` has sub-row ``b`` in every phase. The row is then read from global memory once,
    not once per phase."""
    row_phases = [p for p in phases if p.kind is PhaseKind.ROWS]
    if mapping.row_steps != 1 or any(p.tasks != rows for p in row_phases):
        return []
    written = {p.name for p in written_params(func, sch)}
    kept = []
    for param in buffer_params(func):
        users = readers(sch, param)
        names = [name_of(sch, u) for u in users]
        if param.name in written or not users or any(n not in infos for n in names) \
                or len({roles.levels[n] for n in names}) < 2:
            continue
        regions = [(infos[n], r) for u, n in zip(users, names, strict=True)
                   for r in sch.get(u).reads if r.source.same_as(param)]
        if all(reads_own_position(info, r) for info, r in regions):
            levels = {roles.levels[n] for n in names}
            kept.append(Staging(param.name, BufferRole.INPUT,
                                mapping.row_length * bytes_of(param),
                                f"read in {len(levels)} phases: staged per sub-row by the "
                                "first and kept across the grid barriers", own=True,
                                kept=True))
    return kept


def _column_sums(sch: s_tir.Schedule, phases: tuple[Phase, ...]) -> tuple[Buffer, ...]:
    """Where each column phase sums the partials it combines (a thread per column): in a
    register stored once where ``phases.register_sum`` allows it, else in place in global
    memory."""
    sums = []
    for phase in phases:
        if phase.kind is not PhaseKind.COLUMNS:
            continue
        for name in phase.combines:
            results = [w.source for w in sch.get(sch.get_sblock(name)).writes]
            in_register = all(register_sum(r) for r in results)
            for result in results:
                sums.append(Buffer(result.name, BufferRole.SUM, StorageLevel.REGISTER, 0,
                                   "summed in a register, stored once", name)
                            if in_register else
                            Buffer(result.name, BufferRole.SUM, StorageLevel.GLOBAL, 0,
                                   "summed in place: one value, no column for a thread",
                                   name))
    return tuple(sums)


def _partial_sums_in_registers(sch: s_tir.Schedule, roles: Roles, mapping: ThreadMapping
                               ) -> dict[str, int]:
    """Partial sums per thread of each column reduction kept in registers: a row phase maps
    column ``c`` of every row of its tile to thread ``c % P`` of its ``P`` threads
    (``emit._thread_loop``), so a thread sums the same ``ceil(width / P)`` columns over the
    whole tile and no other thread touches them: registers, and no shared memory. Not a
    reduction to a scalar (over the rows of one value per row, as a LayerNorm over a row
    reduction's results): its partial sums have no column axis for the threads to share
    out, and its one sum per tile stays in shared memory."""
    threads = mapping.threads_per_row
    return {name: -(-width // threads) for name, width in roles.columns.items()
            if len(sch.get(sch.get_sblock(name)).writes[0].source.shape) > 0}


def _held_sums(sch: s_tir.Schedule, in_registers: dict[str, int]) -> int:
    """Registers per thread the partial sums ``in_registers`` (accumulator -> slots per
    thread) take: a slot per value each accumulator writes, two for an online softmax's
    maximum and sum of exponentials (fuzz graph 4407:299: 49 slots of pairs beside a
    softmax over the leading 4 of (4, 256, 14, 14) were budgeted 49 registers and
    spilled 96 B), two for a maximum or minimum of float16 (``_selects_narrow``)."""
    return sum(slots * len(sch.get(sch.get_sblock(name)).writes)
               * (2 if _selects_narrow(sch.get(sch.get_sblock(name))) else 1)
               for name, slots in in_registers.items())


def _held_results(sch: s_tir.Schedule, in_registers: dict[str, int]) -> dict[str, int]:
    """How many results of each column reduction of ``in_registers`` (accumulator -> slots
    per thread) a thread holds in registers: every one (an online softmax's pair, an online
    variance's triple) where together they take no more than ``HELD_RESULTS_REGISTERS``
    (``_held_sums``), else the first alone, the others accumulating in place in global
    memory, a read and a write of each at every row step: a batch norm's triple over 2048
    columns on 512 threads (12 registers) moved 142 MB of its 256 MB in place where its
    input and output are 67 MB, and the rules kept two passes instead (its input read three
    times, 153 MB; all held, 122 MB). The registers budgeted (``_held_sums``) count every
    result either way."""
    return {name: len(sch.get(sch.get_sblock(name)).writes)
            if _held_sums(sch, {name: slots}) <= HELD_RESULTS_REGISTERS else 1
            for name, slots in in_registers.items()}


def _results_text(sch: s_tir.Schedule, name: str, held: int) -> str:
    """How a register accumulator's results are held, for the plan's text; "" for one."""
    total = len(sch.get(sch.get_sblock(name)).writes)
    if total == 1:
        return ""
    return f", its {total} results" if held == total \
        else f", its first result (the other {total - 1} in place in global memory)"


def _selects_narrow(block: tirx.SBlock) -> bool:
    """Whether ``block`` updates its accumulator with a maximum or minimum of a type
    narrower than 32 bits. TVM's CUDA code takes one of float16 as a select of two
    ``half`` objects, which ptxas keeps a copy of: 30 sums of ``max(acc, |x|)`` a thread of
    1024 beside a LayerNorm of rows of 30000 float16 spilled 88 B at the cap of 64 (fuzz
    graph 852171:13), with ``__hmax`` or float32 sums none."""
    body = block.body
    return isinstance(body, tirx.BufferStore) and isinstance(body.value, (tirx.Max, tirx.Min)) \
        and body.buffer.dtype.bits < 32


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
        for written in sch.get(block).writes:  # an online variance's mean too
            buffer = written.source
            by_level: dict[int, list[str]] = {}
            for user in readers(sch, buffer, exclude=block, affine=True):
                user_name = name_of(sch, user)
                if roles.kinds[user_name] in (BlockRole.ROW, BlockRole.COLUMN) \
                        and roles.levels[user_name] > roles.levels[name]:
                    by_level.setdefault(roles.levels[user_name], []).append(user_name)
            size = prod(int(d) for d in buffer.shape) * bytes_of(buffer)
            for users in by_level.values():
                per_block = all(_row_independent(sch, u, buffer, rows, roles) for u in users)
                staged = size if per_block else bytes_of(buffer)
                if staged > room or (not per_block and size > rows * bytes_of(buffer)):
                    continue
                room -= staged
                note = ("read alike by every row: once per block" if per_block
                        else "one value per row: once per row")
                found.append(Buffer(buffer.name, BufferRole.PHASE_INPUT, StorageLevel.SHARED,
                                    staged, note, users[0], per_block))
    return tuple(found)


def _row_independent(sch: s_tir.Schedule, name: str, buffer: tirx.Buffer, rows: int,
                     roles: Roles) -> bool:
    """Whether block ``name`` reads ``buffer`` at places that do not depend on its row."""
    block = sch.get_sblock(name)
    info = column_view(sch, block) if roles.kinds[name] is BlockRole.COLUMN \
        else block_rows(sch, block, rows)
    return all(rows_sharing(info, r) == rows for r in sch.get(block).reads
               if r.source.same_as(buffer))


def _keep_partials_global(sch: s_tir.Schedule, roles: Roles, dec: Decisions) -> None:
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
                         dec: Decisions) -> None:
    """A column-space block read once, by one column-space block, is computed by it (or
    read at most ``SAME_LOADS_RECOMPUTED`` times at one index, a square's ``y * y``:
    recomputed, it is the same expression, where kept it would make a round trip through
    global memory, fuzz graph 12044:202); so is one computed from combinations of a split
    row's partials alone and read by row blocks alone (a mean, the row sum over the length),
    by each of them: every block then combines its own row's partials where it reads them
    (``combine_per_reader``), and no column phase and grid barrier of its own makes the
    value for them."""
    for combinations in (False, True):  # the latter once chains are one block
        for name in reversed(roles.of_kind(BlockRole.COLUMN_SPACE)):
            if name in dec.inlined:
                continue
            block = sch.get_sblock(name)
            if writes_param(sch, func, block):
                continue
            buffer = sch.get(block).writes[0].source
            users = readers(sch, buffer, exclude=block)
            kinds = {roles.kinds[name_of(sch, u)] for u in users}
            if (users and kinds == {BlockRole.ROW} and _of_combinations(sch, roles, block)
                    if combinations else len(users) == 1 and kinds == {BlockRole.COLUMN_SPACE}
                    and _recomputable(sch, users[0], buffer)):
                inline(sch, block)
                dec.inlined.append(name)


SAME_LOADS_RECOMPUTED = 2
"""Most loads at one index of a column-space intermediate that its reader recomputes it for
(``_inline_column_space``): nested squares would double its expression at each level."""


def _recomputable(sch: s_tir.Schedule, user: SBlockRV, buffer: tirx.Buffer) -> bool:
    """Whether ``user`` loads ``buffer`` once, or a few times at one index."""
    loads = loads_of(sch, user, buffer)
    return len(loads) == 1 or len(loads) <= SAME_LOADS_RECOMPUTED and all(
        tvm_ffi.structural_equal(list(load.indices), list(loads[0].indices))
        for load in loads[1:])


def _of_combinations(sch: s_tir.Schedule, roles: Roles, block: SBlockRV) -> bool:
    """Whether ``block`` reads nothing but what combine blocks write."""
    read = {r.source.name for r in sch.get(block).reads}
    combined = {w.source.name for n in roles.of_kind(BlockRole.COMBINE)
                for w in sch.get(sch.get_sblock(n)).writes}
    return bool(read) and read <= combined


def _inline_crossings(sch: s_tir.Schedule, rows: int, dec: Decisions) -> Roles:
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
            inline(sch, sch.get_sblock(producer))
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
                                       producer, readers=tuple(sorted(later))))
    return assign_roles(sch, rows)


def _phases(roles: Roles, tiles: int, threads: int, column_tiles: int,
            staged_readers: set[str]) -> tuple[Phase, ...]:
    """Row phases (``tiles`` tasks, times ``column_tiles``) and column phases (a task per
    ``threads`` columns), by level; a column reduction is in the row phase of its partial
    sums and in the next column phase, which combines them; a combine block of a row phase
    is among its ``combines``. A row phase of one column reduction in column tiles narrower
    than the block, reading nothing staged for it (``staged_readers``: the readers of phase
    inputs), gives each column several threads (``Phase.lanes``)."""
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
            lanes = threads * column_tiles // roles.columns[partials[0]] \
                if column_tiles > 1 and len(partials) == 1 and not roles.of_kind(BlockRole.ROW) \
                and not staged_readers & set(names) else 1
            phases.append(Phase(PhaseKind.ROWS, names, tiles * column_tiles, partials=partials,
                                combines=combines, column_tiles=column_tiles,
                                lanes=max(lanes, 1)))
        else:
            width = max(roles.widths[n] for n in names)
            combines = tuple(n for n in names if n in roles.combines)
            phases.append(Phase(PhaseKind.COLUMNS, names, -(-width // threads), combines=combines))
    return tuple(phases)


def _rows_after_columns(phases: tuple[Phase, ...], rows: int, steps: int, wave: int,
                        row_bytes: int, block_staged: int, staged: tuple[Buffer, ...]
                        ) -> tuple[Phase, ...]:
    """``phases`` with each rows phase after a columns phase that accumulates nothing (no
    partial sums, no combines, no column tiles) in tasks of the fewest rows that keep them
    within a ``wave`` of blocks, where its row tiles of ``steps`` rows, sized for the partial
    sums of an earlier phase, leave blocks idle: a LayerNorm over 64 rows of 30000 after
    their column means walked 8 tiles of 8 rows on 8 of 30 blocks (fuzz graph 12026:88),
    and takes a task per row. A task stages again what its block stages once (the inputs
    read alike by every row, ``block_staged`` bytes, and the phase's column results in
    ``staged``): it takes rows of at least as many bytes (``row_bytes`` each; a batch norm's
    rows of 128 beside 2 KB staged per block take tasks of 4)."""
    out, after_columns = [], False
    for phase in phases:
        after_columns = after_columns or phase.kind is PhaseKind.COLUMNS
        if after_columns and phase.kind is PhaseKind.ROWS and phase.tasks < wave \
                and not (phase.partials or phase.combines) and phase.column_tiles == 1:
            again = block_staged + sum(b.shared_bytes for b in staged
                                       if b.per_block and b.block in phase.blocks)
            fewer = min(s for s in range(1, steps + 1) if rows % s == 0 and rows // s <= wave
                        and s * row_bytes >= again or s == steps)
            if fewer < steps:
                phase = replace(phase, tasks=rows // fewer, row_steps=fewer)
        out.append(phase)
    return tuple(out)


def _rows_expr(columns: dict[str, BlockRows]) -> str:
    """The run-time row count of a Global group, from its column reductions' row iterator."""
    view = next(iter(columns.values()))
    return symbolic_extent([i.size for i in view.row_iters])
