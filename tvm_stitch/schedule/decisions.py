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
  demoted to re-reads from global memory (largest first), then those staged per block, then
  packed rows are halved, then Regional intermediates are recomputed (inlined) instead; if it
  still does not fit the group needs Global stitching, which comes next, and falls back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod

from tvm import s_tir, tirx
from tvm.target import Target

from ..lowering import lower
from ..plan import Buffer, Group, StorageLevel, ThreadMapping
from ..target import MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK, WARP_SIZE
from .blocks import (
    LOCAL,
    SHARED,
    add_unit_loops,
    cache_reused_outputs,
    child_blocks,
    load_count,
    name_of,
    narrow_indices,
    readers,
    written_params,
)
from .emit import emit
from .mapping import flat_mapping, row_mapping, row_steps, with_rows_per_block
from .rows import (
    BlockRows,
    Unstitchable,
    access_rows,
    block_rows,
    error_summary,
    row_elements,
    rows_sharing,
)


@dataclass
class _Staging:
    """A buffer kept in shared memory and its bytes for one row."""

    name: str
    role: str
    per_row: int
    note: str = ""
    block: str = ""  # writer block (for intermediates that may be recomputed)

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
    block_shared: list[_BlockShared] = field(default_factory=list)
    global_reads: list[Buffer] = field(default_factory=list)
    demotions: list[str] = field(default_factory=list)
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


def decide(func: tirx.PrimFunc, group: Group, rows: int | None,
           target: Target | None = None) -> Group:
    """``group`` completed with its kernel decisions for ``func``; raises Unstitchable.

    The decisions are checked by scheduling ``func`` with them once (``emit``).
    """
    budget, max_threads = target_budget(target)
    func = narrow_indices(func)
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    _check_flat_structure(sch)
    reused = cache_reused_outputs(sch, func, LOCAL if rows is None else SHARED)
    if rows is None:
        done = _decide_flat(sch, func, group, reused, max_threads)
    else:
        done = _decide_rows(sch, func, group, rows, reused, budget, max_threads)
    try:
        scheduled = emit(func, done).mod["main"]
    except Unstitchable:
        raise
    except Exception as err:  # noqa: BLE001 - any schedule error means: fall back
        raise Unstitchable(f"scheduling failed: {error_summary(err)}") from err
    if target is not None:
        try:
            lower(scheduled, done.function or "stitched", target)
        except Exception as err:  # noqa: BLE001 - the kernel must build, or fall back
            raise Unstitchable(f"lowering failed: {error_summary(err)}") from err
    return done


def _check_flat_structure(sch: s_tir.Schedule) -> None:
    for block in child_blocks(sch):
        if sch.get_child_blocks(block):
            raise Unstitchable(f"block {name_of(sch, block)} has nested blocks")
        if len(sch.get_loops(block)) != len(sch.get(block).iter_vars):
            raise Unstitchable(f"block {name_of(sch, block)} is not in normal form")


