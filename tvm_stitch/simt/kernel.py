"""Run one GPU-scheduled PrimFunc on the CPU through OpenCL on PoCL.

The PrimFunc is lowered by TVM for an OpenCL target (``tvm_stitch.lowering``), its OpenCL C
is built by PoCL, and each kernel is launched with the work-group and grid sizes of its own
thread extents. PoCL runs work-groups with real local memory and barriers, so a missing
barrier or a wrong index gives wrong numbers here just as it would on a GPU.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pyopencl as cl
from tvm import tirx

from ..lowering import (
    BufferArg,
    LoweredFunc,
    LoweringError,
    WorkspaceArg,
    evaluate_int,
    lower,
    scalar_dtype,
)
from ..target import opencl_target
from . import clusters, device, retype
from .grid import GridBarriers


@functools.cache
def _context() -> tuple[cl.Context, cl.CommandQueue]:
    platforms = cl.get_platforms()
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices:
        raise RuntimeError("no OpenCL device: install pyopencl[pocl] for the CPU SIMT runner")
    ctx = cl.Context(devices[:1])
    return ctx, cl.CommandQueue(ctx)


def concurrent_work_groups() -> int:
    """Work-groups PoCL runs at once: its host threads, reported as compute units."""
    ctx, _ = _context()
    return int(ctx.devices[0].max_compute_units)


def _bool_as_bytes(source: str) -> str:
    """Address bool buffers as bytes: OpenCL has no vector loads of bool, which TVM emits for
    vectorised boolean masks. numpy bools are one byte, so the memory layout is unchanged."""
    return re.sub(r"\bbool\s*\*", "uchar*", source)


# C99's float-suffixed math functions that TVM's OpenCL code generator emits for intrinsics it
# has no OpenCL rule for; OpenCL C overloads the plain names instead and has no ``acosf``.
_C_FLOAT_MATH = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "atan2", "tan", "log1p",
                 "hypot", "copysign", "nextafter", "ldexp")
_C_FLOAT_CALL = re.compile(r"\b(" + "|".join(_C_FLOAT_MATH) + r")f\(")


def _opencl_math_names(source: str) -> str:
    """Call OpenCL's overloaded math functions where TVM emitted C's ``f``-suffixed names."""
    return _C_FLOAT_CALL.sub(r"\1(", source)


SCALAR_SELECT = """
#undef select
#define select(a, b, c) ((c) ? (b) : (a))
"""
"""OpenCL's ``select`` as C's conditional, for scalar kernels: TVM's OpenCL code passes it
operands of different types where C promotes small integers (``select(rmod + y, rmod, c)`` on
int8 is ``select(int, char, char)``), which PoCL's overloads reject as ambiguous (ONNX node
tests ``test_mod_mixed_sign_int8``/``int16``). The runner runs every kernel lane by lane, so a
scalar conditional is ``select`` exactly; the assignment converts back as CUDA's code does."""


def _with_helpers(source: str) -> str:
    """``source`` with the definitions of the helper functions it calls prepended."""
    if "select(" in source:
        source = SCALAR_SELECT + source
    if device.WMMA_PREFIX in source:
        source = device.WMMA_DEFINITIONS + source
    if retype.ROUND_HALF in source:
        source = retype.OPENCL_DEFINITION + source
    return clusters.with_definition(source)


BUILD_OPTIONS = ("-cl-opt-disable",)
"""Options PoCL builds every kernel with. PoCL compiles a kernel for its work-group size at
the first launch, turning each region between two barriers into a loop over the work-items;
with optimisation on, LLVM's loop unroller then spent minutes on kernels with a few dozen
barriers (a warp-per-row kernel of two LayerNormalizations on (2048, 31): four tree
reductions, 28 barriers, over 3 minutes before its first launch; the fuzzer took it for a
hang). Unoptimised, it builds in a tenth of a second and runs at most a few times slower:
the runner checks numbers, not speed."""


@functools.cache
def _program(source: str) -> cl.Program:
    ctx, _ = _context()
    return cl.Program(ctx, source).build(options=list(BUILD_OPTIONS))


