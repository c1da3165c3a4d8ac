"""Row groups (Regional stitching): Local or Regional per block, what is staged per row
and per block, vertical packing, and the register cache a thread keeps of re-read inputs."""

from __future__ import annotations

from dataclasses import replace
from math import prod

import tvm
from tvm import s_tir, tirx

from ...analysis.roofline import GPU
from ...plan import (
    Buffer,
    BufferRole,
    Demotion,
    DemotionKind,
    Group,
    MappingKind,
    StorageLevel,
    ThreadMapping,
)
from ...symbolic import declared_bounds, is_symbolic, shape_values, symbolic_extent, upper_bound
from ...target import WARP_SIZE
from ..blocks import (
    buffer_params,
    child_blocks,
    inline,
    load_count,
    name_of,
    readers,
    written_params,
)
from ..mapping import (
    MAX_ROW_STEPS,
    PACKED_ROW_THREADS,
    SYMBOLIC_ROW_LENGTH,
    row_mapping,
    row_steps,
    row_vector,
    strided_row_mapping,
)
from ..occupancy import FULL_UNROLL_STEPS, cached_elements_cap, launch_for_cached, loads_room
from ..rows import (
    BlockRows,
    CrossRowRead,
    RowAccess,
    Unstitchable,
    access_rows,
    address_strides,
    block_rows,
    error_summary,
    permuted_elements,
    permuted_row,
    prefix_split,
    reads_one_per_row,
    reads_own_element,
    row_elements,
    rows_sharing,
    same_permuted_rows,
)
from ..vectors import HALF_MATH_CALLS, half_math_calls
from .budget import fit_budget, held_registers
from .chosen import (
    ROW_CHOICES,
    check_applicable,
    chosen_row_mapping,
    chosen_vector,
    hold_chosen,
    reread_chosen,
)
from .flat import HELD_LANES
from .state import (
    BlockShared,
    Decisions,
    Staging,
    bytes_of,
    cap_text,
    elements_of,
    grid_of,
    launch_of,
    plan_buffers,
    shared_bytes_of,
    widest_element,
    writes_param,
)
from .unrolling import bound_unrolling


