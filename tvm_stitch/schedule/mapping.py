"""Thread mapping of a group: block-per-row, warp-per-row with packing, or flat.

Short rows get a warp (or a sub-warp as wide as the row) each, and several rows share a
thread block (horizontal packing) so blocks keep a useful size; long rows get a whole block
of 128-1024 threads. Few rows get more threads each, so that the GPU still has enough loads in
flight. Packing stops where it would leave fewer blocks than SMs, and the rows of a block
divide the row count (no partial blocks).
"""

from __future__ import annotations

from dataclasses import replace

from ..plan import MappingKind, ThreadMapping
from ..target import MAX_THREADS_PER_BLOCK, WARP_SIZE

NUM_SMS = 132
"""SMs of the GPU we map for (H200); packing keeps at least this many blocks when it can."""

SHORT_ROW = 256
"""Rows up to this length get a warp (or sub-warp) each; longer ones a block each."""

BLOCK_THREADS = 256
"""Threads of a block of packed short rows, and of a flat (element-wise) kernel."""

FILL_THREADS = NUM_SMS * 2048
"""Threads that fill every SM of the GPU (2048 resident threads per SM)."""


def _pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def row_mapping(rows: int, row_length: int, divisor: int = 1,
                max_threads: int = MAX_THREADS_PER_BLOCK) -> ThreadMapping:
    """The mapping for ``rows`` rows of ``row_length`` elements.

    Each row gets at least a warp (or a sub-warp as wide as a short row) and, for long rows,
    a block of 128-1024 threads (about four elements each). When the rows are too few to
    fill the GPU that way, rows get more threads, up to one per element, so that enough
    loads are in flight. Short rows that keep a (sub-)warp each are packed several per block;
    ``divisor`` is a number the rows of a block must divide (1 forbids packing).
    """
    width = _pow2_ceil(row_length)
    fill = _pow2_ceil(-(-FILL_THREADS // rows))
    if row_length <= SHORT_ROW:
        per_row = max(min(WARP_SIZE, width), min(fill, width, max_threads))
    else:
        per_row = min(max_threads, max(128, _pow2_ceil(-(-row_length // 4))))
        per_row = max(per_row, min(fill, width, max_threads))
    if per_row > WARP_SIZE:
        return ThreadMapping(MappingKind.BLOCK_PER_ROW, rows, row_length, 1, per_row)
    packed = min(BLOCK_THREADS // per_row, _pow2_floor(max(rows // NUM_SMS, 1)))
    while packed > 1 and divisor % packed:
        packed //= 2
    return ThreadMapping(MappingKind.WARP_PER_ROW, rows, row_length, packed, per_row)


MAX_ROW_STEPS = 64
"""Most rows one thread walks in sequence."""


def row_steps(mapping: ThreadMapping, span: int) -> int:
    """Rows per thread lane in sequence (vertical packing) so that data shared by ``span``
    consecutive rows is read once per block: the largest power of two that keeps the rows of
    a block inside one span and at least half a wave of blocks (thread-limited occupancy)."""
    per_block = mapping.rows_per_block
    resident = max(1, min(32, 2048 // mapping.threads_per_block))
    min_blocks = NUM_SMS * resident // 2
    steps = 1
    while steps < MAX_ROW_STEPS:
        chunk = per_block * steps * 2
        if mapping.rows % chunk or span % chunk or mapping.rows // chunk < min_blocks:
            break
        steps *= 2
    return steps


def flat_mapping(elements: int, max_threads: int = MAX_THREADS_PER_BLOCK) -> ThreadMapping:
    """One element per thread, ``BLOCK_THREADS`` threads per block (fewer for tiny sizes)."""
    threads = min(max_threads, BLOCK_THREADS, max(WARP_SIZE, _pow2_ceil(elements)))
    return ThreadMapping(MappingKind.FLAT, elements, 1, threads, 1)


def with_rows_per_block(mapping: ThreadMapping, rows_per_block: int) -> ThreadMapping:
    """``mapping`` with fewer rows packed per block (to fit the shared-memory budget)."""
    return replace(mapping, rows_per_block=rows_per_block)