class SimtFunction:
    """A PrimFunc ready to run on the SIMT runner; call it with one numpy array per buffer
    parameter (inputs and outputs, destination-passing style). Outputs are written in place.
    """

    def __init__(self, lowered: LoweredFunc, source: str | None = None) -> None:
        self.lowered = lowered
        self.grid_barriers = GridBarriers(lowered)
        if source is None:
            source = _with_helpers(_opencl_math_names(_bool_as_bytes(
                self.grid_barriers.source())))
        self.source = source
        program = _program(self.source)
        self._kernels = {name: cl.Kernel(program, name)
                         for name in self.grid_barriers.kernel_names()}

    @classmethod
    def from_primfunc(cls, func: tirx.PrimFunc, name: str = "main") -> SimtFunction:
        """Lower ``func`` for OpenCL and build it with PoCL.

        Vectorised loops run lane by lane: TVM's OpenCL code generator gets vector booleans
        wrong (OpenCL's vector ``&&`` and comparisons yield -1 for true, which TVM then tests
        with ``0 < x``), while CUDA, like a per-lane loop, computes each lane as a scalar.
        float16 kernels run as float32 ones that round every float16 result to half
        (``retype``); calls convert at the boundary. Dynamic shared memory and warp matrix
        fragments are rewritten into what OpenCL has (``device``).
        """
        lowered = lower(retype.float32_version(func), name, opencl_target(), vectorize=False)
        return cls(device.for_opencl(lowered, device.half_accumulators(func)))

    def __call__(self, *arrays: np.ndarray, **scalars: int) -> None:
        given, arrays = arrays, retype.widen(arrays)
        low = self.lowered
        buffers = [p for p in low.params if isinstance(p.ty, tirx.BufferType)]
        if len(arrays) != len(buffers):
            raise ValueError(f"{low.name}: expects {len(buffers)} arrays, got {len(arrays)}")
        for p, a in zip(buffers, arrays, strict=True):
            if str(a.dtype) != str(p.dtype):
                raise ValueError(f"{low.name}: {p.name} is {p.dtype}, got an array of {a.dtype}")
        ana = low.bind_shapes([a.shape for a in arrays], scalars)
        ctx, queue = _context()
        mf = cl.mem_flags
        cl_buffers = [
            cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                      hostbuf=np.ascontiguousarray(a) if a.size else np.zeros(1, a.dtype))
            for a in arrays
        ]
        workspaces = [
            cl.Buffer(ctx, mf.READ_WRITE, max(1, np.dtype(w.dtype).itemsize * math.prod(
                evaluate_int(ana, d, f"{low.name} workspace size") for d in w.shape)))
            for w in low.workspaces
        ]
        for launch in low.launch_sequence(ana):
            kernel = low.kernel(launch.kernel)
            grid, group = launch.geometry(ana)
            if 0 in grid or 0 in group:
                continue
            names = self.grid_barriers.launches(launch.kernel, math.prod(grid),
                                                concurrent_work_groups())
            spills = [] if names == [launch.kernel] else [
                cl.Buffer(ctx, mf.READ_WRITE, s.nbytes)
                for s in self.grid_barriers.spills.get(launch.kernel, [])]
            for name in names:
                cl_kernel = self._kernels[name]
                for i, spill in enumerate(spills, start=len(kernel.params)):
                    cl_kernel.set_arg(i, spill)
                for i, (param, arg) in enumerate(zip(kernel.params, launch.args, strict=True)):
                    if isinstance(arg, BufferArg):
                        cl_kernel.set_arg(i, cl_buffers[arg.index])
                    elif isinstance(arg, WorkspaceArg):
                        cl_kernel.set_arg(i, workspaces[arg.index])
                    elif scalar_dtype(param).startswith(("int", "uint")):
                        value = evaluate_int(ana, arg, f"{launch.kernel} argument {param.name}")
                        cl_kernel.set_arg(i, np.dtype(scalar_dtype(param)).type(value))
                    else:
                        raise LoweringError(f"{launch.kernel}: cannot pass argument {arg}")
                global_size = tuple(g * t for g, t in zip(grid, group, strict=True))
                cl.enqueue_nd_range_kernel(queue, cl_kernel, global_size, group)
        for a, buf in zip(arrays, cl_buffers, strict=True):
            if a.size:
                out = np.empty_like(a, order="C")
                cl.enqueue_copy(queue, out.view(np.uint8) if a.dtype == bool else out, buf)
                a[...] = out.view(np.uint8) != 0 if a.dtype == bool else out
        queue.finish()
        retype.narrow_into(given, arrays)
