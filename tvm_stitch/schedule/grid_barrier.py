"""The grid barrier of Global stitching: every block of a persistent grid waits for all others.

TVM 0.27 has a global barrier in its CUDA code generator (``tvm_storage_sync("global")``
spinning on ``__tvm_global_barrier_state``), but it is not sound for us: its counter only
ever grows and is compared with a per-launch expectation that the runtime must reset before
every launch (``tvm_global_barrier_kinit`` resets only the shared copy), and 0.27's runtime
no longer does that reset, so a second launch passes every barrier at once. We emit our own:
a self-resetting generation barrier on two 32-bit words of global memory, ``state[0]`` (blocks
arrived) and ``state[1]`` (generation). In TIR it is one statement,
``T.call_extern("void", "tvm_stitch_grid_sync", state.data)``, executed by every thread of
every block; its definition (CUDA below, and OpenCL for the SIMT runner) is prepended to the
kernel source: for CUDA by ``tvm_callback_cuda_postproc``, the hook TVM's CUDA code generator
calls on every module it emits, for OpenCL by the SIMT runner.

The state is an argument of the kernel, a zero-initialised constant that the stitch flow adds
to the kernel's Relax call (``tvm_stitch.transform.kernel_state``): no host reset is needed,
because every completed barrier leaves ``state[0]`` at 0 again and ``state[1]`` is only ever
compared for a change. One state per kernel; kernels of one stream never overlap, so launches
do not share it concurrently.

Memory ordering (CUDA memory model, sm_70 and later)::

    __syncthreads();                       // (1)
    if (thread 0 of the block) {
        gen = volatile load(state[1]);     // (2)
        __threadfence();                   // (3)
        if (atomicAdd(&state[0], 1) == blocks - 1) {
            atomicExch(&state[0], 0);      // (4)
            __threadfence();
            atomicAdd(&state[1], 1);       // (5)
        } else {
            while (volatile load(state[1]) == gen) {}   // (6)
        }
        __threadfence();                   // (7)
    }
    __syncthreads();                       // (8)

(1) orders every write of the block before thread 0's next operations (block scope); the
fence (3) is cumulative, so those writes are ordered at GPU scope before the arrival, the
atomic increment. (2) reads the generation *before* arriving: it cannot change until every
block, this one included, has arrived, so ``gen`` is the generation of this barrier. The last
block to arrive sees all other arrivals (atomics on one word are totally ordered), resets the
count (4) and, after a fence, bumps the generation (5): a block released by the bump may
arrive at the next barrier at once, and must find the count at 0 already. Waiting blocks spin
on volatile loads (6), which bypass the non-coherent L1; the fence (7) after seeing the bump
makes every write that happened before any block's arrival visible to this block's later
loads (acquire), and (8) extends that to all its threads. Only blocks that are all resident
can meet at a barrier: the persistent grid is capped at one wave (``occupancy``), asserted
when the kernel is emitted and checked again against ptxas' registers (``testing.resources``).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from .cluster import is_extern_call, with_cluster_dims

GRID_SYNC = "tvm_stitch_grid_sync"
"""Name of the device function every thread calls at a grid barrier."""

STATE_DTYPE = "uint32"
STATE_WORDS = 2
"""The barrier's state: arrived-block count and generation."""

CUDA_DEFINITION = r"""
// tvm-stitch grid barrier (Global stitching); memory ordering: tvm_stitch/schedule/grid_barrier.py
__device__ __forceinline__ void tvm_stitch_grid_sync(unsigned int* state) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    volatile unsigned int* generation = state + 1;
    unsigned int gen = *generation;
    unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    __threadfence();
    if (atomicAdd(state, 1u) == blocks - 1u) {
      atomicExch(state, 0u);
      __threadfence();
      atomicAdd(state + 1, 1u);
    } else {
      while (*generation == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}
"""

OPENCL_DEFINITION = r"""
// tvm-stitch grid barrier (Global stitching); memory ordering: tvm_stitch/schedule/grid_barrier.py
void tvm_stitch_grid_sync(__global uint* state) {
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  if (get_local_id(0) == 0 && get_local_id(1) == 0 && get_local_id(2) == 0) {
    volatile __global uint* generation = state + 1;
    uint gen = *generation;
    uint blocks = get_num_groups(0) * get_num_groups(1) * get_num_groups(2);
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    if (atomic_inc(state) == blocks - 1) {
      atomic_xchg(state, 0);
      mem_fence(CLK_GLOBAL_MEM_FENCE);
      atomic_inc(generation);
    } else {
      while (*generation == gen) {
      }
    }
    mem_fence(CLK_GLOBAL_MEM_FENCE);
  }
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
}
"""


def state_buffer(name: str = "grid_barrier_state") -> tirx.Buffer:
    """A new buffer parameter for a kernel's barrier state."""
    return tirx.decl_buffer((STATE_WORDS,), STATE_DTYPE, name=name)


def grid_sync(state: tirx.Buffer) -> tirx.Stmt:
    """The TIR statement of one grid barrier on ``state``."""
    return tirx.Evaluate(tirx.call_extern("void", GRID_SYNC, state.data))


def is_grid_sync(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` is a grid barrier."""
    return isinstance(stmt, tirx.Evaluate) and _is_sync_call(stmt.value)


def _is_sync_call(expr: object) -> bool:
    return is_extern_call(expr, GRID_SYNC)


def count_grid_barriers(func: tirx.PrimFunc) -> int:
    """Grid barriers in ``func`` (statically, not counting loop trips)."""
    calls: list[tvm.ir.Call] = []
    tvm_ffi.structural_walk(func, [(tvm.ir.Call, calls.append)])
    return sum(1 for c in calls if _is_sync_call(c))


def with_definition(source: str, definition: str) -> str:
    """``source`` with ``definition`` prepended when it calls the grid barrier."""
    if GRID_SYNC not in source or definition.strip() in source:
        return source
    return definition + source


_previous_postproc = tvm_ffi.get_global_func("tvm_callback_cuda_postproc", allow_missing=True)


@tvm_ffi.register_global_func("tvm_callback_cuda_postproc", override=True)
def _cuda_postproc(code: str, target: object = None) -> str:
    """TVM's hook on generated CUDA source: define the grid barrier where it is called, and
    give cluster kernels their size (``cluster``; after any hook registered before ours)."""
    if _previous_postproc is not None:
        code = str(_previous_postproc(code, target))
    return with_cluster_dims(with_definition(code, CUDA_DEFINITION))


__all__ = ["GRID_SYNC", "STATE_DTYPE", "STATE_WORDS", "CUDA_DEFINITION", "OPENCL_DEFINITION",
           "state_buffer", "grid_sync", "is_grid_sync", "count_grid_barriers", "with_definition"]
