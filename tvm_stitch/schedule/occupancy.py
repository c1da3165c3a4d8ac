"""Occupancy and launch configuration of a stitched kernel (AStitch section 4.3).

A kernel's blocks per SM follow from its threads, registers and shared memory per block and
the SM's limits (``tvm_stitch.analysis.GPUS``, the one GPU table). Registers are only known
after ``ptxas``, so the launch configuration is fixed in three steps:

1. *assume* every thread uses at most ``ASSUMED_REGISTERS`` registers;
2. derive the blocks per SM that threads, shared memory and that register count allow
   (``blocks_per_sm``), and so the blocks of one wave (SMs x blocks per SM), but no more
   than the grid puts on one SM (``launch_for_grid``);
3. *relax* the register cap to the most registers that still keep that many blocks per SM
   (``max_registers``), and *apply* it as ``__launch_bounds__(threads, blocks per SM)``:
   ptxas then keeps every thread within the cap, so the planned wave is resident for real.

Both steps count registers per sub-partition of the register file, as ptxas and CUDA's
occupancy calculator do, so the cap relaxed to is the cap ptxas applies: counted over the
whole file, 21 blocks of 64 threads seemed to allow 48 registers, ptxas gave them 40, and the
kernel planned for 48 spilled (fuzz case stitch-s1-g6).

The wave is what a persistent grid (Global stitching, a grid barrier) may launch at most: a
grid larger than the blocks that can be resident at once deadlocks at its first barrier.

``ASSUMED_REGISTERS`` is 48: ptxas (CUDA 13, sm_90) gives the stitched kernels of the workload
zoo 15 to 45 registers, and the launch bound only caps registers, never lowers occupancy
below what the kernel reaches on its own.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import tvm_ffi
from tvm import tirx
from tvm.target import Target

from ..analysis.roofline import GPU, gpu_of_arch
from ..plan import Launch
from ..target import SIMT_CONCURRENT_BLOCKS

ASSUMED_REGISTERS = 48
"""Registers per thread assumed before ptxas has compiled the kernel."""

SIMT_DEVICE = replace(
    gpu_of_arch("sm_90"), name="SIMT", arch="opencl", sms=SIMT_CONCURRENT_BLOCKS,
    max_blocks_per_sm=1)
"""The CPU SIMT runner as a GPU: PoCL runs ``SIMT_CONCURRENT_BLOCKS`` work-groups at once, one
per host thread (an "SM" holding one block); per-block limits are CUDA's, as the OpenCL
target's."""