def decide_rows(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, rows: int,
                reused: list[str], budget: int, max_threads: int, gpu: GPU,
                bounded: bool = True) -> Group:
    """Row group: every block walks the ``rows`` rows first (checked), then its elements.
    Rows of symbolic length are staged for the declared bounds of ``func``'s shape
    variables when ``bounded`` (and they have some), else re-read."""
    check_applicable(group.choices, ROW_CHOICES, "a row")
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    check_alignment(sch, infos, rows, permuted=group.permuted_outputs)
    dec = Decisions()
    decide_inlining(sch, func, infos, rows, dec)
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    decide_staging(sch, func, infos, rows, dec)
    longest = max(infos.values(), key=lambda info: info.elements)
    length = longest.elements
    bound = None
    if is_symbolic(length):
        sizes = [i.size for i in longest.element_iters]
        extent = prod(sizes[1:], start=sizes[0])
        bound = upper_bound(extent, declared_bounds(func.attrs)) if bounded else None
        if bound is None:
            _unbounded_rows(sch, dec)
        else:
            _bounded_rows(sch, dec, length, bound)
    choices = group.choices
    reread_chosen(dec, choices)
    dec.reductions = sum(1 for info in infos.values() if info.is_reduction)
    vector = chosen_vector(row_vector(length, widest_element(sch, func, by_lanes=True)), choices)
    if vector > HELD_LANES and half_math_calls(sch, child_blocks(sch)) >= HALF_MATH_CALLS:
        if choices.vector is not None:
            raise Unstitchable(f"vectors of {vector}: a row group computing "
                               f"{HALF_MATH_CALLS} or more transcendentals on float16 values "
                               f"takes at most {HELD_LANES} elements per access")
        vector = HELD_LANES
    mapped = (bound or SYMBOLIC_ROW_LENGTH) if is_symbolic(length) else length
    strided = not is_symbolic(rows) and not is_symbolic(length) and strided_rows(sch, func, infos)
    if strided:
        if (choices.vector or 1) > 1 or choices.vector_reads:
            raise Unstitchable("strided rows take one element per access")
        vector = 1
        mapping = strided_row_mapping(rows, length, max_threads, gpu,
                                      widest_element(sch, func))
    elif is_symbolic(rows):  # packed rows: the last block's rows past the end are guarded
        mapping = replace(row_mapping(rows, mapped, None, max_threads, gpu, vector),
                          rows_expr=symbolic_extent([i.size for i in longest.row_iters]))
    else:
        mapping = row_mapping(rows, mapped, rows, max_threads, gpu, vector)
    if is_symbolic(length):
        mapping = replace(mapping, row_length=length, mapped_length=mapped,
                          length_bound=bound or 0,
                          length_expr=symbolic_extent([i.size for i in longest.element_iters]))
    mapping = _one_permuted_row(dec, chosen_row_mapping(mapping, choices, max_threads),
                                choices.rows_per_block is not None)
    hold_chosen(sch, dec, mapping, choices)
    if choices.rows_per_block is None and choices.row_steps is None and not strided:
        mapping = _pack_horizontally(dec, mapping, gpu, budget, max_threads)
    mapping = fit_budget(sch, dec, mapping, budget)
    mapping = _pack_vertically(dec, mapping, gpu, choices.row_steps)
    if not dec.held:  # a vector would give a thread other elements than its registers hold
        mapping = replace(mapping, vector=vector)
    shared = shared_bytes_of(dec, mapping)
    launch = launch_of(gpu, mapping.threads_per_block, shared, grid_of(mapping))
    reread, per_row = register_cache(sch, func, dec, mapping, infos)
    rolled: frozenset[str] = frozenset()
    if per_row > cached_elements_cap(holding := launch_for_cached(gpu, launch, per_row)):
        rolled, per_row = rolled_rereads(sch, func, dec, mapping, infos, per_row,
                                         f"more than {cap_text(holding)}")
    launch = launch_for_cached(gpu, launch, per_row)
    if per_row > cached_elements_cap(launch):
        raise Unstitchable(f"each thread would keep {per_row} elements of the inputs it "
                           f"re-reads ({', '.join(reread)}) in registers, more than "
                           f"{cap_text(launch)}: rows of {length} need more threads than "
                           "a block has")
    unrolled = bound_unrolling(sch, func, infos, mapping,
                               on_chip_inputs(sch, func, dec, per_row) - rolled,
                               shared_reads(dec),
                               loads_room(launch, per_row + held_registers(sch, dec, mapping)),
                               frozenset(h.name for h in dec.held),
                               bool(choices.vector_reads), rolled)
    return replace(group, mapping=mapping, inlined=tuple(dec.inlined),
                   buffers=plan_buffers(dec, mapping, reused),
                   shared_bytes=shared, shared_budget=budget,
                   demotions=tuple(dec.demotions), launch=launch, unrolled=unrolled)


def _one_permuted_row(dec: Decisions, mapping: ThreadMapping, chosen: bool) -> ThreadMapping:
    """``mapping`` for a group whose inputs read at permuted rows (``Staging.permuted``) are
    staged one row at a time. The rows a block packs lie apart in such an input, and TVM
    stages the box around them with threads bound to more rows than the block has: a
    LayerNorm of a transposed (256, 2, 3), 2 rows per block, read a row never staged (fuzz
    graph 6613:191, max error 2.1). Unless the rows per block are ``chosen`` (a tuner's
    candidate) or strided (rows across a warp's lanes), a block takes one row and keeps the
    staging; else those inputs are re-read from global memory."""
    permuted = [s for s in dec.staged if s.permuted]
    if not permuted or mapping.rows_per_block == 1:
        return mapping
    if not chosen and mapping.kind is not MappingKind.STRIDED_ROWS:
        dec.demotions.append(Demotion(DemotionKind.ONE_PERMUTED_ROW,
                                      ", ".join(s.name for s in permuted),
                                      before=mapping.rows_per_block, after=1))
        return replace(mapping, rows_per_block=1)
    for staging in permuted:
        dec.staged.remove(staging)
        dec.global_reads.append(Buffer(staging.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       "demoted: re-read from global memory"))
        dec.demotions.append(Demotion(DemotionKind.PERMUTED_REREAD, staging.name,
                                      before=mapping.rows_per_block))
    return mapping


