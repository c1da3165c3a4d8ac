"""Analytic time estimate of memory-bound kernels: launches, bytes and parallelism.

Per kernel::

    time = launch_overhead + grid_barriers x grid_barrier_cost + bytes / effective_bandwidth
    effective_bandwidth = peak x min(1, active_SMs / SMs) x min(1, in_flight / needed)

- ``active_SMs = min(SMs, blocks)``: a grid of 64 blocks keeps 64 SMs busy at most.
- ``needed`` is Little's law per SM: the bytes that must be in flight on each SM to keep its
  share of DRAM busy, ``(peak / SMs) x DRAM latency``.
- ``in_flight`` is what an active SM has outstanding: its resident threads (its share of the
  grid, capped by thread-limited occupancy: ``max_threads_per_SM // threads_per_block``
  blocks, at most ``max_blocks_per_SM``) x the accesses each thread can have in flight
  (its accesses of one step, at most ``loads_in_flight_per_thread``) x the bytes per access
  (so vectorised kernels need fewer threads). A step is one iteration of the serial loops
  that synchronise threads (``traffic``): a block that walks 150 rows in sequence, reducing
  each across a warp, has one row's loads in flight, not 150. Measured on the H200, a
  750000 x 32 row sum on a warp per row, one load per thread and row, took 48.5 us; on 8
  threads per row, four loads each, 34.3 us.

The total is the sum over kernels: kernels of one model run back to back on one stream.
Compute, L2 hits and shared-memory time are ignored: this ranks memory-intensive code, it
does not predict matmuls.

Figures (``GPUS``, the one GPU table of the package: the roofline model reads its bandwidth and
SM count, ``tvm_stitch.schedule.occupancy`` its per-SM and per-block limits): bandwidth and SM
counts are the vendors' (H200 SXM 4.8 TB/s HBM3e, 132 SMs; A100 SXM 2.0 TB/s (80 GB) HBM2e,
108 SMs; V100 SXM2 0.9 TB/s HBM2, 80 SMs). Per-SM limits are those of NVIDIA's CUDA occupancy
calculator for compute capability 7.0, 8.0 and 9.0: 2048 threads, 32 blocks, 64K 32-bit
registers in four sub-partitions of 16K (a warp takes its registers from one of them, in
units of 256), at most 255 registers per thread; shared memory per SM 96 KB (7.0), 164 KB
(8.0), 228 KB (9.0), with 1 KB reserved by CUDA per resident block since 8.0; 48 KB of
static shared memory per block on all three. DRAM latency is one round
figure, 600 ns: pointer-chasing microbenchmarks put loaded HBM latency on Volta to Hopper
between about 400 and 800 ns (Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
Microbenchmarking", 2018; Chips and Cheese's GPU memory latency tests), and one figure keeps
the model explainable. Four accesses in flight per
thread is an assumption: TVM unrolls the short loops of memory-bound kernels, so a thread
issues a few independent loads before the first returns.

Launch overhead is the effective cost of one more kernel in a back-to-back sequence
(launch latency, first-wave ramp-up and last-wave tail): 5 us on V100, 4 us on A100 and
3 us on H200. The AStitch paper measured about 10 us per kernel launch on V100 under
TensorFlow (against 2.5 us for a grid barrier), which includes framework overhead; CUDA's
own launch latency on recent GPUs is a few microseconds (NVIDIA's CUDA Graphs material). These
three figures are assumptions to calibrate against measurements on a GPU.

A grid barrier (Global stitching, counted in the kernel's TIR) costs 1.5 us on H200: measured
there, softmax_64x30000 went from 15.9 to 12.8 us when two of its four grid barriers went, with
the one-block column phases they closed, on a grid of 256 blocks
(``docs/results/gpu-2026-11-29-h200.md``). 2.5 us on V100 is the AStitch
paper's figure; 2.0 us on A100 lies between, an assumption. Without it, a kernel with one grid
barrier fewer for the same bytes would be estimated as fast, and the rules and the tuner's
analytic model could not prefer it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """One GPU: what the roofline model and the occupancy calculation need to know."""

    name: str
    arch: str  # CUDA architecture, as nvcc spells it
    bandwidth: float  # peak DRAM bandwidth, bytes per second
    sms: int
    launch_overhead_us: float
    grid_barrier_us: float  # one grid barrier of a persistent grid (Global stitching)
    shared_bytes_per_sm: int  # shared memory one SM can give to resident blocks
    reserved_shared_per_block: int = 1024  # CUDA's own shared memory per resident block
    shared_bytes_per_block: int = 49152  # static shared memory limit of one block
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    register_granularity: int = 256  # registers are allocated per warp in these units
    register_partitions: int = 4  # the register file's sub-partitions (a warp's are in one)
    warp_size: int = 32
    dram_latency_ns: float = 600.0
    loads_in_flight_per_thread: int = 4

    @property
    def bytes_in_flight_needed_per_sm(self) -> float:
        """Little's law: bytes one SM must have outstanding to draw its share of bandwidth."""
        return self.bandwidth / self.sms * self.dram_latency_ns * 1e-9


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU("H200", "sm_90", bandwidth=4.8e12, sms=132, launch_overhead_us=3.0,
            grid_barrier_us=1.5, shared_bytes_per_sm=228 * 1024),
        GPU("A100", "sm_80", bandwidth=2.0e12, sms=108, launch_overhead_us=4.0,
            grid_barrier_us=2.0, shared_bytes_per_sm=164 * 1024),
        GPU("V100", "sm_70", bandwidth=0.9e12, sms=80, launch_overhead_us=5.0,
            grid_barrier_us=2.5, shared_bytes_per_sm=96 * 1024, reserved_shared_per_block=0),
    )
}