def device_of(target: Target | None) -> GPU:
    """The GPU a target compiles for: the table's GPU of a CUDA architecture (H200 when the
    target names none), the SIMT device for OpenCL."""
    if target is None:
        return gpu_of_arch("sm_90")
    if target.kind.name == "opencl":
        return SIMT_DEVICE
    arch = str(target.attrs.get("arch", "sm_90"))
    return gpu_of_arch(arch)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def blocks_per_sm(gpu: GPU, threads: int, registers: int, shared_bytes: int) -> int:
    """Resident blocks per SM of a kernel with ``threads`` threads per block, ``registers``
    per thread and ``shared_bytes`` of shared memory per block; 0 if it cannot launch.
    Registers limit the warps of each sub-partition of the register file (a warp's registers
    are all in one), as in CUDA's occupancy calculator: at 48 registers, 10 warps per
    sub-partition, 20 blocks of 64 threads (not 21, a 64K file divided by whole blocks)."""
    warps = _ceil_div(threads, gpu.warp_size)
    if warps == 0 or threads > gpu.max_threads_per_block \
            or shared_bytes > gpu.shared_bytes_per_block \
            or registers > gpu.max_registers_per_thread:
        return 0
    warp_registers = _ceil_div(max(registers, 1) * gpu.warp_size, gpu.register_granularity) \
        * gpu.register_granularity
    partition = gpu.registers_per_sm // gpu.register_partitions
    limits = [gpu.max_blocks_per_sm, gpu.max_threads_per_sm // (warps * gpu.warp_size),
              partition // warp_registers * gpu.register_partitions // warps]
    if shared_bytes:
        limits.append(gpu.shared_bytes_per_sm // (shared_bytes + gpu.reserved_shared_per_block))
    return max(0, min(limits))


def max_registers(gpu: GPU, threads: int, blocks: int) -> int:
    """The most registers per thread that keep ``blocks`` blocks of ``threads`` threads
    resident on one SM: what ptxas allows under ``__launch_bounds__(threads, blocks)``. The
    warps are spread over the register file's sub-partitions, so the fullest one holds
    ``ceil(warps / partitions)`` of them, each in granules: 21 blocks of 64 threads put 11
    warps in a sub-partition of 16K registers and get 40 registers (not 48, which would need
    the 42 warps spread evenly over the whole file)."""
    warps = _ceil_div(threads, gpu.warp_size) * max(blocks, 1)
    fullest = _ceil_div(warps, gpu.register_partitions)
    granules = gpu.registers_per_sm // gpu.register_partitions \
        // (gpu.register_granularity * fullest)
    return min(gpu.max_registers_per_thread,
               granules * gpu.register_granularity // gpu.warp_size)


REGISTERS_PER_CACHED_ELEMENT = 2
"""Registers a thread budgets per element of a re-read input: nvcc fully unrolls a thread's
loops over its row elements, and an input read again in a later loop (a later phase, or a
second output over the same row) then stays in registers from its first read to its last;
half of the register cap for those values leaves the other half for addresses, accumulators
and temporaries."""


RESERVED_REGISTERS = 24
"""Registers a thread wants beside those of its cached elements, where a launch bound of
fewer blocks per SM can give them (``launch_for_cached``): addresses, indices, accumulators
and the loads in flight of a phase that reads other inputs. 16 elements of an input held at
a cap of 48 spilled 72 B on sm_90 (fuzz 1229:4: a LayerNorm phase loading its scale from
global memory beside them, three outputs); 56 registers did not spill."""


FULL_UNROLL_STEPS = 32
"""Most steps of a thread's loop over its row elements that nvcc unrolls fully, and so the
most after which an input read again is still held in registers: ptxas on sm_90, LayerNorm
rows of a prime length on 1024 threads, one element a step: 24 and 32 steps took the 64
registers of the cap (values held), 36 to 64 steps 32 (a rolled loop that loads again)."""


PARTIAL_UNROLL_STEPS = 4
"""Steps nvcc unrolls at a time of a thread's loop over its row elements longer than
``FULL_UNROLL_STEPS``."""


def unrolled_steps(steps: int) -> int:
    """Steps of a thread's loop of ``steps`` steps that nvcc unrolls on its own: all of a short
    loop (``FULL_UNROLL_STEPS``), ``PARTIAL_UNROLL_STEPS`` of a long one."""
    return steps if steps <= FULL_UNROLL_STEPS else PARTIAL_UNROLL_STEPS


def loads_room(launch: Launch, cached: int, sums: int = 0) -> int:
    """Elements one thread of ``launch`` may have in flight from global memory in one
    unrolled loop beside ``cached`` elements of re-read inputs and ``sums`` partial sums kept
    in registers: each takes a register until its use, and nvcc issues every load of the
    steps it unrolls before the first use; half of what the cached elements leave
    (``cached_room``), as they have half of the cap. A LayerNorm's last phase over sub-rows
    of 8192 on 256 threads (fuzz graph 9005:41), 32 elements of each of two streamed inputs
    (scale and shift, as long as the row) per thread at a cap of 64: fully unrolled, 64
    registers and 16 B spilled on sm_90; four steps of 4 at a time, 64 registers, none."""
    return cached_room(launch, sums) - cached


def cached_elements_cap(launch: Launch) -> int:
    """Most elements of re-read inputs one thread of ``launch`` may keep in registers
    without spilling: its register cap (``max_registers``, the launch bound's) over
    ``REGISTERS_PER_CACHED_ELEMENT``."""
    return launch.max_registers // REGISTERS_PER_CACHED_ELEMENT


PARTIAL_SUM_RESERVE = 12
"""Registers a thread keeping many partial sums in registers wants beside them and its cached
elements (indices, loop counters, the value being added), up to which each partial sum is
budgeted a second register as a cached element is. ptxas at 64 registers (1024 threads),
column sums held per thread: 48, 51 and 52 sums fit, 54 spilled 32 B on sm_80 and 57 64 B
on sm_90; a LayerNorm backward at width 8192 (16 sums, 17 cached elements) fit, at 12288 (24,
25) spilled."""


HELD_RESULTS_REGISTERS = 24
"""Most registers per thread the partial sums of a column reduction of several results (an
online softmax's pair, an online variance's triple) take when every result is held in
registers; beyond, its first result alone is. ptxas at 64 registers (1024 threads), online
softmax pairs down the rows of a broadcast row: 12, 14 and 16 columns a thread (24 to 32
registers) fit, 20 spilled 16 B on sm_80 and sm_90 and 24 (fuzz graph 12021:84) 192 B;
online variance triples of a batch norm's columns: 8, 10 and 12 columns (24 to 36) fit, 16
spilled 64 B. Three quarters of the least that fit, for the row ops beside them."""


def cached_room(launch: Launch, sums: int = 0) -> int:
    """Most elements of re-read inputs one thread of ``launch`` may keep in registers beside
    ``sums`` partial sums of column reductions: a partial sum has no address to keep (it is
    updated in place), so it takes one register where a cached element is budgeted
    ``REGISTERS_PER_CACHED_ELEMENT``, and ``PARTIAL_SUM_RESERVE`` more at most stay free for
    the rest of the thread; ``cached_elements_cap`` with no sums, what it left (each sum
    budgeted two) with few, and below 0 when the sums alone do not fit."""
    free = launch.max_registers - sums - min(sums, PARTIAL_SUM_RESERVE)
    return free // REGISTERS_PER_CACHED_ELEMENT


def registers_for_cached(elements: int) -> int:
    """Registers a thread wants when it keeps ``elements`` elements of re-read inputs:
    ``RESERVED_REGISTERS`` and ``REGISTERS_PER_CACHED_ELEMENT`` for each."""
    return RESERVED_REGISTERS + elements * REGISTERS_PER_CACHED_ELEMENT


def with_blocks_per_sm(gpu: GPU, launch: Launch, blocks: int) -> Launch:
    """``launch`` at ``blocks`` blocks per SM, its register cap relaxed to what keeps them."""
    return replace(launch, blocks_per_sm=blocks,
                   max_registers=max_registers(gpu, launch.threads, blocks))


def launch_for_cached(gpu: GPU, launch: Launch, elements: int) -> Launch:
    """``launch`` with fewer blocks per SM, and so a higher register cap, when its cap is
    below ``RESERVED_REGISTERS`` and ``REGISTERS_PER_CACHED_ELEMENT`` for each of
    ``elements`` cached per thread; unchanged when it is not, or when no block count gives a
    thread that many registers (``cached_elements_cap`` still bounds what it keeps). Not for
    a persistent grid, whose tiles are sized to the wave (``tiles.tiles_for_cached``)."""
    needed = registers_for_cached(elements)
    if needed <= launch.max_registers:
        return launch
    blocks = blocks_per_sm(gpu, launch.threads, needed, launch.shared_bytes)
    if blocks == 0:
        return launch
    return with_blocks_per_sm(gpu, launch, blocks)


def launch_for_grid(gpu: GPU, launch: Launch, grid: int) -> Launch:
    """``launch`` with no more blocks per SM than a grid of ``grid`` blocks spread over the
    SMs puts on one, ``ceil(grid / SMs)``, and so a higher register cap: a launch bound of
    more blocks takes registers from threads that never share their SM with that many, and
    only ptxas' spills come of it. A LayerNorm over one row split over 512 blocks, 5 blocks
    per SM allowed by its shared memory, spilled 20 B at 48 registers on sm_90 (4 per SM
    hold all 512 on 132 SMs); a float16 LayerNorm of eight lanes beside ``1 / (|x| + 0.5)``
    on 8 rows, 8 blocks of 256 threads bound to 5 per SM, spilled 16 B at 48 on sm_80
    (fuzz graph 12014:310). The kernel's own registers still decide how many blocks share
    an SM where a grid is larger: the bound only caps them. Unchanged for a grid of 0 (not
    known yet, or computed at run time)."""
    resident = -(-grid // gpu.sms)
    if grid <= 0 or resident >= launch.blocks_per_sm:
        return launch
    return with_blocks_per_sm(gpu, launch, resident)


SHARED_ALIGNMENT = 64
"""TVM's CUDA code generator declares every shared array ``alignas(64)``."""


def aligned_shared(size: int) -> int:
    """Bytes a shared array of ``size`` bytes takes, declared ``alignas(SHARED_ALIGNMENT)``."""
    return _ceil_div(size, SHARED_ALIGNMENT) * SHARED_ALIGNMENT


def kernel_shared_bytes(kernel: tirx.PrimFunc) -> int:
    """Static shared memory a finalised device kernel declares: its shared allocations, each
    rounded up to the alignment they are declared with (an upper bound of ptxas' figure)."""
    total = 0

    def visit(stmt: tirx.AllocBuffer) -> None:
        nonlocal total
        buf = stmt.buffer
        if buf.scope().startswith("shared") and all(isinstance(d, tirx.IntImm)
                                                    for d in buf.shape):
            size = prod(int(d) for d in buf.shape) * max(1, buf.dtype.bits
                                                           * buf.dtype.lanes // 8)
            total += aligned_shared(size)

    tvm_ffi.structural_walk(kernel, [(tirx.AllocBuffer, visit)])
    return total


def launch_config(gpu: GPU, threads: int, shared_bytes: int, grid: int = 0,
                  assumed_registers: int = ASSUMED_REGISTERS) -> Launch:
    """Assume ``assumed_registers`` per thread, derive blocks per SM, at most as many as a
    grid of ``grid`` blocks puts on one SM (``launch_for_grid``; 0: a grid not known yet),
    and relax the register cap to what keeps them; raises ValueError when such a block
    cannot launch at all."""
    blocks = blocks_per_sm(gpu, threads, assumed_registers, shared_bytes)
    if blocks == 0:
        raise ValueError(f"a block of {threads} threads with {shared_bytes} B of shared memory "
                         f"cannot launch on {gpu.name}")
    launch = Launch(gpu.name, threads, shared_bytes, blocks,
                    max_registers(gpu, threads, blocks), gpu.sms, grid)
    return launch_for_grid(gpu, launch, grid)


__all__ = ["ASSUMED_REGISTERS", "REGISTERS_PER_CACHED_ELEMENT", "RESERVED_REGISTERS",
           "PARTIAL_SUM_RESERVE", "SIMT_DEVICE", "aligned_shared", "blocks_per_sm",
           "cached_elements_cap", "cached_room",
           "device_of", "kernel_shared_bytes", "launch_config", "launch_for_cached",
           "launch_for_grid", "loads_room", "max_registers", "registers_for_cached",
           "unrolled_steps", "with_blocks_per_sm"]
