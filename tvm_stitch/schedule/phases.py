"""Roles and phases of the blocks of a group with column reductions (Global stitching).

In a group whose row space is ``rows`` rows, a block is one of:

- a *row* block: it walks the rows first and reads only its own row of what the group
  produces (``rows.block_rows``), like every block of a Regional group;
- a *column* reduction: it reduces over the rows (its reduction iterators span ``rows``) and
  keeps one value per column; every thread block owns a tile of rows, so its result needs a
  partial sum per tile and a combination of all of them, across thread blocks;
- a *column-space* block: it computes from column results alone, one value per column (the
  mean's division by the row count, ``var + eps``, ``sqrt`` of it, a loss's negation);
- a *combine* block: the combination of the partials of a split row reduction (task
  splitting, ``task_split``), one value per row of the unsplit rows.

The kernel then runs in phases separated by grid barriers. Levels number them: row phase
``k`` is level ``2k`` (row tiles: row blocks, and the partial sums of column reductions),
column phase ``k`` is level ``2k + 1`` (the partials of the column reductions of row phase
``k`` combined, and the column-space blocks computed from them). A block runs in the first
phase at which everything it reads is available: a column result produced at level ``2k+1``
is available to row phase ``k + 1``. A combine block runs in the column phase after the row
phase of its partials, or, read by row blocks of one phase alone, in that row phase.

A column phase gives every column to one thread: the flattened spatial iterators of each
block, row-major, are its columns, and column ``c`` runs on thread ``c % threads`` of task
``c // threads``. A column-space block may read a column result of the same phase only where
that thread wrote it (both at the flat index of their own column, as an element-wise op
does); one that reads other columns (a transpose, a broadcast) runs in the next column
phase, a grid barrier after the blocks that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from math import prod

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV
from tvm.sym import Analyzer

from .blocks import child_blocks, name_of
from .rows import (
    BlockRows,
    RowAccess,
    Unstitchable,
    access_rows,
    block_rows,
    iters_of,
    row_element_map,
)
from .task_split import is_combine


class BlockRole(StrEnum):
    """What a block of a group with column reductions is (see the module docstring)."""

    ROW = "row"
    COLUMN = "column"
    COLUMN_SPACE = "column-space"
    COMBINE = "combine"


@dataclass
class Roles:
    """Kind and level of every block (by name); the columns of every column reduction (the
    ones it keeps) and column-space block (the ones it computes)."""

    kinds: dict[str, BlockRole] = field(default_factory=dict)
    levels: dict[str, int] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)

    @property
    def columns(self) -> dict[str, int]:
        """The columns each column reduction keeps, by block name."""
        return {n: w for n, w in self.widths.items() if self.kinds[n] is BlockRole.COLUMN}

    @property
    def combines(self) -> list[str]:
        """Blocks that sum partials of other blocks: column reductions and combine blocks."""
        return [n for n, k in self.kinds.items() if k in (BlockRole.COLUMN, BlockRole.COMBINE)]

    def of_kind(self, kind: BlockRole) -> list[str]:
        """Names of the blocks of ``kind``, in program order."""
        return [n for n, k in self.kinds.items() if k == kind]

    @property
    def global_scheme(self) -> bool:
        """Whether the group needs Global stitching (it has a column reduction or a split
        row reduction)."""
        return bool(self.combines)

    def available(self, name: str) -> int:
        """The level from which the result of block ``name`` can be read."""
        kind, level = self.kinds[name], self.levels[name]
        return level + 1 if kind is BlockRole.COLUMN else level


def _even_from(level: int) -> int:
    return level + (level % 2)


def column_reductions(sch: s_tir.Schedule, rows: int) -> list[str]:
    """Blocks that reduce over all ``rows`` rows and are not row blocks. A block whose
    leading spatial extent equals the row count passes for a row block, but if it reads
    another row than that index it is a column reduction: a sum over (B, S) of (B, S, H)
    with B x S = H, the bias gradient of a square layer (mlp_backward at ci: 2 x 32 rows of
    64), was planned as 64 row sums, wrong numbers."""
    found = []
    for block in child_blocks(sch):
        if is_combine(sch, block):
            continue
        iters = iters_of(sch, block)
        reduce = [i for i in iters if i.kind == "R"]
        if not reduce or prod(i.extent for i in reduce) != rows:
            continue
        try:
            info = block_rows(sch, block, rows)
        except Unstitchable:
            found.append(name_of(sch, block))
            continue
        if any(access_rows(info, r, rows) is RowAccess.OTHER for r in sch.get(block).reads):
            found.append(name_of(sch, block))
    return found


def normalise_column(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """Rewrite a column reduction to iterate over (row, column): its reduction iterators
    linearised into the row, its spatial ones into the column."""
    iters = iters_of(sch, block)
    row_pos = [p for p, i in enumerate(iters) if i.kind == "R"]
    col_pos = [p for p, i in enumerate(iters) if i.kind == "S"]
    if [i.kind for i in iters] == ["R", "S"]:
        return
    index_map = row_element_map(row_pos, [iters[p].size for p in row_pos],
                                col_pos, [iters[p].size for p in col_pos])
    dtype = str(iters[0].var.ty.dtype)
    sch.transform_block_layout(
        block, tirx.IndexMap.from_func(index_map, ndim=len(iters), index_dtype=dtype))


def column_view(sch: s_tir.Schedule, block: SBlockRV) -> BlockRows:
    """A normalised column reduction seen as a block over (row, column): its row iterator is
    the reduction one."""
    iters = iters_of(sch, block)
    return BlockRows(name_of(sch, block), tuple(iters), 1)


def assign_roles(sch: s_tir.Schedule, rows: int) -> Roles:
    """Kinds and levels of every block; column reductions must be normalised already.

    A combine block read by row blocks of one phase alone runs in that row phase, before
    them (each block combining the partials of its own row: ``task_split``), not in a column
    phase of its own.

    Raises Unstitchable for a block that is none of the three kinds, or a column reduction
    that reads another row than the one it reduces.
    """
    roles = Roles()
    writers: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    for block in child_blocks(sch):
        name = name_of(sch, block)
        stmt = sch.get(block)
        reads = [(writers[r.source.name], r) for r in stmt.reads if r.source.name in writers]
        produced = [p for p, _ in reads]
        kind = _kind(sch, block, rows, roles, produced)
        roles.kinds[name] = kind
        if kind is BlockRole.COLUMN:
            roles.widths[name] = column_view(sch, block).iters[1].extent
            _check_column_reads(sch, block, rows)
        elif kind in (BlockRole.COLUMN_SPACE, BlockRole.COMBINE):
            roles.widths[name] = prod(i.extent for i in iters_of(sch, block) if i.kind == "S")
        availability = [roles.available(p) for p in produced]
        if kind is BlockRole.COLUMN_SPACE:
            roles.levels[name] = max(
                roles.available(p) + (0 if _same_thread(sch, writer_block, block, region)
                                      else 2)
                for p, region in reads for writer_block in [sch.get_sblock(p)])
        elif kind is BlockRole.COMBINE:
            roles.levels[name] = max((_even_from(a) for a in availability), default=0) + 1
        else:
            roles.levels[name] = max((_even_from(a) for a in availability), default=0)
        for w in stmt.writes:
            writers[w.source.name] = name
        for producer in produced:
            consumers.setdefault(producer, []).append(name)
    for name in roles.of_kind(BlockRole.COMBINE):
        users = consumers.get(name, [])
        if users and all(roles.kinds[u] is BlockRole.ROW for u in users) \
                and len({roles.levels[u] for u in users}) == 1:
            roles.levels[name] = roles.levels[users[0]]
    return roles


def _kind(sch: s_tir.Schedule, block: SBlockRV, rows: int, roles: Roles, produced: list[str]
          ) -> BlockRole:
    if is_combine(sch, block):
        return BlockRole.COMBINE
    iters = iters_of(sch, block)
    if [i.kind for i in iters] == ["R", "S"] and iters[0].extent == rows:
        try:
            block_rows(sch, block, rows)
        except Unstitchable:
            return BlockRole.COLUMN
    column_inputs = [p for p in produced if roles.kinds[p] in (
        BlockRole.COLUMN, BlockRole.COLUMN_SPACE, BlockRole.COMBINE)]
    if column_inputs and len(column_inputs) == len(produced) \
            and all(i.kind == "S" for i in iters):
        size = prod(i.extent for i in iters)
        sizes = {prod(int(d) for d in w.source.shape)
                 for p in column_inputs for w in sch.get(sch.get_sblock(p)).writes}
        if size in sizes:
            return BlockRole.COLUMN_SPACE
    block_rows(sch, block, rows)  # raises Unstitchable: neither kind
    return BlockRole.ROW


def _same_thread(sch: s_tir.Schedule, producer: SBlockRV, consumer: SBlockRV,
                 region: tvm.ir.TensorRegion) -> bool:
    """Whether, in one column phase, ``consumer`` reads ``region`` (of a buffer ``producer``
    writes) only on the thread that wrote it: both access the buffer at the flat index of
    their own column."""
    written = [w for w in sch.get(producer).writes if w.source.same_as(region.source)]
    return bool(written) and _at_own_column(sch, producer, written[0]) \
        and _at_own_column(sch, consumer, region)


def _at_own_column(sch: s_tir.Schedule, block: SBlockRV, region: tvm.ir.TensorRegion) -> bool:
    """Whether ``block`` accesses one element of ``region``'s buffer, at the flat index
    (row-major) of its own column, its spatial iterators flattened row-major."""
    shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in region.source.shape]
    spatial = [i for i in iters_of(sch, block) if i.kind == "S"]
    if None in shape or not spatial:
        return False
    ana = Analyzer()
    for it in iters_of(sch, block):  # a row iterator's extent may be symbolic
        ana.bind(it.var, tvm.ir.Range.from_min_extent(tirx.IntImm(it.var.ty.dtype, 0),
                                                      it.size))
    if not all(ana.can_prove_equal(r.extent, 1) for r in region.region):
        return False
    dims = [r.min for r in region.region]
    dtype = str(spatial[0].var.ty.dtype)
    index = tirx.IntImm(dtype, 0)
    for d, n in zip(dims, shape, strict=True):
        index = index * tirx.IntImm(dtype, n) + tirx.Cast(dtype, d)
    column = tirx.IntImm(dtype, 0)
    for it in spatial:
        column = column * tirx.IntImm(dtype, it.extent) + it.var
    return ana.can_prove_equal(index, column)


def _check_column_reads(sch: s_tir.Schedule, block: SBlockRV, rows: int) -> None:
    view = column_view(sch, block)
    for region in sch.get(block).reads:
        if region.source.same_as(sch.get(block).writes[0].source):
            continue
        if access_rows(view, region, rows) is RowAccess.OTHER:
            raise Unstitchable(f"column reduction {view.name} reads {region.source.name} "
                               "outside the row it reduces")


def crossings(sch: s_tir.Schedule, roles: Roles) -> list[tuple[str, str]]:
    """(producer, consumer) pairs of row-space blocks in different phases: a row intermediate
    that would have to survive a grid barrier (the partials a combine block sums are meant
    to: they are written to global memory)."""
    writers: dict[str, str] = {}
    found = []
    for block in child_blocks(sch):
        name = name_of(sch, block)
        for region in sch.get(block).reads:
            producer = writers.get(region.source.name)
            if producer is not None and roles.kinds[producer] is BlockRole.ROW \
                    and roles.kinds[name] in (BlockRole.ROW, BlockRole.COLUMN) \
                    and roles.levels[producer] != roles.levels[name]:
                found.append((producer, name))
        for w in sch.get(block).writes:
            writers[w.source.name] = name
    return found


def register_sum(result: tirx.Buffer) -> bool:
    """Whether a column phase may sum ``result``'s partials in a register of each column's
    thread and store it once: ``result`` has more than one element (a 0-d sum has no
    column for a thread). Threads past the last column of a partial task store nothing
    (``guarded_updates.stores_within_columns``); until they did, columns that no whole
    number of tasks covers (8160 on tasks of 1024 threads) were summed in place in global
    memory, each partial added there: 3 writes and 4 reads of each sum for 2 row tiles."""
    return prod(int(d) for d in result.shape) > 1


def copy_across_barrier(sch: s_tir.Schedule, producer: str, later: set[str]) -> str:
    """Copy the result of the row reduction ``producer`` to global memory in its own phase
    for the blocks ``later``, which read it after a grid barrier; returns the copy's name.
    A reduction's result cannot be recomputed where it is read, as an element-wise one is,
    and what the kernel keeps on chip does not survive the barrier. The copy writes one
    value per row, once."""
    buffer = sch.get(sch.get_sblock(producer)).writes[0].source
    consumers = [sch.get_sblock(n) for n in sorted(later)]
    index = next(i for i, r in enumerate(sch.get(consumers[0]).reads)
                 if r.source.same_as(buffer))
    return name_of(sch, sch.cache_read(consumers[0], index, "global",
                                       consumer_blocks=consumers))


__all__ = ["BlockRole", "Roles", "column_reductions",
           "normalise_column", "column_view", "assign_roles", "crossings",
           "copy_across_barrier", "register_sum"]
