"""Row tiles and column tiles of a persistent grid's row phases."""

from __future__ import annotations

from ...analysis.roofline import GPU
from ...plan import Launch
from ...target import WARP_SIZE
from ..mapping import divisors
from ..occupancy import registers_for_cached, with_blocks_per_sm
from ..phases import BlockRole, Roles
from ..rows import Unstitchable

MIN_TILE_ROWS = 8
"""Rows of a row tile at least, when the rows allow, in a group with column reductions: each
tile writes one row of partial sums and the next phase reads it back, so this keeps that
traffic under a quarter of the input's."""


SMALL_GLOBAL_ELEMENTS = 1 << 16
"""A Global group's row phases over at most this many elements may run on few row tiles
(as few as one, when no divisor of a prime row count fits the wave): the work is too small
for the parallelism to matter, and one kernel still replaces TVM's several."""


def row_tiles(rows: int, wave: int, partial_sums: bool, elements: int) -> int:
    """Row tiles of a persistent grid: the most that divide the rows and fit one wave (with
    ``partial_sums``, also no more than a tile per ``MIN_TILE_ROWS`` rows). Fewer than an
    eighth of that is refused unless the row phases walk at most ``SMALL_GLOBAL_ELEMENTS``
    ``elements``."""
    most = min(wave, max(1, rows // MIN_TILE_ROWS)) if partial_sums else wave
    tiles = max(d for d in divisors(rows) if d <= most)
    if tiles * 8 < min(rows, most) and elements > SMALL_GLOBAL_ELEMENTS:
        raise Unstitchable(f"{rows} rows do not split into about one wave of {most} tiles "
                           f"(at most {tiles})")
    return tiles


def ragged_tiles(rows: int, wave: int) -> int:
    """Row tiles of a persistent grid with partial sums whose rows no divisor splits into
    about one wave (a prime count: ViT's 197 tokens, 577 at 384 x 384): as many as ``wave``
    and ``MIN_TILE_ROWS`` rows each allow, of ``ceil(rows / tiles)`` rows each, the last
    shorter, its rows past the end guarded as those of a run-time row count. None where the
    divisors of ``rows`` give at least half as many (they need no guard)."""
    most = min(wave, max(1, rows // MIN_TILE_ROWS))
    steps = -(-rows // most)
    tiles = -(-rows // steps)
    even = max((d for d in divisors(rows) if d <= most), default=1)
    return tiles if even * 2 <= tiles else None


def fewest_tiles(rows: int, max_steps: int) -> int:
    """The fewest row tiles (a divisor of ``rows``) of at most ``max_steps`` rows each."""
    return min(d for d in divisors(rows) if rows // d <= max(max_steps, 1))


def tiles_for_cached(gpu: GPU, launch: Launch, rows: int, tiles: int, per_row: int,
                     sums: int, partial_sums: bool, elements: int) -> tuple[Launch, int]:
    """The launch and row tiles of a persistent grid whose threads keep ``per_row`` elements
    of re-read inputs for each row of their tile (nvcc unrolls a short row walk) and ``sums``
    partial sums: ``launch`` and ``tiles`` when their register cap leaves
    ``registers_for_cached`` for them, else the most blocks per SM (fewer, longer tiles, one
    wave of them) whose higher cap does; unchanged when none does. A tile's elements grow as
    the blocks shrink, the cap faster: fuzz 2612:1168, a tile of 8 rows of 3 elements each at
    48 registers (5 blocks of 256 threads per SM) spilled 40 B, and at 64 registers; tiles of
    16 rows at 2 blocks per SM get 128."""
    if registers_for_cached(rows // tiles * per_row + sums) <= launch.max_registers:
        return launch, tiles
    for blocks in range(launch.blocks_per_sm - 1, 0, -1):
        fewer = with_blocks_per_sm(gpu, launch, blocks)
        try:
            longer = row_tiles(rows, fewer.wave, partial_sums, elements)
        except Unstitchable:
            break
        if registers_for_cached(rows // longer * per_row + sums) <= fewer.max_registers:
            return fewer, longer
    return launch, tiles


def column_tile_options(roles: Roles, threads: int, lanes: bool = True,
                        element_wise_rows: bool = False) -> list[int]:
    """Column tiles per row tile, best first, when the row phases only accumulate column
    reductions of one width (no block needs whole rows; with ``element_wise_rows``, row
    blocks that compute each element of their row alone may share the phase): a task then
    takes a tile of its row tile's columns rather than all of them, so that fewer, longer
    row tiles fill the GPU and fewer rows of partial sums go through global memory.
    Warp-wide tiles (one reduction and no row blocks: the block's warps take parts of the
    tile's rows, lanes, and add up their sums in shared memory; unless not ``lanes``), or a
    column per thread: tiles as wide as the block (``tile_threads`` narrows a block to a
    width that divides into such tiles)."""
    widths = set(roles.columns.values())
    has_rows = bool(roles.of_kind(BlockRole.ROW))
    if (has_rows and not element_wise_rows) or len(widths) != 1:
        return []
    width = widths.pop()
    options = []
    if lanes and not has_rows and len(roles.columns) == 1 and threads % WARP_SIZE == 0 \
            and width % WARP_SIZE == 0 and width > WARP_SIZE:
        options.append(width // WARP_SIZE)
    if width % threads == 0 and width > threads:
        options.append(width // threads)
    return options


def tile_threads(width: int, threads: int) -> int | None:
    """The most threads, up to ``threads`` and more than half of them, that divide ``width``:
    a block as wide as each of its column tiles (every bound thread loop of a kernel has
    the block's extent; a narrower tile's guard would widen the region its partial sums
    are written out over); None when no such count divides it."""
    fitting = [d for d in divisors(width) if 2 * d > threads and d <= threads]
    return max(fitting, default=None)


def choose_tiles(options: list[int], roles: Roles, rows: int, threads: int, wave: int,
                 elements: int, beyond_wave: bool = False) -> tuple[int, int]:
    """Row tiles and column tiles per row tile of the row phases: the first of ``options``
    (``column_tile_options``) whose lanes (threads per tile column) divide the rows of a row
    tile, with as many row tiles as then fit ``wave`` tasks; with ``beyond_wave``, where
    none fits the wave, the first whose lanes divide the rows on one row tile (the
    persistent grid walks its tasks in rounds); else no column tiles."""
    partial_sums = bool(roles.columns)
    width = next(iter(roles.columns.values()), 0)
    for column_tiles in options:
        if column_tiles > wave:  # not even one row tile's column tiles fit the wave
            continue
        tiles = row_tiles(rows, wave // column_tiles, partial_sums, elements)
        if (rows // tiles) % (threads // (width // column_tiles)) == 0:
            return tiles, column_tiles
    for column_tiles in options if beyond_wave else []:
        if rows % (threads // (width // column_tiles)) == 0:
            return 1, column_tiles
    return row_tiles(rows, wave, partial_sums, elements), 1