def strided_rows(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows]
                 ) -> bool:
    """Whether the group's rows are strided (``mapping.strided_row_mapping``): the inputs
    and outputs of ``func`` its blocks access a stride apart along the row but side by side
    from row to row (``rows.address_strides``) outweigh, in bytes, those accessed along the
    row contiguously. Each buffer counts once, by the first such access found."""
    params = {p.name for p in buffer_params(func)}
    kinds: dict[str, tuple[bool, int]] = {}
    for block in child_blocks(sch):
        stmt = sch.get(block)
        info = infos.get(stmt.name_hint)
        if info is None:
            continue
        for region in [*stmt.reads, *stmt.writes]:
            buffer = region.source
            if buffer.name not in params or buffer.name in kinds:
                continue
            by_row, by_element = address_strides(info, region)
            if by_element == 1 or (by_row == 1 and by_element not in (0, -1, None)):
                kinds[buffer.name] = (by_element != 1,
                                      elements_of(buffer) * bytes_of(buffer))
    strided = sum(size for is_strided, size in kinds.values() if is_strided)
    return strided > sum(size for is_strided, size in kinds.values() if not is_strided)


def register_cache(sch: s_tir.Schedule, func: tirx.PrimFunc, dec: Decisions,
                   mapping: ThreadMapping, infos: dict[str, BlockRows]
                   ) -> tuple[list[str], int]:
    """The inputs that several blocks read from global memory at known places, and how many
    of their elements one thread then keeps in registers per row of its block: nvcc fully
    unrolls a thread's loops over its elements and holds an input it reads again from the
    first read to the last (``occupancy.REGISTERS_PER_CACHED_ELEMENT``), unless the loop has
    more steps than nvcc unrolls (``occupancy.FULL_UNROLL_STEPS``). An input that a row
    block (``infos``) reads out of the row's order (through a transpose) counts twice: each
    of its elements also keeps an address of its own (fuzz case g1337 spilled at the cap),
    and so does one read through a broadcast of fewer elements than the row.
    An input every reader reads one element of per row (a LayerNorm backward's ``rstd``)
    counts once: every step reads that element."""
    reread = reread_params(sch, func, dec)
    kept = _kept_elements(sch, reread, mapping, infos)
    steps = _steps(mapping)
    return ([p.name + (" read out of order or wrapped, counted twice"
                       if kept[p.name] > steps * mapping.vector else
                       ", one element per row" if kept[p.name] == 1 else "")
             for p in reread], sum(kept.values()))


