"""Block and buffer layouts over the row space: every block of a row group as (row, element)."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..symbolic import shape_values
from .blocks import child_blocks, name_of
from .rows import block_rows, prefix_split, row_element_map


def flatten_rows(sch: s_tir.Schedule, rows: int, skip: list[str],
                 only: set[str] | None = None) -> None:
    """Rewrite every block to iterate over exactly (row, element), and every buffer the kernel
    allocates to a (row, element) layout: a row space spread over several dimensions then maps
    to threads like a matrix does, the regions compute-at derives for a block's rows stay
    exact, and a block with one value per row (or a single row) gets a unit iterator of the
    kernel's index type instead of a 32-bit unit loop."""
    for block in child_blocks(sch):
        if only is not None and name_of(sch, block) not in only:
            continue
        for index, region in enumerate(sch.get(block).writes):
            if region.source.scope() == "global":
                continue
            shape = list(region.source.shape)
            kb = prefix_split(list(shape_values(shape) or []), rows)
            if kb is None or (kb <= 1 and len(shape) - kb <= 1):
                continue
            layout = row_element_map(list(range(kb)), shape[:kb],
                                      list(range(kb, len(shape))), shape[kb:])
            dtype = str(region.source.shape[0].ty.dtype)
            sch.transform_layout(block, ("write", index),
                                 tirx.IndexMap.from_func(layout, ndim=len(shape),
                                                         index_dtype=dtype))
    for block in child_blocks(sch):
        if name_of(sch, block) in skip or (only is not None and name_of(sch, block) not in only):
            continue
        info = block_rows(sch, block, rows)
        elem_pos = [p for p in range(info.num_row_iters, len(info.iters))
                    if not (info.is_reduction and info.iters[p].kind == "S")]
        row_pos = list(range(info.num_row_iters))
        if len(info.iters) == 2 and row_pos == [0] and elem_pos == [1]:
            continue
        if all(i.extent == 1 for i in info.iters):
            # a scalar block: its iterators are bound to constants, not to loops; unit loops
            # (a reduction to one value that keeps its dims) fuse into one element loop
            loops = sch.get_loops(block)
            if len(loops) > 2:
                sch.fuse(*loops[1:])
            while len(sch.get_loops(block)) < 2:
                sch.add_unit_loop(block)
            continue
        index_map = row_element_map(row_pos, [info.iters[p].size for p in row_pos],
                                     elem_pos, [info.iters[p].size for p in elem_pos])
        dtype = str(info.iters[0].var.ty.dtype)
        sch.transform_block_layout(
            block, tirx.IndexMap.from_func(index_map, ndim=len(info.iters), index_dtype=dtype))
