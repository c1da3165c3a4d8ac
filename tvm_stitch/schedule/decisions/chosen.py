"""A chooser's fixed choices (``plan.Choices``) applied over the heuristic's: each checked,
an illegal one an Unstitchable, so that a wrong candidate is refused rather than built."""

from __future__ import annotations

from dataclasses import fields, replace

from tvm import s_tir

from ...plan import Buffer, BufferRole, Choices, MappingKind, StorageLevel, ThreadMapping
from ...target import WARP_SIZE
from ..rows import Unstitchable
from .budget import hold
from .state import Decisions

FLAT_CHOICES = frozenset({"block_threads", "vector", "walk_rows"})
"""What an element-wise group's choices may fix (``walk_rows`` only as False)."""

WALK_CHOICES = frozenset({"row_steps", "vector", "walk_rows"})
"""What the choices of an element-wise group that walks its rows may fix."""

ROW_CHOICES = frozenset({"threads_per_row", "rows_per_block", "row_steps", "vector",
                         "split_parts", "reread", "held", "vector_reads", "online_softmax",
                         "online_variance", "kept_transposes"})
"""What a row group's choices may fix."""

GLOBAL_CHOICES = frozenset({"threads_per_row", "vector", "split_parts", "column_tiles",
                            "reread", "online_softmax", "online_variance", "cluster",
                            "ragged_tiles", "kept_transposes"})
"""What a Global group's choices may fix (a split row group's: not its threads; only a split
row group's: its clusters)."""


def check_applicable(choices: Choices, allowed: frozenset[str], kind: str) -> None:
    """Raise Unstitchable for a choice that a group of ``kind`` does not make: ignoring it
    would record a kernel other than the one the choices name."""
    fixed = sorted(f.name for f in fields(choices) if getattr(choices, f.name)
                   not in (None, ()) and f.name not in allowed)
    if fixed:
        raise Unstitchable(f"{kind} group has no choice of {', '.join(fixed)}")


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def chosen_threads(default: int, chosen: int | None, max_threads: int, what: str) -> int:
    """``chosen`` threads (a power of two within ``max_threads``) if given, else
    ``default``."""
    if chosen is None:
        return default
    if not _power_of_two(chosen) or chosen > max_threads:
        raise Unstitchable(f"{chosen} {what}: not a power of two up to {max_threads}")
    return chosen


def chosen_vector(widest: int, choices: Choices) -> int:
    """The elements per access ``choices`` fixes, at most ``widest`` (the widest the rows
    and dtypes allow, a power of two) and dividing it; ``widest`` when it fixes none."""
    if choices.vector is None:
        return widest
    if not _power_of_two(choices.vector) or widest % choices.vector:
        raise Unstitchable(f"vectors of {choices.vector}: the rows take at most {widest}")
    return choices.vector


def chosen_row_mapping(mapping: ThreadMapping, choices: Choices, max_threads: int
                       ) -> ThreadMapping:
    """``mapping`` (the heuristic's for a row group) with the threads per row and the rows
    per block ``choices`` fixes: more than a warp per row is a block per row unless the
    choices pack rows; up to a warp per row packs rows (the heuristic's packing, when it
    still fits and the choices fix none). Packed rows need not divide the row count: the last
    block guards its rows past the end, so block sizes may follow occupancy (30 rows of 8
    threads)."""
    if choices.threads_per_row is None and choices.rows_per_block is None:
        return mapping
    per_row = chosen_threads(mapping.threads_per_row, choices.threads_per_row, max_threads,
                             "threads per row")
    packed = choices.rows_per_block
    if packed is None:
        packed = mapping.rows_per_block if per_row * mapping.rows_per_block <= max_threads \
            and per_row <= WARP_SIZE else 1
    if packed < 1 or per_row * packed > max_threads:
        raise Unstitchable(f"{packed} rows of {per_row} threads per block: more than "
                           f"{max_threads} threads")
    kind = MappingKind.BLOCK_PER_ROW if per_row > WARP_SIZE else MappingKind.WARP_PER_ROW
    if mapping.kind is MappingKind.STRIDED_ROWS:  # the rows stay across a warp's lanes
        kind = MappingKind.STRIDED_ROWS
    return replace(mapping, kind=kind, threads_per_row=per_row, rows_per_block=packed)


def chosen_column_tiles(options: list[int], choices: Choices) -> list[int]:
    """The column tile options (``tiles.column_tile_options``) narrowed to the one
    ``choices`` fixes (none for 1)."""
    if choices.column_tiles is None:
        return options
    if choices.column_tiles == 1:
        return []
    if choices.column_tiles not in options:
        raise Unstitchable(f"{choices.column_tiles} column tiles: the row phases take "
                           f"{options or 'none'}")
    return [choices.column_tiles]


def hold_chosen(sch: s_tir.Schedule, dec: Decisions, mapping: ThreadMapping,
                choices: Choices) -> None:
    """Hold the inputs ``choices`` holds in their threads' registers instead of staging them
    per row (``budget.hold``: only inputs whose readers read their own elements, few enough
    per thread)."""
    for name in choices.held:
        staged = next((s for s in dec.staged if s.name == name), None)
        if staged is None:
            raise Unstitchable(f"input {name} is not staged per row: nothing to hold")
        dec.staged.remove(staged)
        if not hold(sch, dec, staged, mapping):
            raise Unstitchable(f"input {name} cannot be held in registers: a reader reads "
                               "other elements, or a thread would hold too many")


def reread_chosen(dec: Decisions, choices: Choices) -> None:
    """Move the inputs ``choices`` re-reads from their on-chip staging to global reads."""
    for name in choices.reread:
        staged = [s for s in dec.staged if s.name == name]
        shared = [b for b in dec.block_shared if b.name == name]
        if not staged and not shared:
            raise Unstitchable(f"input {name} is not staged: nothing to re-read")
        for s in staged:
            dec.staged.remove(s)
        for b in shared:
            dec.block_shared.remove(b)
        dec.global_reads.append(Buffer(name, BufferRole.INPUT, StorageLevel.GLOBAL, 0,
                                       "re-read from global memory (chosen)"))
