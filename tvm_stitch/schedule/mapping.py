"""Thread mapping of a group: block-per-row, warp-per-row with packing, or flat.

Short rows get a warp each, or a sub-warp of one thread per access (vector) of the row, and
several rows share a thread block (horizontal packing) so blocks keep a useful size; long
rows get a whole block of 64-1024 threads, each on about four accesses (vectors where the
row takes them). Few rows get more threads each, so that the GPU still has enough loads in
flight. Packing stops where it would leave fewer blocks than SMs, and the rows of a block
divide the row count (no partial blocks). A block then walks several groups of rows in
sequence (vertical packing, ``row_steps``) so that the grid fits one wave of the GPU.
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis.roofline import GPU, gpu_of_arch
from ..analysis.traffic import SECTOR_BYTES
from ..plan import MappingKind, ThreadMapping
from ..symbolic import is_symbolic
from ..target import MAX_THREADS_PER_BLOCK, WARP_SIZE

DEFAULT_GPU = gpu_of_arch("sm_90")
"""The GPU mapped for when the caller names none (H200)."""

SHORT_ROW = 256
"""Rows up to this length get a warp (or sub-warp) each; longer ones a block each."""

BLOCK_THREADS = 256
"""Threads of a block of packed short rows, and of a flat (element-wise) kernel."""

ACCESSES_PER_THREAD = 4
"""Accesses (vectors, or elements) of its row one thread of a long row takes: issued back to
back before the row's first barrier, they are what the thread has in flight. Counting
elements instead gave a 1024-element float4 row 256 threads, one 16-byte load each, and so at
most eight rows resident per SM; dlight's 256 threads per row keep four loads each in flight
and ran that softmax 1.5x faster on the H200. Four vectors per thread keep the row on 64
threads and up to four times as many rows (bytes in flight) per SM."""

PACKED_ROW_THREADS = 512
"""Most threads of a block that packs rows of more than a warp each, so that inputs staged
once per block serve more rows (``decisions.rows``): two such blocks still share an SM, one
loading while the other waits at a barrier."""

MIN_ROW_THREADS = 2 * WARP_SIZE
"""Fewest threads of a block-per-row mapping (rows longer than ``SHORT_ROW``)."""

SYMBOLIC_ROW_LENGTH = 1024
"""The length a row of symbolic length is mapped for when no upper bound is declared: 256
threads a row, as dlight gives a row it cannot size, four accesses each at 1024 elements and
still one or two at the lengths of a short sequence."""

def _pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def row_mapping(rows: int, row_length: int, divisor: int | None = 1,
                max_threads: int = MAX_THREADS_PER_BLOCK, gpu: GPU = DEFAULT_GPU,
                vector: int = 1) -> ThreadMapping:
    """The mapping for ``rows`` rows of ``row_length`` elements, accessed ``vector`` elements
    at a time.

    Each row gets at least a warp (or, for a short row, a sub-warp of one thread per access:
    rows of 32 float32 elements read as float4 vectors take 8 threads) and, for long rows,
    a block of 64-1024 threads (about ``ACCESSES_PER_THREAD`` accesses each). When the rows
    are too few to fill the GPU that way, rows get more threads, up to one per element, so
    that enough loads are in flight. Short rows that keep a (sub-)warp each are packed
    several per block; ``divisor`` is a number the rows of a block must divide (1 forbids
    packing; None allows any, the last block guarding its rows past the end). Packing keeps
    at least one block per SM of ``gpu``.
    """
    width = _pow2_ceil(row_length)
    fill = _pow2_ceil(-(-(gpu.sms * gpu.max_threads_per_sm) // rows))
    if row_length <= SHORT_ROW:
        lanes = min(WARP_SIZE, _pow2_ceil(-(-row_length // vector)))
        per_row = max(lanes, min(fill, width, max_threads))
    else:
        accesses = -(-row_length // vector)
        per_row = min(max_threads, max(MIN_ROW_THREADS,
                                       _pow2_ceil(-(-accesses // ACCESSES_PER_THREAD))))
        per_row = max(per_row, min(fill, width, max_threads))
    if per_row > WARP_SIZE:
        return ThreadMapping(MappingKind.BLOCK_PER_ROW, rows, row_length, 1, per_row)
    packed = min(BLOCK_THREADS // per_row, _pow2_floor(max(rows // gpu.sms, 1)))
    while packed > 1 and divisor is not None and divisor % packed:
        packed //= 2
    return ThreadMapping(MappingKind.WARP_PER_ROW, rows, row_length, packed, per_row)


def strided_row_mapping(rows: int, row_length: int, max_threads: int = MAX_THREADS_PER_BLOCK,
                        gpu: GPU = DEFAULT_GPU, element_bytes: int = 4) -> ThreadMapping:
    """The mapping for ``rows`` strided rows of ``row_length`` elements: rows whose elements
    lie a stride apart in memory while consecutive rows lie side by side (a reduction over
    the middle axis of ``(B, T, E)``, read through a transposed view: rows ``(b, e)``,
    elements ``t``). Consecutive threads (threadIdx.x) take consecutive rows, at least a
    sector's worth of elements of ``element_bytes`` (8 float32), so that their accesses at
    one element fill whole sectors, where threads along a row would each touch a sector of
    their own; each row gets ``threads_per_row`` threads (threadIdx.y) that split its
    elements and combine through shared memory: as many as fill the GPU, while each keeps
    ``ACCESSES_PER_THREAD`` elements (one for rows shorter than that), within a block. A
    block takes ``BLOCK_THREADS`` threads, or the least rows' threads if more, and fewer
    while the blocks do not cover the SMs, down to a warp. Accesses are of one element (a
    row's elements are not contiguous)."""
    least = max(1, SECTOR_BYTES // element_bytes)
    fill = _pow2_ceil(-(-(gpu.sms * gpu.max_threads_per_sm) // rows))
    per_row = max(1, min(fill, _pow2_floor(max(row_length // ACCESSES_PER_THREAD, 1)),
                         max_threads // least))
    lanes = min(_pow2_ceil(rows), max(least, BLOCK_THREADS // per_row), max_threads // per_row)
    fewest = min(lanes, max(least, WARP_SIZE // per_row))  # a warp of threads at least
    while lanes > fewest and -(-rows // lanes) < gpu.sms:
        lanes //= 2
    return ThreadMapping(MappingKind.STRIDED_ROWS, rows, row_length, lanes, per_row)


MAX_ROW_STEPS = 1024
"""Most groups of rows one block walks in sequence."""


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def row_steps(mapping: ThreadMapping, wave: int, span: int | None = None,
              whole_wave: bool = False, guarded: bool = False) -> int:
    """Groups of rows each block walks in sequence (vertical packing), a divisor of the
    block's row groups so that no block is partial, unless ``guarded``.

    Without ``span``: the fewest steps that keep the grid within one ``wave`` of resident
    blocks; ``guarded`` (the emitter guards a last block that walks fewer), whether or not
    they divide the row groups, so the grid fills the wave (750000 rows of 32: 1303 blocks
    of 36 steps, 0.99 waves, not 625 of 75, the least divisor that fits).
    With ``span`` (inputs read alike by runs of ``span`` rows, staged once per block):
    the most steps that keep the rows of a block inside one run and at least half a wave of
    blocks (a whole one with ``whole_wave``; the blocks side by side on a row counted), so
    that the staged data is read as few times as the GPU's parallelism allows.
    """
    groups = mapping.rows // mapping.rows_per_block
    if guarded and span is None:  # the last block walks fewer steps, guarded
        return min(MAX_ROW_STEPS, -(-groups // wave))
    options = [d for d in divisors(groups) if d <= MAX_ROW_STEPS]
    if span is not None:
        least = wave if whole_wave else wave // 2
        inside = [d for d in options if span % (mapping.rows_per_block * d) == 0
                  and groups // d * mapping.column_blocks >= least]
        return max(inside, default=1)
    fitting = [d for d in options if groups // d <= wave]
    return min(fitting) if fitting else max(options)


VECTOR_BYTES = 16
"""Widest access of one thread: float4 for float32, eight halves (a float4 of half2) for
float16."""


def flat_mapping(elements: int, max_threads: int = MAX_THREADS_PER_BLOCK,
                 element_bytes: int = 4, gpu: GPU = DEFAULT_GPU,
                 threads: int | None = None) -> ThreadMapping:
    """``BLOCK_THREADS`` threads per block (fewer for tiny sizes), each on a vector of
    consecutive elements as wide as ``VECTOR_BYTES`` allows for elements of
    ``element_bytes`` (the widest in the kernel) when the blocks then divide the elements
    (aligned, no partial vectors) and still give every SM of ``gpu`` a block, else on one
    element; always on one for a symbolic count, whose last block is guarded. One element
    (0-d tensors) takes one thread: the producers of a 0-d value are computed in every thread
    of the block, unguarded, so a warp would load its inputs 32 times. ``threads`` fixes
    the threads per block instead."""
    if threads is None:
        threads = min(max_threads, BLOCK_THREADS, max(WARP_SIZE, _pow2_ceil(elements)))
        if elements == 1:
            threads = 1
    vector = 1 if is_symbolic(elements) else max(1, VECTOR_BYTES // element_bytes)
    while vector > 1 and (elements % (threads * vector)
                          or elements // (threads * vector) < gpu.sms):
        vector //= 2
    return ThreadMapping(MappingKind.FLAT, elements, 1, threads, 1, vector=vector)


def row_vector(row_length: int, element_bytes: int) -> int:
    """Elements per access of the element-wise blocks of rows of ``row_length`` elements: the
    widest vector ``VECTOR_BYTES`` allows that divides the row (every row then starts aligned
    to a vector), else 1. Where the row's threads do not cover it in whole vectors, the last
    step's threads past the row's end are idle."""
    vector = max(1, VECTOR_BYTES // element_bytes)
    while vector > 1 and row_length % vector:
        vector //= 2
    return vector


def with_rows_per_block(mapping: ThreadMapping, rows_per_block: int) -> ThreadMapping:
    """``mapping`` with fewer rows packed per block (to fit the shared-memory budget)."""
    return replace(mapping, rows_per_block=rows_per_block)
