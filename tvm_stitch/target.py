"""Targets: the GPU we compile for, and the OpenCL target the CPU SIMT runner builds with."""

from __future__ import annotations

from tvm.target import Target

DEFAULT_TARGET = "cuda:sm_90"

# Per-block limits we schedule against. 48 KB is CUDA's static shared-memory limit per block
# on every architecture we target; larger needs dynamic shared memory and an opt-in.
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_MEMORY_PER_BLOCK = 49152
WARP_SIZE = 32

SIMT_CONCURRENT_BLOCKS = 8
"""Work-groups the CPU SIMT runner executes at once: it starts PoCL with this many host threads
(``POCL_MAX_PTHREAD_COUNT``) unless the environment sets another count. A kernel with a grid
barrier runs with its real barrier only when its grid fits; schedules for the OpenCL target
size persistent grids to it."""


def cuda_target(arch: str = "sm_90") -> Target:
    """A CUDA target for ``arch`` with the limits MetaSchedule and our schedules read."""
    return Target(
        {
            "kind": "cuda",
            "arch": arch,
            "max_threads_per_block": MAX_THREADS_PER_BLOCK,
            "max_num_threads": MAX_THREADS_PER_BLOCK,
            "max_shared_memory_per_block": MAX_SHARED_MEMORY_PER_BLOCK,
            "thread_warp_size": WARP_SIZE,
        }
    )


def opencl_target() -> Target:
    """The OpenCL target used to run GPU-scheduled TIR on PoCL.

    The limits match CUDA's so that a kernel scheduled for CUDA passes TVM's checks here too.
    The warp size stays 1: PoCL's CPU device has no sub-group shuffles, so TVM lowers
    cross-thread reductions through shared memory and barriers, which PoCL executes faithfully.
    """
    return Target(
        {
            "kind": "opencl",
            "max_threads_per_block": MAX_THREADS_PER_BLOCK,
            "max_num_threads": MAX_THREADS_PER_BLOCK,
            "max_shared_memory_per_block": MAX_SHARED_MEMORY_PER_BLOCK,
            "thread_warp_size": 1,
        }
    )


def parse_target(spec: str | Target) -> Target:
    """Turn ``cuda``, ``cuda:sm_80``, ``opencl`` or a Target into a Target.

    Raises ValueError on anything else, naming the accepted forms.
    """
    if isinstance(spec, Target):
        return spec
    kind, _, arch = spec.partition(":")
    if kind == "cuda":
        return cuda_target(arch or "sm_90")
    if kind == "opencl" and not arch:
        return opencl_target()
    raise ValueError(f"unknown target {spec!r}: use 'cuda', 'cuda:sm_XX' or 'opencl'")


def is_gpu(target: Target) -> bool:
    """True for targets whose kernels run as SIMT grids (CUDA, OpenCL)."""
    return target.kind.name in ("cuda", "opencl")


__all__ = ["DEFAULT_TARGET", "SIMT_CONCURRENT_BLOCKS", "cuda_target", "opencl_target",
           "parse_target", "is_gpu"]
