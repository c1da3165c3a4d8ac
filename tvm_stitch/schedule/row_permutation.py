"""Layout moves that reorder whole rows, stitched with the row group around them.

A window partition (Reshape -> Transpose -> Reshape after a LayerNorm in windowed attention),
tokens to NCHW and back, or channels-last moves keep the normalised axis innermost: they
permute the rows of their tensor, not the elements of a row. As TVM fuses them, they are a
chain of copy blocks (``out[v] = src[f(v)]``) whose reads cross rows, so the group could not
be stitched. ``permute_rows`` rewrites a row group's PrimFunc so they can be:

- the copies of such a chain are inlined into their readers (a copy that a transposing copy
  reads, or that reads through one, is no longer a block of its own): a block that reads an
  input through the chain then reads the input at the permuted row (inputs may be read from
  any row), and
- a chain's last copy, when it writes an output, iterates over its source's index space
  instead of its own (``transform_block_layout``, which checks the map is a bijection): it
  then reads its own row and writes a whole output row elsewhere, a *permuted* write
  (``rows.access_rows``), unless another block of the kernel reads that output: its on-chip
  copy would be filled at permuted places, and TVM bounded the loop filling it by a box of
  the permuted indices (half a LayerNorm's row of (2, 32, 127) transposed to (32, 2, 127)
  was written, fuzz graph 5150:916 while shrinking).

A transposing copy that reads an input directly may be kept as a block instead
(``keepable_transposes``, ``keep``): inlined, its readers would each read the input again,
one element per channel apart where it moves the input's innermost axis (tokens to
channels-last before a LayerNorm: ``(B, C, H, W) -> (B, H, W, C)``), where the copy, kept
as a block of the row group, reads every element once and its readers read the row on chip
(a Regional intermediate). ConvNeXt's and Swin's first LayerNorm read their input three
times inlined; a batch norm's channel rows of (N, C, H, W) (a transpose that keeps the
innermost axis) twice, where a row fits on chip.

Decisions choose what to keep and record what was done (``Group.permuted_copies``,
``Group.permuted_outputs``, ``Group.transposed_copies``); emission applies it where the plan
says so and checks it does the same.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from math import prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..symbolic import dim_value
from .blocks import child_blocks, inline, name_of, readers


def _copy_source(stmt: s_tir.stmt.SBlock) -> tvm.ir.TensorLoad | None:
    """The load a block copies, if its body stores one load and nothing else (no init, every
    iterator spatial)."""
    body = stmt.body
    if stmt.init is not None or not isinstance(body, tirx.BufferStore) \
            or not isinstance(body.value, tvm.ir.TensorLoad) or len(stmt.writes) != 1 \
            or any(int(iv.iter_type) != tirx.IterVar.DataPar for iv in stmt.iter_vars):
        return None
    return body.value


def _flat(indices: list[tvm.ir.PrimExpr], shape: list[tvm.ir.PrimExpr]) -> tvm.ir.PrimExpr:
    flat = tirx.IntImm(indices[0].ty.dtype, 0) if indices else tirx.IntImm("int64", 0)
    for index, extent in zip(indices, shape, strict=True):
        flat = flat * extent.astype(flat.ty.dtype) + index.astype(flat.ty.dtype)
    return flat


def _transposes(stmt: s_tir.stmt.SBlock, load: tvm.ir.TensorLoad) -> bool:
    """Whether the copy moves every element of its source to a new place: the load is a
    bijection of the block's domain onto the whole source (a reshape or a transpose, not a
    slice or a broadcast), and, counted row-major, not provably the block's own position
    (which a reshape's is)."""
    domain = {iv.var: iv.dom for iv in stmt.iter_vars}
    sizes = [dim_value(d) for d in load.source.shape] + [dim_value(iv.dom.extent)
                                                          for iv in stmt.iter_vars]
    if None in sizes or prod(sizes[:len(load.source.shape)]) != prod(
            sizes[len(load.source.shape):]):
        return False
    if not tvm.sym.detect_iter_map(list(load.indices), domain, check_level="bijective",
                                   analyzer=Analyzer()).indices:
        return False
    ana = Analyzer()
    for iv in stmt.iter_vars:
        ana.bind(iv.var, iv.dom)
    mine = _flat([iv.var for iv in stmt.iter_vars], [iv.dom.extent for iv in stmt.iter_vars])
    theirs = _flat(list(load.indices), list(load.source.shape))
    return not ana.can_prove_equal(mine, theirs)


def _moves_innermost(stmt: s_tir.stmt.SBlock, load: tvm.ir.TensorLoad) -> bool:
    """Whether the copy reads its innermost iterator's elements from anywhere but its
    source's innermost axis in order: consecutive elements of its row lie apart in the
    source."""
    last = stmt.iter_vars[-1] if stmt.iter_vars else None
    return last is None or not load.indices[-1].same_as(last.var) \
        or not Analyzer().can_prove_equal(last.dom.extent, load.source.shape[-1])


def _copies(sch: s_tir.Schedule) -> dict[str, tuple[s_tir.stmt.SBlock, tvm.ir.TensorLoad, bool]]:
    """Each copy block -> its statement, the load it copies and whether it transposes."""
    copies = {}
    for block in child_blocks(sch):
        stmt = sch.get(block)
        load = _copy_source(stmt)
        if load is not None:
            copies[name_of(sch, block)] = (stmt, load, _transposes(stmt, load))
    return copies


def _keepable(sch: s_tir.Schedule, func: tirx.PrimFunc) -> dict[str, bool]:
    """The transposing copies that may be kept out of chains (the module docstring), each
    with whether it moves its input's innermost axis: of an input, into an intermediate,
    read by no transposing copy (a reshape of the transposed rows reads them where they
    lie: MobileViT's unfolded patches)."""
    params = {p.name for p in func.params}
    copies = _copies(sch)
    chained = {name for name, (_, _, transposes) in copies.items() if transposes}
    return {name: _moves_innermost(copies[name][0], copies[name][1])
            for name in sorted(chained)
            if copies[name][1].source.name in params
            and copies[name][0].writes[0].source.name not in params
            and (users := readers(sch, copies[name][0].writes[0].source))
            and not any(name_of(sch, u) in chained for u in users)}


def keepable_transposes(func: tirx.PrimFunc, rows: int, budget: int
                        ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The transposing copies of ``func`` (of ``rows`` rows) that ``permute_rows`` may keep
    as blocks: those that move their input's innermost axis (inlined, each reader would read
    the input one element per row apart), and the others whose row fits ``budget`` bytes of
    shared memory (inlined, each reader reads the input again: a batch norm's channel rows
    of (N, C, H, W), read for the mean and again to normalise; kept, a row that fits nowhere
    on chip is read again all the same)."""
    sch = s_tir.Schedule(func)
    found = _keepable(sch, func)

    def row_bytes(name: str) -> int:
        buffer = sch.get(sch.get_sblock(name)).writes[0].source
        elements = prod(dim_value(d) or 0 for d in buffer.shape)
        return elements // max(rows, 1) * max(buffer.dtype.bits // 8, 1)

    return (tuple(n for n, moves in found.items() if moves),
            tuple(n for n, moves in found.items() if not moves and row_bytes(n) <= budget))


def _chain_copies(sch: s_tir.Schedule, func: tirx.PrimFunc, keep: frozenset[str]
                  ) -> tuple[list[str], list[str]]:
    """Copy blocks writing an intermediate that belong to a chain with a transposing copy:
    transposing themselves, read by copies of the chain only, or reading one; and the
    transposing copies of ``keep`` kept out of chains (asserted ``_keepable``)."""
    params = {p.name for p in func.params}
    copies = _copies(sch)
    writers = {stmt.writes[0].source.name: name for name, (stmt, _, _) in copies.items()}
    chained = {name for name, (_, _, transposes) in copies.items() if transposes}
    kept = sorted(keep)
    assert set(kept) <= set(_keepable(sch, func)), (kept, _keepable(sch, func))
    chained -= set(kept)
    grown = True
    while grown:
        grown = False
        for name, (stmt, load, _) in copies.items():
            if name in chained:
                continue
            users = [name_of(sch, u) for u in readers(sch, stmt.writes[0].source)]
            if writers.get(load.source.name) in chained or (
                    users and all(u in chained for u in users)):
                chained.add(name)
                grown = True
    return [n for n in chained if copies[n][0].writes[0].source.name not in params], kept


@dataclass(frozen=True)
class RowPermutation:
    """What ``permute_rows`` did: the copy blocks it inlined, the outputs now written at
    permuted rows, and the transposing copies it kept as blocks (``Group.permuted_copies``,
    ``Group.permuted_outputs`` and ``Group.transposed_copies``)."""

    copies: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def permute_rows(func: tirx.PrimFunc, keep: Collection[str] = ()
                 ) -> tuple[tirx.PrimFunc, RowPermutation]:
    """``func`` with its whole-row layout moves rewritten as the module docstring says, the
    transposing copies of ``keep`` (``keepable_transposes``) kept as blocks, and what was
    rewritten (``func`` itself and a record of nothing inlined when nothing was)."""
    sch = s_tir.Schedule(func)
    chain, kept = _chain_copies(sch, func, frozenset(keep))
    for name in chain:
        inline(sch, sch.get_sblock(name))
    params = {p.name for p in func.params}
    moved = []
    for block in child_blocks(sch):
        stmt = sch.get(block)
        load = _copy_source(stmt)
        if load is None or stmt.writes[0].source.name not in params \
                or not _transposes(stmt, load) or readers(sch, stmt.writes[0].source,
                                                          exclude=block):
            continue  # a permuted write that the kernel reads again: its readers would
            # read a copy of it (``cache_reused_outputs``) filled at permuted places
        iters = [iv.var for iv in stmt.iter_vars]
        try:
            sch.transform_block_layout(block, tirx.IndexMap(iters, list(load.indices), None))
        except Exception:  # noqa: BLE001 - not a bijection: leave the block as it is
            continue
        moved.append(name_of(sch, block))
    if not chain and not moved:
        return func, RowPermutation(kept=tuple(kept))
    outputs = tuple(sch.get(sch.get_sblock(n)).writes[0].source.name for n in moved)
    return _own_row_reads(sch.mod["main"], moved), RowPermutation(tuple(chain), outputs,
                                                                  tuple(kept))


def _own_row_reads(func: tirx.PrimFunc, names: list[str]) -> tirx.PrimFunc:
    """The moved copies read ``src[v]`` at their own position ``v``: what the transformed
    load indices compute (f(f^-1(v)) = v), in a form the row analysis can compare."""
    def on_block(block: s_tir.stmt.SBlock) -> s_tir.stmt.SBlock:
        if block.name_hint not in names:
            return block
        store = block.body
        own = [iv.var for iv in block.iter_vars]
        load = tirx.BufferLoad(store.value.source, own)
        region = tirx.BufferRegion(store.value.source,
                                   [tvm.ir.Range.from_min_extent(v, 1) for v in own])
        return s_tir.stmt.SBlock(block.iter_vars, [region], block.writes, block.name_hint,
                                tirx.BufferStore(store.buffer, load, store.indices),
                                block.init, block.alloc_buffers, block.match_buffers,
                                block.annotations)

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlock, on_block)])


__all__ = ["RowPermutation", "keepable_transposes", "permute_rows"]
