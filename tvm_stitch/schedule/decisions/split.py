"""Task splitting: few long rows, each split over several blocks and stitched Globally."""

from __future__ import annotations

import logging
from dataclasses import replace

from tvm import s_tir, tirx

from ...analysis.roofline import GPU
from ...plan import Group
from ...symbolic import is_symbolic
from ..blocks import add_unit_loops, child_blocks
from ..rows import block_rows, error_summary
from ..task_split import split_options, split_parts, split_rows
from .global_stitch import decide_global
from .state import launch_of

logger = logging.getLogger(__name__)

SPLIT_THREADS = 512
"""Threads per block of a split row group: each part of a row gets at least that many
elements."""


SPLIT_MIN_LENGTH = 2048
"""Rows shorter than this are never split (a block per row is then short work anyway)."""


def decide_split(func: tirx.PrimFunc, group: Group, rows: int, budget: int,
                 max_threads: int, gpu: GPU) -> Group | None:
    """Task splitting: a row group with fewer rows than the GPU has SMs, and long rows, split
    each row over several blocks (``task_split``) and stitched Globally over the sub-rows;
    None when the rows should not or cannot be split (a block per row then)."""
    chosen = group.choices.split_parts
    if chosen == 1:
        return None
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    length = max(block_rows(sch, b, rows).elements for b in child_blocks(sch))
    threads = min(SPLIT_THREADS, max_threads)
    if rows >= gpu.sms or length < SPLIT_MIN_LENGTH or is_symbolic(length):
        return None
    wave = launch_of(gpu, threads, 0).wave
    if chosen is not None and chosen not in split_options(rows, length, wave, threads):
        return None
    parts = chosen or split_parts(rows, length, wave, threads)
    if parts == 1:
        return None
    try:
        split_rows(sch, func, rows, parts)
        done = decide_global(sch, func, group, rows * parts, budget, max_threads, gpu,
                             threads=threads, split=parts)
    except Exception as err:  # noqa: BLE001 - cannot split: a block per row instead
        logger.debug("no task splitting for %s: %s", group.ops, error_summary(err))
        return None
    return replace(done, row_split=parts)