def _steps(mapping: ThreadMapping) -> int:
    """Steps of a thread's loop over the elements of a row under ``mapping``."""
    return -(-mapping.row_length // (mapping.threads_per_row * mapping.vector))


def _kept_elements(sch: s_tir.Schedule, reread: list[tirx.Buffer], mapping: ThreadMapping,
                   infos: dict[str, BlockRows]) -> dict[str, int]:
    """Elements of each of the ``reread`` inputs one thread keeps in registers per row
    (``register_cache``); none where its loops have a run-time extent (nothing unrolled) or
    more steps than nvcc unrolls."""
    steps = _steps(mapping)
    if mapping.length_expr or steps > FULL_UNROLL_STEPS:
        return {p.name: 0 for p in reread}
    rows = mapping.rows
    return {p.name: 1 if _read_once_per_row(sch, p, infos, rows) else
            steps * mapping.vector * (2 if _read_out_of_order(sch, p, infos, rows)
                                      or _read_wrapped(sch, p, infos, rows) else 1)
            for p in reread}


def rolled_rereads(sch: s_tir.Schedule, func: tirx.PrimFunc, dec: Decisions,
                   mapping: ThreadMapping, infos: dict[str, BlockRows], cached: int,
                   why: str) -> tuple[frozenset[str], int]:
    """Where a thread's ``cached`` elements of re-read inputs do not fit its registers
    (``register_cache``; ``why``): roll the loops over its elements that read them
    (``unrolling.bound_unrolling``), which then read them again from global memory (L2), a
    ``ROLLED_REREADS`` demotion. Returns those inputs (all but the ones read one element per
    row) and the elements a thread still keeps per row (``cached`` when it rolls none). An
    input held in
    registers (``dec.held``) among them is demoted to global memory: its copy is indexed by
    the loops, and only whole ones keep it in registers (rolled, a LayerNorm backward of
    width 10240 took a 112 B stack frame). Nothing to roll for rows a thread walks in one
    step."""
    reread = reread_params(sch, func, dec)
    kept = _kept_elements(sch, reread, mapping, infos)
    rolled = frozenset(p.name for p in reread if kept[p.name] > 1)
    if _steps(mapping) <= 1 or not rolled:
        return frozenset(), cached
    for h in [h for h in dec.held if h.name in rolled]:
        dec.held.remove(h)
        dec.global_reads.append(Buffer(h.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       "demoted: re-read from global memory in rolled loops"))
    left = sum(n for name, n in kept.items() if name not in rolled)
    dec.demotions.append(Demotion(DemotionKind.ROLLED_REREADS, ", ".join(sorted(rolled)),
                                  cached, left, detail=why))
    return rolled, left


def reread_params(sch: s_tir.Schedule, func: tirx.PrimFunc, dec: Decisions
                  ) -> list[tirx.Buffer]:
    """The inputs of ``func`` that several blocks read from global memory at known places
    (neither staged on chip nor written)."""
    on_chip = {s.name for s in dec.staged} | {b.name for b in dec.block_shared}
    written = {p.name for p in written_params(func, sch)}
    # a gather's read is of one element at a place known at run time only: nothing for a
    # register to keep (a cross-entropy reads its row once, then the target's logit)
    return [p for p in buffer_params(func)
            if p.name not in on_chip | written and len(readers(sch, p, affine=True)) > 1]


def on_chip_inputs(sch: s_tir.Schedule, func: tirx.PrimFunc, dec: Decisions,
                   cached: int) -> set[str]:
    """The inputs a thread does not stream from global memory at each read: staged in
    shared memory, held in registers, or (with ``cached`` elements per thread,
    ``register_cache``) re-read and kept in registers by nvcc."""
    kept = {s.name for s in dec.staged} | {b.name for b in dec.block_shared} \
        | {h.name for h in dec.held}
    return kept | ({p.name for p in reread_params(sch, func, dec)} if cached else set())


def shared_reads(dec: Decisions) -> frozenset[str]:
    """The Regional intermediates a thread loads from shared memory beside a row it holds in
    registers, which ``unrolling.bound_unrolling`` counts in flight as streamed inputs: a
    transpose of one over rows of 20000 beside 20 held elements a thread of 1024 spilled
    36 B on sm_80 unrolled whole (fuzz 12028:363 at that width). None without a held row:
    a LayerNorm's last phase over sub-rows of 8192, 4 steps of a float4 of a streamed scale
    and shift and of a Regional intermediate unrolled at a time, keeps within 64 registers
    (fuzz graph 9005:41)."""
    return frozenset(s.name for s in dec.regional) if dec.held else frozenset()


def _reads_of(sch: s_tir.Schedule, param: tirx.Buffer, infos: dict[str, BlockRows]
              ) -> list[tuple[BlockRows | None, tvm.ir.TensorRegion]]:
    """Every read region of ``param``, with its reader's rows (None for a block that is not
    among ``infos``)."""
    return [(infos.get(name_of(sch, block)), region) for block in readers(sch, param)
            for region in sch.get(block).reads if region.source.same_as(param)]


def _read_wrapped(sch: s_tir.Schedule, param: tirx.Buffer, infos: dict[str, BlockRows],
                  rows: int) -> bool:
    """Whether a row block reads ``param`` through a broadcast of fewer elements (but more
    than one) than its row: a thread's places in the input wrap around it, each address
    computed on its own (a LayerNorm over (16, 7, 256) of a (7, 256) input Expanded: 28
    elements held per thread at a cap of 32 spilled 20 B, fuzz graph 8111:725)."""
    return any(info is not None and 1 < row_elements(param, rows) < info.elements
               and access_rows(info, region, rows) is RowAccess.ALIGNED
               for info, region in _reads_of(sch, param, infos))


def _read_once_per_row(sch: s_tir.Schedule, param: tirx.Buffer, infos: dict[str, BlockRows],
                       rows: int) -> bool:
    """Whether every reader of ``param`` is a row block (``infos``) reading one element of
    it per row (``rows.reads_one_per_row``)."""
    regions = _reads_of(sch, param, infos)
    return bool(regions) and all(info is not None and reads_one_per_row(info, region, rows)
                                 for info, region in regions)


def _read_out_of_order(sch: s_tir.Schedule, param: tirx.Buffer, infos: dict[str, BlockRows],
                       rows: int) -> bool:
    return any(info is not None and access_rows(info, region, rows) is RowAccess.ALIGNED
               and row_elements(param, rows) == info.elements
               and not reads_own_element(info, region, rows)
               for info, region in _reads_of(sch, param, infos))


def _splits_at_rows(param: tirx.Buffer, rows: int) -> bool:
    """Whether ``param``'s leading dimensions are the rows (``prefix_split``): a staged copy
    iterates over the input's own shape, and one whose rows cut a dimension cannot be
    mapped to them (ConvBERT's softmax over 128 rows of 9 read from a (2, 32, 18) input:
    "block lv25_shared does not iterate over the 128 rows first"). Such an input is read
    where it lies."""
    values = shape_values(param.shape)
    return values is None or is_symbolic(rows) or prefix_split(list(values), rows) is not None


def check_alignment(sch: s_tir.Schedule, infos: dict[str, BlockRows], rows: int,
                    among_rows: bool = False, permuted: tuple[str, ...] = (),
                    writes: bool = True) -> None:
    """Every write, and every read of a buffer the kernel produces, must stay in the row;
    with ``among_rows`` (a Global group), only reads of what the row blocks of ``infos``
    produce: the results of column phases and of combinations are read across rows by
    design. The outputs ``permuted`` may be written a whole row elsewhere
    (``row_permutation``), or element by element anywhere (a transpose back), and are then
    read by no block. Only the blocks of ``infos`` are
    checked, and only their reads without ``writes`` (sub-rows of a split row, which write
    their row's elements by design)."""
    blocks = child_blocks(sch)
    produced = {w.source.name for b in blocks
                if not among_rows or name_of(sch, b) in infos for w in sch.get(b).writes}
    for block in blocks:
        info = infos.get(name_of(sch, block))
        if info is None:  # not a row block (a column reduction of a Global group)
            continue
        stmt = sch.get(block)
        for region in stmt.writes if writes else ():
            if region.source.name in permuted and (permuted_row(info, region, rows)
                                                   or permuted_elements(info, region)):
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
                raise CrossRowRead(f"block {info.name} reads {region.source.name} from other "
                                   "rows")


def decide_inlining(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                    rows: int, dec: Decisions) -> None:
    """Local (inline) or Regional (shared) for every block that writes an intermediate."""
    for block in reversed(child_blocks(sch)):
        name = name_of(sch, block)
        info = infos.get(name)
        if info is None or writes_param(sch, func, block):
            continue
        if info.is_reduction:  # each result of a reduction of several (an online softmax)
            for region in sch.get(block).writes:
                dec.results.append(Staging(region.source.name, BufferRole.INTERMEDIATE,
                                           row_elements(region.source, rows)
                                           * bytes_of(region.source), "reduction result",
                                           name))
            continue
        buffer = sch.get(block).writes[0].source
        users = readers(sch, buffer, exclude=block)
        sites = sum(load_count(sch, u, buffer) for u in users)
        gathered = len(readers(sch, buffer, exclude=block, affine=True)) < len(users)
        if gathered or not info.element_iters or (len(users) == 1 and sites == 1) or not sites \
                or _widened_input(sch, func, block) \
                or _read_across_rows(sch, infos, users, buffer, rows):
            try:
                inline(sch, block)
                dec.inlined.append(name)
                continue
            except Exception as err:  # noqa: BLE001 - not inlinable: keep it Regional
                if gathered:
                    raise Unstitchable(f"{buffer.name} is read at data-dependent places and "
                                       f"cannot be recomputed: {error_summary(err)}") from err
        note = f"read by {len(users)} block(s) at {sites} place(s)"
        dec.regional.append(Staging(buffer.name, BufferRole.INTERMEDIATE,
                                    row_elements(buffer, rows) * bytes_of(buffer), note, name))


def _read_across_rows(sch: s_tir.Schedule, infos: dict[str, BlockRows], users: list,
                      buffer: tirx.Buffer, rows: int) -> bool:
    """Whether a row block (``infos``) reads ``buffer`` from other rows than its own: a
    transpose of a split row's elements reads them from the other blocks' sub-rows (fuzz
    graph 8111:151), which only a recomputation from global memory gives it."""
    return any(access_rows(infos[name_of(sch, u)], r, rows) is not RowAccess.ALIGNED
               for u in users if name_of(sch, u) in infos
               for r in sch.get(u).reads if r.source.same_as(buffer))


def _widened_input(sch: s_tir.Schedule, func: tirx.PrimFunc, block: s_tir.SBlockRV) -> bool:
    """Whether ``block`` only casts an input's element to a wider type (float16 to float32
    before a softmax): inlined, its readers stage the narrower input instead of the wide
    copy (half the shared memory), and the rows move in vectors as wide as the input
    allows."""
    stmt = sch.get(block)
    body = stmt.body
    if not (isinstance(body, tirx.BufferStore) and isinstance(body.value, tirx.Cast)):
        return False
    load = body.value.value
    params = {p.name for p in buffer_params(func)}
    return isinstance(load, tvm.ir.TensorLoad) and load.source.name in params \
        and load.source.dtype.bits < body.value.ty.dtype.bits \
        and len(load.indices) == len(body.indices) \
        and all(a.same_as(b) for a, b in zip(load.indices, body.indices, strict=True))


def decide_staging(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                   rows: int, dec: Decisions, levels: dict[str, int] | None = None) -> None:
    """Inputs read at several places of their row are staged per row; inputs that whole runs
    of rows read alike are candidates for staging once per thread block. Only inputs whose
    readers all walk rows (``infos``) are staged, and with ``levels`` (the phases of a Global
    group) only those read in one phase: staged data does not outlive its phase."""
    written = {p.name for p in written_params(func, sch)}
    for param in buffer_params(func):
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
        if not regions or not sites:  # not read once simplified: nothing to stage
            continue
        kinds = {access_rows(info, r, rows) for info, r in regions}
        span = min(rows_sharing(info, r) for info, r in regions)
        if kinds == {RowAccess.ALIGNED} and span == 1 and _splits_at_rows(param, rows):
            per_row = row_elements(param, rows)
            own = all(reads_own_element(info, r, rows) for info, r in regions)
            if sites >= 2:
                dec.staged.append(Staging(param.name, BufferRole.INPUT, per_row * bytes_of(param),
                                          f"read at {sites} places in the row", own=own))
            elif any(info.elements > per_row for info, _ in regions):
                dec.staged.append(Staging(param.name, BufferRole.INPUT, per_row * bytes_of(param),
                                          "broadcast over the row: read once per row"))
        elif sites >= 2 and all(permuted_row(info, r, rows) for info, r in regions) \
                and same_permuted_rows(regions, rows):
            dec.staged.append(Staging(param.name, BufferRole.INPUT,
                                      row_elements(param, rows) * bytes_of(param),
                                      f"read at {sites} places in a permuted row",
                                      permuted=True))
        elif span > 1 and len(param.shape) > 0:
            size = elements_of(param) * span // rows * bytes_of(param)
            dec.block_shared.append(BlockShared(param.name, max(size, bytes_of(param)), span))
        elif sites >= 2:
            dec.global_reads.append(Buffer(param.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"read at {sites} places, not row-aligned"))


def _unbounded_rows(sch: s_tir.Schedule, dec: Decisions) -> None:
    """Rows of symbolic length have no size to stage: inputs staged per row (or per block,
    a row's worth) are re-read from
    global memory (each pass over the row is served by the L1 and L2 caches as far as they
    hold it) and Regional intermediates are recomputed by their readers; one that cannot be
    recomputed makes the group unstitchable."""
    unsized = [*dec.staged, *(b for b in dec.block_shared if is_symbolic(b.size))]
    for s in unsized:
        dec.global_reads.append(Buffer(s.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       "symbolic row length: re-read from global memory"))
    dec.staged.clear()
    dec.block_shared = [b for b in dec.block_shared if not is_symbolic(b.size)]
    for s in list(dec.regional):
        try:
            inline(sch, sch.get_sblock(s.block))
        except Exception as err:  # noqa: BLE001 - not inlinable: no stitching
            raise Unstitchable(f"{s.name} is read at several places of a row of symbolic "
                               "length, which cannot be staged, and cannot be recomputed: "
                               f"{error_summary(err)}") from err
        dec.regional.remove(s)
        dec.inlined.append(s.block)


def _bounded_rows(sch: s_tir.Schedule, dec: Decisions, length: int, bound: int) -> None:
    """Rows of symbolic ``length`` (its stand-in) at most ``bound`` long: what is staged per
    row with the row's size is sized for ``bound``; the rest is re-read or recomputed as for
    unbounded rows (``_unbounded_rows``), so that the two bodies differ in that alone."""
    unsized = Decisions()
    for s in [*dec.staged, *dec.regional]:
        per_row = s.per_row // length * bound
        if s.per_row % length or is_symbolic(per_row) or not is_symbolic(s.per_row):
            (dec.staged if s in dec.staged else dec.regional).remove(s)
            (unsized.staged if s.role is BufferRole.INPUT else unsized.regional).append(s)
            continue
        s.per_row = per_row
        s.note += f", sized for the declared bound {bound}"
    unsized.block_shared = [b for b in dec.block_shared if is_symbolic(b.size)]
    dec.block_shared = [b for b in dec.block_shared if not is_symbolic(b.size)]
    _unbounded_rows(sch, unsized)
    dec.global_reads += unsized.global_reads
    dec.inlined += unsized.inlined


def _single_value(buffer: tirx.Buffer) -> bool:
    """Whether ``buffer`` holds one value. Every thread reads that same word, which the
    cache serves; staging it would be a copy loop without loops."""
    return all(isinstance(d, tirx.IntImm) and int(d) == 1 for d in buffer.shape)


def _every_row(dec: Decisions, rows: int) -> list[BlockShared]:
    """The inputs staged per block that every one of the ``rows`` rows reads alike (a
    LayerNorm's gamma): a block stages them whatever rows it holds, a partial last block's
    too, where the data of inputs read alike by runs of rows (a mask per batch) would depend
    on rows past the end."""
    return [b for b in dec.block_shared if b.span == rows]


def _reread_block_inputs(dec: Decisions, why: str, kept: list[BlockShared]) -> None:
    """Re-read every input staged per block but those ``kept``: ``why`` there is no vertical
    packing."""
    for b in dec.block_shared:
        if b in kept:
            continue
        runs = "every row" if is_symbolic(b.span) else f"runs of {b.span} rows"
        dec.global_reads.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       f"read alike by {runs}; {why}, no vertical packing: "
                                       "re-read (served by the L2 cache)"))
    dec.block_shared[:] = kept


