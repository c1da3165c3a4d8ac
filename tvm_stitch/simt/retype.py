"""Run float16 kernels on the SIMT runner as float32 kernels that round like float16 ones.

PoCL's CPU device has no ``cl_khr_fp16`` (its extensions list none, its half_fp_config is 0):
OpenCL C can load and store halves there (``vload_half``/``vstore_half``) but not compute with
them, so the code TVM's OpenCL generator emits for a float16 PrimFunc does not build. For SIMT
runs only, :func:`float32_version` rewrites such a PrimFunc into a float32 one with the same
loops, thread bindings, shared-memory staging and barriers (so the same launch geometry and the
same indices) in which every value a float16 operation produces is rounded to the nearest half
(:func:`half_rounded`). That is what the GPU computes: float32's 24 bits are twice float16's 11
plus two, so an add, subtract, multiply, divide or square root done in float32 and rounded once
to half is the correctly rounded half result, and a kernel that accumulates in a float16
register shows the error it has on the GPU. Rounding each operation, not each store, is the
faithful choice: a float16 kernel also keeps halves that no store sees (the operands of a
longer expression, the partial sums a cross-thread reduction combines). :func:`widen` and
:func:`narrow_into` convert the float16 arrays at the kernel's boundary, exactly.

The rounding is OpenCL's own ``vstore_half_rte`` and ``vload_half`` (round to nearest even,
overflow to infinity, subnormal halves kept), which PoCL implements without ``cl_khr_fp16``;
it matched numpy's float32-to-float16 conversion on every half, the float32 values next to and
halfway above each, and 4 million random float32 bit patterns.

Limitations, by design:

- Math functions (``exp``, ``tanh``, ...) of a float16 value are computed in float32 and
  rounded once, which is how CUDA's half math functions work too, but not bit for bit theirs;
  where nvcc contracts a float16 multiply and add into one fused multiply-add, the GPU rounds
  once where this rounds twice.
- Vector float16 expressions are not rounded; scheduled PrimFuncs have none (vectors come
  from vectorised loops, which the runner runs lane by lane).
- Shared memory per block doubles for float16 staging buffers.

The real float16 kernel is still what gets compiled for CUDA: resource checks
(``tvm_stitch.testing.resources``) run ``nvcc`` on the untouched float16 CUDA source.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import IRModule

# Whole dtype tokens only: ``float16``, ``float16x4`` and ``T.float16(...)``, never a name
# such as ``T_cast_float16`` (the underscore makes it one word).
_FLOAT16 = re.compile(r"\bfloat16(?=\b|x\d)")

ROUND_HALF = "stitch_round_half"
"""The OpenCL function a float16 operation's result goes through (:data:`OPENCL_DEFINITION`)."""

OPENCL_DEFINITION = f"""
float {ROUND_HALF}(float x) {{
  ushort bits;
  vstore_half_rte(x, 0, (__private half*)&bits);
  return vload_half(0, (__private half*)&bits);
}}
"""
"""OpenCL C of :data:`ROUND_HALF`, prepended to the source of every kernel that calls it."""

_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def float32_version(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float16 dtype replaced by float32 and every float16 result rounded
    to half; ``func`` itself if it has no float16.

    Cross-thread reductions are lowered first, while the function is still float16: TVM
    recognises a reducer by its identity (float16's lowest value for a max), and the rounding
    goes into the reducer's combiner, so each partial sum its tree of threads adds is a half.
    The dtypes are then replaced by a TVMScript round trip: printing and parsing preserve the
    loop structure, thread bindings, storage scopes and attributes exactly, and the dtype is a
    token of the text.
    """
    if _FLOAT16.search(func.script()) is None:
        return func
    lowered = tvm.transform.Sequential([s_tir.transform.CanonicalizeLoop(),
                                        s_tir.transform.LowerCrossThreadReduction()])(
        IRModule({"main": func}))["main"]
    script = half_rounded(lowered).script()
    # A lowered cross-thread reduction reads loop variables inside its block, which the
    # parser's well-formedness check refuses although TVM's own passes produce it.
    retyped = tvm.script.from_source(_FLOAT16.sub("float32", script), check_well_formed=False)
    if not isinstance(retyped, tirx.PrimFunc):
        raise TypeError(f"retyping a PrimFunc gave a {type(retyped).__name__}")
    return retyped


def half_rounded(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the result of every float16 arithmetic operation, conversion and math
    call wrapped in :data:`ROUND_HALF`, and every float16 constant replaced by the half it
    denotes (TVM keeps the literal, CUDA's code converts it with ``__float2half_rn``).

    Loads, minima, maxima and selections are left alone: from halves they give halves.
    """

    def rounded(expr: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
        return tirx.call_pure_extern("float16", ROUND_HALF, expr) if _is_float16(expr) else expr

    def on_cast(cast: tirx.Cast) -> tvm.ir.PrimExpr:
        return cast if _is_float16(cast.value) else rounded(cast)

    def on_call(call: tvm.ir.Call) -> tvm.ir.PrimExpr:
        return call if call.op.same_as(_IF_THEN_ELSE) else rounded(call)

    def on_constant(imm: tirx.FloatImm) -> tvm.ir.PrimExpr:
        # a half that seven digits do not print exactly is written as its bits later
        # (``device.exact_constants``)
        return tirx.FloatImm("float16", float(np.float16(imm.value))) if _is_float16(imm) else imm

    arithmetic = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv,
                  tirx.FloorMod)
    return tvm_ffi.structural_map(func, [(arithmetic, rounded), (tirx.Cast, on_cast),
                                         (tvm.ir.Call, on_call),
                                         (tirx.FloatImm, on_constant)])


def _is_float16(expr: tvm.ir.PrimExpr) -> bool:
    """Whether ``expr`` is a scalar float16 value (not a vector, a pointer or a handle)."""
    return isinstance(expr.ty, tvm.ir.PrimType) and str(expr.ty.dtype) == "float16"


def widen(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays with every float16 one replaced by a float32 copy (others unchanged)."""
    return [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays]


def narrow_into(given: Sequence[np.ndarray], widened: Sequence[np.ndarray]) -> None:
    """Write each widened copy back into the float16 array it was made from (in place)."""
    for original, wide in zip(given, widened, strict=True):
        if wide is not original:
            original[...] = wide.astype(original.dtype)