def _decide_flat(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, reused: list[str],
                 max_threads: int) -> Group:
    """Element-wise group: each thread owns one element. A producer read once is inlined; one
    read more often is computed once into a register of the thread, if every reader reads the
    thread's own element (else it is recomputed); inputs read at several places likewise."""
    sizes = {prod(int(d) for d in p.shape) for p in written_params(func, sch)}
    if len(sizes) != 1:
        raise Unstitchable(f"outputs of different sizes {sorted(sizes)}")
    size = sizes.pop()
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
            kept.append(Buffer(buffer.name, "intermediate", StorageLevel.REGISTER, 0, note,
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
            staged.append(Buffer(param.name, "input", StorageLevel.REGISTER, 0,
                                 f"read at {sites} places"))
    buffers = tuple(Buffer(n, "output", StorageLevel.REGISTER, 0,
                           "written out and read inside the kernel") for n in reused)
    return replace(group, mapping=flat_mapping(size, max_threads), inlined=tuple(inlined),
                   buffers=buffers + tuple(kept) + tuple(staged), shared_bytes=0,
                   shared_budget=0)


def _element_aligned(sch: s_tir.Schedule, blocks: list, buffer: tirx.Buffer, size: int
                     ) -> bool:
    """Whether every access of ``blocks`` to ``buffer`` touches the element the block is at,
    counting elements of the ``size``-element iteration space in row-major order."""
    for block in blocks:
        try:
            info = block_rows(sch, block, size)
        except Unstitchable:
            return False
        stmt = sch.get(block)
        for region in (*stmt.reads, *stmt.writes):
            if region.source.same_as(buffer) and access_rows(info, region, size) != "aligned":
                return False
    return True


def _writes_param(sch: s_tir.Schedule, func: tirx.PrimFunc, block) -> bool:
    return any(any(p.same_as(w.source) for p in func.params) for w in sch.get(block).writes)


def _decide_rows(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, rows: int,
                 reused: list[str], budget: int, max_threads: int) -> Group:
    """Row group: every block walks the ``rows`` rows first (checked), then its elements."""
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    _check_alignment(sch, infos, rows)
    dec = _Decisions()
    _decide_inlining(sch, func, infos, rows, dec)
    infos = {name_of(sch, b): block_rows(sch, b, rows) for b in child_blocks(sch)}
    _decide_staging(sch, func, infos, rows, dec)
    dec.reductions = sum(1 for info in infos.values() if info.is_reduction)
    length = max(info.elements for info in infos.values())
    mapping = row_mapping(rows, length, rows, max_threads)
    mapping = _pack_vertically(dec, mapping)
    mapping = _fit_budget(sch, dec, mapping, budget)
    return replace(group, mapping=mapping, inlined=tuple(dec.inlined),
                   buffers=_buffers(dec, mapping, reused),
                   shared_bytes=_shared_bytes(dec, mapping), shared_budget=budget,
                   demotions=tuple(dec.demotions))


def _check_alignment(sch: s_tir.Schedule, infos: dict[str, BlockRows], rows: int) -> None:
    """Every write, and every read of a buffer the kernel produces, must stay in the row."""
    produced = {w.source.name for b in child_blocks(sch) for w in sch.get(b).writes}
    for block in child_blocks(sch):
        info = infos[name_of(sch, block)]
        stmt = sch.get(block)
        for region in stmt.writes:
            if access_rows(info, region, rows) != "aligned":
                raise Unstitchable(f"block {info.name} writes {region.source.name} outside "
                                   "its row")
        for region in stmt.reads:
            if region.source.name in produced and access_rows(info, region, rows) != "aligned":
                raise Unstitchable(f"block {info.name} reads {region.source.name} from other "
                                   "rows: needs Global stitching (next issue)")


def _decide_inlining(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                     rows: int, dec: _Decisions) -> None:
    """Local (inline) or Regional (shared) for every block that writes an intermediate."""
    for block in reversed(child_blocks(sch)):
        name = name_of(sch, block)
        info = infos[name]
        if _writes_param(sch, func, block):
            continue
        buffer = sch.get(block).writes[0].source
        if info.is_reduction:
            dec.results.append(_Staging(buffer.name, "intermediate",
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
        dec.regional.append(_Staging(buffer.name, "intermediate",
                                     row_elements(buffer, rows) * _bytes(buffer), note, name))


def _decide_staging(sch: s_tir.Schedule, func: tirx.PrimFunc, infos: dict[str, BlockRows],
                    rows: int, dec: _Decisions) -> None:
    """Inputs read at several places of their row are staged per row; inputs that whole runs
    of rows read alike are candidates for staging once per thread block."""
    written = {p.name for p in written_params(func, sch)}
    for param in func.params:
        if param.name in written:
            continue
        users = readers(sch, param, affine=True)
        sites = sum(load_count(sch, u, param) for u in users)
        regions = [(infos[name_of(sch, u)], r) for u in users for r in sch.get(u).reads
                   if r.source.same_as(param)]
        if not regions:
            continue
        kinds = {access_rows(info, r, rows) for info, r in regions}
        span = min(rows_sharing(info, r) for info, r in regions)
        if kinds == {"aligned"} and span == 1:
            if sites >= 2:
                dec.staged.append(_Staging(param.name, "input",
                                           row_elements(param, rows) * _bytes(param),
                                           f"read at {sites} places in the row"))
        elif span > 1 and len(param.shape) > 0:
            size = prod(int(d) for d in param.shape) * span // rows * _bytes(param)
            dec.block_shared.append(_BlockShared(param.name, max(size, _bytes(param)), span))
        elif sites >= 2:
            dec.global_reads.append(Buffer(param.name, "input", StorageLevel.GLOBAL, 0,
                                           f"read at {sites} places, not row-aligned"))


def _pack_vertically(dec: _Decisions, mapping: ThreadMapping) -> ThreadMapping:
    """Walk several rows per thread in sequence when inputs shared by runs of rows can then
    be read once per block; inputs that no block shares are left in global memory."""
    if dec.block_shared:
        span = min(b.span for b in dec.block_shared)
        mapping = replace(mapping, row_steps=row_steps(mapping, span))
    rows_per_block = mapping.rows_per_block * mapping.row_steps
    for b in list(dec.block_shared):
        if rows_per_block == 1 or b.span % rows_per_block:
            dec.block_shared.remove(b)
            dec.global_reads.append(Buffer(b.name, "input", StorageLevel.GLOBAL, 0,
                                           f"shared by runs of {b.span} rows, one row per "
                                           "block: re-read (served by the L2 cache)"))
    return mapping


def _bytes(buffer: tirx.Buffer) -> int:
    return max(buffer.dtype.bits * buffer.dtype.lanes // 8, 1)


def _shared_bytes(dec: _Decisions, mapping: ThreadMapping) -> int:
    rpb = mapping.rows_per_block
    data = sum(s.bytes_for(rpb) for s in dec.regional + dec.staged)
    data += sum(b.size for b in dec.block_shared)
    warps = -(-mapping.threads_per_block // WARP_SIZE)
    return data + dec.reductions * warps * 4


def _fit_budget(sch: s_tir.Schedule, dec: _Decisions, mapping: ThreadMapping,
                budget: int) -> ThreadMapping:
    """Demote staging one buffer at a time until the block's shared memory fits ``budget``."""
    while _shared_bytes(dec, mapping) > budget:
        used = _shared_bytes(dec, mapping)
        if dec.staged:
            victim = max(dec.staged, key=lambda s: s.bytes_for(mapping.rows_per_block))
            dec.staged.remove(victim)
            dec.global_reads.append(Buffer(victim.name, "input", StorageLevel.GLOBAL, 0,
                                           "demoted: re-read from global memory"))
            dec.demotions.append(f"input {victim.name} re-read from global memory "
                                 f"({used} B of shared memory > {budget} B)")
        elif dec.block_shared:
            victim = max(dec.block_shared, key=lambda b: b.size)
            dec.block_shared.remove(victim)
            dec.global_reads.append(Buffer(victim.name, "input", StorageLevel.GLOBAL, 0,
                                           "demoted: re-read from global memory"))
            dec.demotions.append(f"input {victim.name} (shared by the block's rows) re-read "
                                 f"from global memory ({used} B > {budget} B)")
            if not dec.block_shared:
                mapping = replace(mapping, row_steps=1)
        elif mapping.rows_per_block > 1:
            dec.demotions.append(f"rows per block {mapping.rows_per_block} -> "
                                 f"{mapping.rows_per_block // 2} ({used} B > {budget} B)")
            mapping = with_rows_per_block(mapping, mapping.rows_per_block // 2)
        elif dec.regional:
            victim = max(dec.regional, key=lambda s: s.per_row)
            try:
                sch.compute_inline(sch.get_sblock(victim.block))
            except Exception as err:  # noqa: BLE001
                raise Unstitchable(
                    f"{used} B of shared memory > {budget} B and {victim.name} cannot be "
                    "recomputed: needs Global stitching (next issue)") from err
            dec.regional.remove(victim)
            dec.inlined.append(victim.block)
            dec.demotions.append(f"intermediate {victim.name} recomputed by its readers "
                                 f"({used} B > {budget} B)")
        else:
            raise Unstitchable(f"{used} B of shared memory > {budget} B: needs Global "
                               "stitching (next issue)")
    return mapping


def _buffers(dec: _Decisions, mapping: ThreadMapping, reused: list[str]) -> tuple[Buffer, ...]:
    rpb = mapping.rows_per_block
    out: list[Buffer] = []
    for name in reused:
        cached = f"{name}_shared"
        kept = any(s.name == cached for s in dec.regional)
        level = StorageLevel.SHARED if kept else StorageLevel.REGISTER
        out.append(Buffer(name, "output", level, 0, "written out and read inside the kernel"))
    for s in dec.regional + dec.staged:
        out.append(Buffer(s.name, s.role, StorageLevel.SHARED, s.bytes_for(rpb), s.note,
                          s.block))
    for s in dec.results:
        out.append(Buffer(s.name, s.role, StorageLevel.REGISTER, 0, s.note, s.block))
    rows = mapping.rows_per_block * mapping.row_steps
    for b in dec.block_shared:
        out.append(Buffer(b.name, "input", StorageLevel.SHARED, b.size,
                          f"read alike by runs of {b.span} rows: once per block of {rows} rows",
                          per_block=True))
    out.extend(dec.global_reads)
    return tuple(out)