def gpu_of_arch(arch: str) -> GPU:
    """The GPU of ``GPUS`` with CUDA architecture ``arch`` (``sm_90`` -> H200)."""
    for gpu in GPUS.values():
        if gpu.arch == arch:
            return gpu
    known = ", ".join(f"{g.arch} ({g.name})" for g in GPUS.values())
    raise ValueError(f"no GPU of architecture {arch!r} in the table; known: {known}")


@dataclass(frozen=True)
class KernelWork:
    """The figures of one kernel launch the model reads."""

    global_bytes: int
    accesses: int
    blocks: int
    threads_per_block: int
    step_accesses: float | None = None  # accesses of one synchronising step; None: all
    grid_barriers: int = 0


def resident_blocks_per_sm(gpu: GPU, threads_per_block: int) -> int:
    """Blocks of ``threads_per_block`` threads one SM holds at once (thread-limited)."""
    return max(1, min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // threads_per_block))


def waves(gpu: GPU, blocks: int, threads_per_block: int) -> float:
    """How many times over the grid fills the GPU: blocks / (SMs x resident blocks per SM)."""
    return blocks / (gpu.sms * resident_blocks_per_sm(gpu, threads_per_block))


def effective_bandwidth(gpu: GPU, work: KernelWork) -> float:
    """Bytes per second the kernel can draw, by the formula in the module docstring."""
    if work.blocks <= 0 or work.threads_per_block <= 0:
        return 0.0
    active_sms = min(gpu.sms, work.blocks)
    blocks_per_sm = min(work.blocks / active_sms,
                        resident_blocks_per_sm(gpu, work.threads_per_block))
    threads = work.blocks * work.threads_per_block
    step = work.accesses if work.step_accesses is None else work.step_accesses
    accesses_per_thread = step / threads
    bytes_per_access = work.global_bytes / work.accesses if work.accesses else 0.0
    in_flight = (blocks_per_sm * work.threads_per_block
                 * min(accesses_per_thread, gpu.loads_in_flight_per_thread) * bytes_per_access)
    concurrency = min(1.0, in_flight / gpu.bytes_in_flight_needed_per_sm)
    return gpu.bandwidth * (active_sms / gpu.sms) * concurrency


TIME_MARGIN = 1.5
"""How many times slower than another kernel one may be estimated and still be taken for
what else it saves (TVM's fusion for the same ops, ``transform.yardstick``; bytes, in small
work, ``schedule.decisions``): the model ranks, it does not predict to a few percent."""


def kernel_time_us(gpu: GPU, work: KernelWork) -> float:
    """Estimated microseconds for one launch: overhead and grid barriers, plus bytes at
    effective bandwidth."""
    fixed = gpu.launch_overhead_us + work.grid_barriers * gpu.grid_barrier_us
    if work.global_bytes == 0:
        return fixed
    return fixed + work.global_bytes / effective_bandwidth(gpu, work) * 1e6


def total_time_us(gpu: GPU, kernels: list[KernelWork]) -> float:
    """Estimated microseconds for kernels launched back to back."""
    return sum(kernel_time_us(gpu, k) for k in kernels)
