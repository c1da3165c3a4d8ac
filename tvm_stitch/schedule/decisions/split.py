"""Task splitting: few long rows, each split over several blocks and stitched Globally."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

from tvm import s_tir, tirx

from ...analysis.roofline import GPU
from ...plan import Group, PhaseKind
from ...symbolic import is_symbolic
from ...target import SIMT_MAX_WORK_ITEMS
from ..blocks import add_unit_loops, child_blocks
from ..cluster import MAX_CLUSTER, has_clusters
from ..rows import Unstitchable, block_rows, error_summary
from ..task_split import split_options, split_rows
from .chosen import chosen_threads
from .global_stitch import decide_global
from .state import launch_of

logger = logging.getLogger(__name__)

SPLIT_THREADS = 512
"""Threads per block of a split row group: each part of a row gets at least that many
elements."""


SPLIT_TRIES = 4
"""Most part counts tried per block size, the most parts first (each try decides a Global
group)."""


SPLIT_MIN_LENGTH = 2048
"""Rows shorter than this are never split (a block per row is then short work anyway)."""


def split_candidates(func: tirx.PrimFunc, group: Group, rows: int, budget: int,
                     max_threads: int, gpu: GPU) -> Iterator[Group]:
    """Task splitting: a row group with fewer rows than the GPU has SMs, and long rows, split
    each row over several blocks (``task_split``) and stitched Globally over the sub-rows;
    the decided groups in the order to try them (the first that builds is taken), none when
    the rows should not or cannot be split (a block per row then). The most parts come
    first, fewer where those do not decide (sub-rows of 65536 on 512 threads would keep 128
    elements of an input read twice in each thread's registers; of 131072, the loop is
    rolled and reads it again), if their sub-rows are whole steps.

    Blocks take ``SPLIT_THREADS`` threads, or as many as a block may have (a group
    normalisation's sub-rows of 20480 elements would keep 40 of the input they read in both
    phases in each thread's registers, 20 with 1024 threads), or half as many, whose wave
    of more blocks takes more parts (a group normalisation of (2, 320, 64, 64) in 10 parts
    of one channel, each kept in 16 KB of shared memory across the grid barriers), or the
    threads per row ``group.choices`` fix; ``decide`` keeps the roofline's fastest."""
    chosen = group.choices.split_parts
    if chosen == 1:
        return
    if (group.choices.cluster or 1) > 1 and not has_clusters(gpu.arch):
        raise Unstitchable(f"{gpu.arch} has no thread-block clusters")
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    infos = [block_rows(sch, b, rows) for b in child_blocks(sch)]
    length = max(info.elements for info in infos)
    if rows >= gpu.sms or length < SPLIT_MIN_LENGTH or is_symbolic(length):
        return
    shapes = tuple({tuple(i.extent for i in info.element_iters) for info in infos
                    if info.elements > 1})
    fixed = group.choices.threads_per_row
    options = [chosen_threads(0, fixed, max_threads, "threads per row")] if fixed \
        else list(dict.fromkeys([min(SPLIT_THREADS, max_threads), max_threads,
                                 min(SPLIT_THREADS // 2, max_threads)]))
    refused, yielded = None, False
    for threads in options:
        wave = launch_of(gpu, threads, 0).wave
        found = split_options(rows, length, wave, threads, shapes)
        if chosen is not None and chosen not in found:
            continue
        tries = sorted(found, reverse=True)[:SPLIT_TRIES]
        # fewer parts than the most only where each sub-row is whole steps of float4 vectors
        # on its threads: a guarded last step holds registers the plan does not count (a
        # layer norm of one row of 602112 in 48 parts spilled 16 B, fuzz seed 1220 graph 38)
        tries = tries[:1] + [p for p in tries[1:] if length // p % (threads * 4) == 0]
        for parts in [chosen] if chosen else tries:
            parted = s_tir.Schedule(func)
            add_unit_loops(parted)
            try:
                split_rows(parted, func, rows, parts)
                done = decide_global(parted, func, group, rows * parts, budget, max_threads,
                                     gpu, threads=threads, split=parts)
            except Exception as err:  # noqa: BLE001 - cannot split: a block per row instead
                logger.debug("no task splitting for %s in %d parts on %d threads: %s",
                             group.ops, parts, threads, error_summary(err))
                continue
            if group.choices.cluster and group.choices.cluster > 1:
                try:
                    done = clustered(done, group.choices.cluster, parts, gpu)
                except Unstitchable as err:
                    logger.debug("no clusters for %s in %d parts: %s", group.ops, parts, err)
                    refused = err
                    continue
            yielded = True
            yield replace(done, row_split=parts)
    if refused is not None and not yielded:  # say why the chosen clusters cannot be
        raise refused


def clustered(done: Group, size: int, parts: int, gpu: GPU) -> Group:
    """``done``, a row group split in ``parts`` parts, launched as thread-block clusters of
    ``size`` blocks that combine their partials through distributed shared memory
    (``schedule.cluster``); raises Unstitchable where that cannot be: a GPU without
    clusters, clusters that do not hold whole rows or whole grids, a phase that is not one
    sub-row per block, a cluster of more threads than the SIMT runner's work-group holds."""
    if not has_clusters(gpu.arch):
        raise Unstitchable(f"{gpu.arch} has no thread-block clusters")
    launch = done.launch
    if size > MAX_CLUSTER or size % parts or launch is None or launch.grid % size:
        raise Unstitchable(f"clusters of {size} blocks hold no whole rows of {parts} parts "
                           f"on {launch.grid if launch else 0} blocks")
    if any(p.kind is not PhaseKind.ROWS or p.tasks != launch.grid for p in done.phases):
        raise Unstitchable("clusters need every phase to take one sub-row per block")
    if size * launch.threads > SIMT_MAX_WORK_ITEMS:
        raise Unstitchable(f"a cluster of {size} blocks of {launch.threads} threads would not "
                           f"run on the SIMT runner (at most {SIMT_MAX_WORK_ITEMS} work-items)")
    return replace(done, cluster=size)