def _pack_horizontally(dec: Decisions, mapping: ThreadMapping, gpu: GPU, budget: int,
                       max_threads: int) -> ThreadMapping:
    """Rows of more than a warp each whose block stages inputs read alike by runs of rows
    (LayerNorm's gamma and beta) are packed several per block, as short rows are, when that
    leaves fewer blocks once ``_pack_vertically`` has walked its steps: each block's one read
    of those inputs then serves more rows. 8192 rows of 768 take 256 blocks of 8 rows x 64
    threads walking 4 steps, not 2048 blocks of one row, and gamma and beta move 3% of the
    kernel's compulsory bytes, not 25%; the threads of the grid are as many either way. A
    packing is taken only if it leaves the fewest blocks, a block for every SM, the register
    cap of one row per block, at most ``PACKED_ROW_THREADS`` threads and shared memory
    within ``budget``."""
    symbolic = is_symbolic(mapping.rows)
    if symbolic:  # its block then stages the inputs every row reads alike, and only those
        dec = replace(dec, block_shared=_every_row(dec, mapping.rows))
    if not dec.block_shared or mapping.rows_per_block != 1 \
            or any(s.permuted for s in dec.staged) \
            or mapping.threads_per_row <= WARP_SIZE or mapping.length_expr \
            or (not symbolic and any(is_symbolic(b.span) for b in dec.block_shared)) \
            or shared_bytes_of(dec, mapping) > budget:
        return mapping
    span = min(b.span for b in dec.block_shared)

    def blocks_and_cap(packed: ThreadMapping) -> tuple[int, int]:
        launch = launch_of(gpu, packed.threads_per_block, shared_bytes_of(dec, packed))
        steps = 1 if symbolic else row_steps(packed, launch.wave, span)
        return mapping.rows // (packed.rows_per_block * steps), launch.max_registers

    fewest, cap = blocks_and_cap(mapping)
    best, packed = mapping, 2
    while packed * mapping.threads_per_row <= min(max_threads, PACKED_ROW_THREADS) \
            and (symbolic or span % packed == 0):
        candidate = replace(mapping, rows_per_block=packed)
        packed *= 2
        if shared_bytes_of(dec, candidate) > budget:
            break
        blocks, registers = blocks_and_cap(candidate)
        if gpu.sms <= blocks < fewest and registers >= cap:
            best, fewest = candidate, blocks
    return best


