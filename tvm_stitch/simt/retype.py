"""Run float16 kernels on the SIMT runner as float32 kernels with the same index logic.

PoCL's CPU device has no ``cl_khr_fp16``: OpenCL C can load and store halves
(``vload_half``/``vstore_half``) but not compute with them, so the code TVM's OpenCL generator
emits for a float16 PrimFunc does not build. For SIMT runs only, :func:`float32_version`
rewrites such a PrimFunc so that every float16 buffer, cast, constant and vector type becomes
float32; its loops, thread bindings, shared-memory staging and barriers are untouched, so the
kernel runs with the same launch geometry and the same indices. :func:`widen` and
:func:`narrow_into` convert the float16 arrays at the kernel's boundary.

Limitations, by design:

- float16 rounding of intermediates *inside* a kernel is not reproduced (they are computed in
  float32); values crossing a kernel boundary are rounded to float16, as on the GPU.
- float16's largest finite magnitude (65504), which TVM uses as the identity of max and min
  reductions, becomes float32's, so that TVM still recognises the reducer; any other constant
  keeps its value.
- Shared memory per block doubles for float16 staging buffers.

The real float16 kernel is still what gets compiled for CUDA: resource checks
(``tvm_stitch.testing.resources``) run ``nvcc`` on the untouched float16 CUDA source.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import tvm
from tvm import tirx

# Whole dtype tokens only: ``float16``, ``float16x4`` and ``T.float16(...)``, never a name
# such as ``T_cast_float16`` (the underscore makes it one word).
_FLOAT16 = re.compile(r"\bfloat16(?=\b|x\d)")
_FLOAT16_EXTREME = re.compile(r"T\.float16\((-?)65504(?:\.0*)?\)")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def float32_version(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float16 dtype replaced by float32; ``func`` itself if it has none.

    Works by a TVMScript round trip: printing and parsing preserve the loop structure, thread
    bindings, storage scopes and attributes exactly, and the dtype is a token of the text.
    """
    script = func.script()
    if _FLOAT16.search(script) is None:
        return func
    script = _FLOAT16_EXTREME.sub(lambda m: f"T.float32({m.group(1)}{_FLOAT32_MAX!r})", script)
    retyped = tvm.script.from_source(_FLOAT16.sub("float32", script))
    if not isinstance(retyped, tirx.PrimFunc):
        raise TypeError(f"retyping a PrimFunc gave a {type(retyped).__name__}")
    return retyped


def widen(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays with every float16 one replaced by a float32 copy (others unchanged)."""
    return [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays]


def narrow_into(given: Sequence[np.ndarray], widened: Sequence[np.ndarray]) -> None:
    """Write each widened copy back into the float16 array it was made from (in place)."""
    for original, wide in zip(given, widened, strict=True):
        if wide is not original:
            original[...] = wide.astype(original.dtype)
