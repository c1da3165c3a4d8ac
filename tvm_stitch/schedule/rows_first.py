"""Blocks of a row group brought to iterate over its rows first.

A row group maps every block as (row, element): its leading iterators must cover the rows
exactly (``rows.block_rows``). A group normalisation over (B, C, H, W) in G groups has rows
(B, G), and TVM's legalised form has two kinds of block that do not start so:

- the per-channel scale and shift reshaped to (G, C / G), blocks that copy a parameter and
  iterate over no row at all (or, for a single sample, over rows of a few channels):
  inlined into their readers, which then read the parameter through the reshape (a
  broadcast operand, as a LayerNorm's gamma is);
- the reshape back to (B, C, H, W), whose iterators (B, C) overshoot the rows (B, G): its
  channel iterator is split into (G, C / G), so that (B, G) lead.

``rows_first`` rewrites only blocks that are not in row form or have shorter rows than the
group's longest, and only where that puts them in it; every other block, and every group
whose blocks all start with their rows, is left exactly as it was. Intermediates of
(B, C, H, W) are laid out as (B, G, C / G, H, W) alike, so that a row's region is a box. Deciding
and emission both call it.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV

from ..symbolic import is_symbolic
from .blocks import buffer_params, child_blocks, inline, name_of
from .rows import Unstitchable, block_rows, iters_of


def rows_first(func: tirx.PrimFunc, rows: int) -> tirx.PrimFunc:
    """``func`` with its blocks that do not start with the ``rows`` rows rewritten to do so
    where they can be (module docstring); ``func`` itself when none needs it."""
    if is_symbolic(rows):
        return func
    sch = s_tir.Schedule(func)
    inlined, split = False, []
    elements = {name_of(sch, b): _row_elements(sch, b, rows) for b in child_blocks(sch)}
    length = max(filter(None, elements.values()), default=0)
    for name, count in elements.items():
        block = sch.get_sblock(name)
        if count == length:
            continue
        # a copy of a parameter that is not in row form, or a short one in rows by chance
        # (the scale of a group normalisation of a single sample as (G, C / G))
        if _copies_a_parameter(sch, func, block):
            inline(sch, block)
            inlined = True
        elif count is None and _split_to_rows(sch, block, rows):
            split.append(name)
    # only what the split blocks write: a column sum's buffer of a Global group is no row
    params = {p.name for p in buffer_params(func)}
    for name in split:
        block = sch.get_sblock(name)
        written = sch.get(block).writes
        if len(written) == 1 and written[0].source.name not in params:
            _split_buffer(sch, block, written[0].source, rows)
    return sch.mod["main"] if inlined or split else func


def _row_elements(sch: s_tir.Schedule, block: SBlockRV, rows: int) -> int | None:
    """Elements of one of the ``rows`` rows ``block`` visits; None when it is not in row
    form."""
    try:
        return block_rows(sch, block, rows).elements
    except Unstitchable:
        return None


def _in_row_form(sch: s_tir.Schedule, block: SBlockRV, rows: int) -> bool:
    return _row_elements(sch, block, rows) is not None


def _copies_a_parameter(sch: s_tir.Schedule, func: tirx.PrimFunc, block: SBlockRV) -> bool:
    """Whether ``block`` stores one load of a parameter and nothing else, into a buffer of
    the function's own."""
    stmt = sch.get(block)
    params = {p.name for p in buffer_params(func)}
    body = stmt.body
    return stmt.init is None and len(stmt.writes) == 1 \
        and stmt.writes[0].source.name not in params \
        and isinstance(body, tirx.BufferStore) and isinstance(body.value, tvm.ir.TensorLoad) \
        and body.value.source.name in params \
        and all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in stmt.iter_vars)


def _split_to_rows(sch: s_tir.Schedule, block: SBlockRV, rows: int) -> bool:
    """Split the spatial iterator of ``block`` at which the product of its leading
    iterators passes ``rows``, so that a prefix covers them exactly; whether it could."""
    try:
        iters = iters_of(sch, block)
    except Unstitchable:
        return False
    point = _split_point([it.extent if it.kind == "S" and not is_symbolic(it.extent) else None
                          for it in iters], rows)
    if point is None:
        return False
    sch.transform_block_layout(block, tirx.IndexMap.from_func(
        _split_at(*point), ndim=len(iters), index_dtype=str(iters[point[0]].var.ty.dtype)))
    return _in_row_form(sch, block, rows)


def _split_buffer(sch: s_tir.Schedule, block: SBlockRV, buffer: tirx.Buffer, rows: int) -> None:
    """Lay out ``buffer``, an intermediate ``block`` writes, with the dim at which the
    product of its leading dims passes ``rows`` split, as ``_split_to_rows`` splits
    iterators: (B, C, H, W) as (B, G, C / G, H, W), so that its rows are a prefix and one
    row's (or sub-row's) region is a box; where it can."""
    shape = list(buffer.shape)
    if rows == 1 or not all(isinstance(d, tirx.IntImm) for d in shape):
        return  # one row: every buffer is in its row already
    point = _split_point([int(d) for d in shape], rows)
    if point is not None:
        sch.transform_layout(block, ("write", 0), tirx.IndexMap.from_func(
            _split_at(*point), ndim=len(shape), index_dtype=str(shape[point[0]].ty.dtype)))


def _split_point(extents: list[int | None], rows: int) -> tuple[int, int] | None:
    """(dim, inner extent) at which to split ``extents`` so that a prefix covers ``rows``
    exactly: the dim where the product of the leading ones passes ``rows``, split into
    (rows / product before it, inner). None when a prefix covers them already, the sizes
    do not divide, or an extent before the point is None (not splittable)."""
    size = 1
    for k, extent in enumerate(extents):
        if extent is None:
            return None
        if size * extent > rows:
            outer = rows // size
            return (k, extent // outer) if rows % size == 0 and extent % outer == 0 else None
        size *= extent
        if size == rows:
            return None
    return None


def _split_at(at: int, inner: int):
    """The index map that splits iterator ``at`` into (outer, ``inner``)."""

    def split(*index):
        return [*index[:at], index[at] // inner, index[at] % inner, *index[at + 1:]]

    return split


__all__ = ["rows_first"]