def _pack_vertically(dec: Decisions, mapping: ThreadMapping, gpu: GPU,
                     chosen: int | None = None) -> ThreadMapping:
    """Walk several groups of rows per block in sequence (vertical packing): as few as keep
    the grid within one wave, or, when inputs are read alike by runs of rows, as many as
    leave half a wave of blocks, so that those are staged once per block; inputs that no
    block then shares are left in global memory. ``chosen`` fixes the steps (a divisor of
    the block's row groups)."""
    partial = is_symbolic(mapping.rows) or mapping.rows % mapping.rows_per_block != 0
    if chosen is not None and chosen != 1 and (
            partial or chosen > MAX_ROW_STEPS
            or (mapping.rows // mapping.rows_per_block) % chosen):
        raise Unstitchable(f"{chosen} row steps do not divide the row groups of "
                           f"{mapping.rows} rows, {mapping.rows_per_block} per block")
    if partial:  # a guarded last block: one step each
        _reread_block_inputs(dec, "symbolic row count" if is_symbolic(mapping.rows)
                             else "the last block is partial", _every_row(dec, mapping.rows))
        return replace(mapping, row_steps=1)
    wave = launch_of(gpu, mapping.threads_per_block, shared_bytes_of(dec, mapping)).wave
    if chosen is not None:
        mapping = replace(mapping, row_steps=chosen)
    elif dec.block_shared:
        span = min(b.span for b in dec.block_shared)
        mapping = replace(mapping, row_steps=row_steps(mapping, wave, span))
        if mapping.rows_per_block * mapping.row_steps == 1:
            # too few rows for half a wave of blocks sharing them: the block still walks
            # the steps that fit a wave, and stages the inputs for them if their runs allow
            mapping = replace(mapping, row_steps=row_steps(mapping, wave))
    rows_per_block = mapping.rows_per_block * mapping.row_steps
    for b in list(dec.block_shared):
        if rows_per_block == 1 or b.span % rows_per_block:
            dec.block_shared.remove(b)
            dec.global_reads.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                           f"shared by runs of {b.span} rows, one row per "
                                           "block: re-read (served by the L2 cache)"))
    if not dec.block_shared and chosen is None:
        mapping = replace(mapping, row_steps=row_steps(mapping, wave, guarded=True))
    return mapping
