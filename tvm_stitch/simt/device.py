"""Finalised device kernels rewritten for TVM's OpenCL code generator, so that PoCL runs what
the CUDA code would.

TVM's OpenCL code generator prints a float constant with seven significant digits, where
CUDA's prints it exactly (in hexadecimal): float32's lowest value, the identity of every
maximum, becomes ``-3.402823e+38f``, above the lowest value itself, so a softmax over a row
that a mask set to that value throughout (a padded query row of Mistral, Qwen2, Phi, GPT-NeoX,
BLOOM or OPT exported from ``transformers``) took the wrong maximum and gave NaN where CUDA's
kernel gives 1/n. :func:`exact_constants` writes every float constant that seven digits do
not give back as its bits, reinterpreted.

Its OpenCL code generator also has no rules for two things the tensor-core schedule of float16
matmuls (dlight's ``MatmulTensorization``, taken for every float16 matmul whose extents all
exceed 64) uses:

- Dynamic shared memory (``shared.dyn``): the generator prints such a buffer as a private
  array and drops its barriers. :func:`dynamic_shared_as_static` gives it the ``shared`` scope
  instead: a ``__local`` array of the size the kernel allocates, which is the size the host
  passes at launch (``KernelLaunch.dynamic_shared_bytes``), and work-group barriers. TVM merges
  a kernel's dynamic shared buffers into one and lets buffers whose lifetimes do not overlap
  share bytes; the merged buffer is kept, so that sharing is what runs.
- Warp matrix fragments (``wmma.matrix_a``, ``wmma.matrix_b``, ``wmma.accumulator``) and the
  warp-wide intrinsics that fill, load, multiply-add and store them (16x16x16 tiles).
  :func:`emulate_wmma` makes each fragment buffer a private array and each intrinsic a call of
  an OpenCL function (:data:`WMMA_DEFINITIONS`). A fragment's layout across the warp's lanes
  is opaque on the GPU; here every lane holds the whole of each A and B tile and the elements
  ``e`` of each accumulator tile with ``e % 32`` its lane (CUDA numbers a block's threads x
  first, and a warp is 32 consecutive ones), so the warp's 32 lanes together compute, load and
  store every element once. A float16 accumulator is rounded to half after each
  multiply-add, as the tensor core rounds its result to the accumulator's type.

The rewrites run after TVM's whole TIR pipeline, because its software pipelining (which
double-buffers fragments) rewrites the fragment indices of exactly these intrinsics.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import IRModule

from ..lowering import LoweredFunc, LoweringError
from . import clusters
from .lockstep import in_lockstep
from .retype import ROUND_HALF

WMMA_PREFIX = "stitch_wmma_"
"""The prefix of the OpenCL functions that emulate warp matrix intrinsics."""

_FRAGMENT_SCOPES = {"wmma.matrix_a": "tile", "wmma.matrix_b": "tile", "wmma.accumulator": "c"}
_FRAGMENT_ATTRS = ("fragment_shape", "fragment_layout")
_STORAGE_SYNC = tvm.ir.Op.get("tirx.tvm_storage_sync")
_FILL = tvm.ir.Op.get("tirx.tvm_fill_fragment")
_LOAD = tvm.ir.Op.get("tirx.tvm_load_matrix_sync")
_MMA = tvm.ir.Op.get("tirx.tvm_mma_sync")
_STORE = tvm.ir.Op.get("tirx.tvm_store_matrix_sync")


def for_opencl(lowered: LoweredFunc, half_accumulators: set[str]) -> LoweredFunc:
    """``lowered`` with its device kernels rewritten by :func:`exact_constants`,
    :func:`dynamic_shared_as_static` and :func:`emulate_wmma` (``half_accumulators``: see
    :func:`emulate_wmma`), their
    warp-synchronous updates of shared memory run in lockstep (``lockstep``), and a cluster
    per work-group (``clusters.as_work_groups``)."""
    device = in_lockstep(emulate_wmma(dynamic_shared_as_static(
        exact_constants(lowered.device)), half_accumulators))
    return clusters.as_work_groups(dataclasses.replace(lowered, device=device, _source=None))


_BITS = {"float32": (np.float32, np.int32, "as_float"),
         "float64": (np.float64, np.int64, "as_double")}


def exact_constants(device: IRModule) -> IRModule:
    """``device`` with every float32 or float64 constant that TVM's OpenCL code generator
    would print inexactly (seven significant digits) written as its bits, reinterpreted
    (``as_float``)."""

    def exact(imm: tirx.FloatImm) -> tvm.ir.PrimExpr:
        dtype = str(imm.ty.dtype)
        if dtype not in _BITS or not np.isfinite(imm.value):
            return imm
        float_type, int_type, as_float = _BITS[dtype]
        value = float_type(imm.value)
        if float_type(float(f"{value:.6e}")) == value:
            return imm
        bits = int(np.array(value).view(int_type))
        # OpenCL's own reinterpretation: TVM prints its ``reinterpret`` as the address of
        # the integer, which C does not take of a constant
        return tirx.call_pure_extern(dtype, as_float, tirx.IntImm(int_type.__name__, bits))

    return tvm_ffi.structural_map(device, [(tirx.FloatImm, exact)])


def half_accumulators(func: tirx.PrimFunc) -> set[str]:
    """Names of the float16 ``wmma.accumulator`` buffers of a scheduled PrimFunc. The SIMT
    runner retypes float16 to float32 before lowering (``retype``); the names, which TVM's
    lowering keeps, say which accumulators were halves."""
    names: set[str] = set()

    def visit(var: tvm.ir.Var) -> None:
        ty = var.ty
        if (isinstance(ty, tirx.BufferType) and ty.storage_scope == "wmma.accumulator"
                and str(ty.dtype) == "float16"):
            names.add(var.name)

    tvm_ffi.structural_walk(func, [(tvm.ir.Var, visit)])
    return names


def _rescoped(module: IRModule, scopes: dict[str, str]) -> IRModule:
    """``module`` with every buffer whose scope ``scopes`` names moved to the scope it maps to
    (one new buffer variable per old one, so definition and uses stay one variable)."""
    new: dict[tvm.ir.Var, tvm.ir.Var] = {}

    def on_var(var: tvm.ir.Var) -> tvm.ir.Var:
        ty = var.ty
        if not (isinstance(ty, tirx.BufferType) and ty.storage_scope in scopes):
            return var
        if var not in new:
            new[var] = tvm.ir.Var(var.name, tirx.BufferType(
                ty.dtype, scopes[ty.storage_scope], ty.shape, ty.strides, ty.elem_offset,
                ty.data_alignment, ty.offset_factor, ty.layout, ty.allocated_addr))
        return new[var]

    return tvm_ffi.structural_map(module, [(tvm.ir.Var, on_var)])


def dynamic_shared_as_static(device: IRModule) -> IRModule:
    """``device`` with its dynamic shared memory made static ``__local`` memory of the
    allocated size; raises LoweringError when that size is not a constant."""

    def check(alloc: tirx.AllocBuffer) -> None:
        buf = alloc.buffer
        if buf.scope() == "shared.dyn" and not all(isinstance(d, tirx.IntImm)
                                                   for d in buf.shape):
            raise LoweringError(f"dynamic shared memory {buf.name} of symbolic size "
                                f"{list(buf.shape)}: OpenCL's local arrays need a constant")

    def on_call(call: tvm.ir.Call) -> tvm.ir.PrimExpr:
        if call.op.same_as(_STORAGE_SYNC) and call.args[0].value == "shared.dyn":
            return tirx.call_intrin(call.ty.dtype, _STORAGE_SYNC, "shared", *call.args[1:])
        return call

    tvm_ffi.structural_walk(device, [(tirx.AllocBuffer, check)])
    synced = tvm_ffi.structural_map(device, [(tvm.ir.Call, on_call)])
    return _rescoped(synced, {"shared.dyn": "shared"})


def _fragment(data: tvm.ir.PrimExpr) -> tvm.ir.Var:
    """The fragment buffer whose data pointer ``data`` is."""
    if not (isinstance(data, tvm.ir.Call) and data.op.name == "tirx.buffer_data"):
        raise LoweringError(f"warp matrix intrinsic on {data}, not a fragment buffer's data")
    return data.args[0]


def _tile_16(call: tvm.ir.Call) -> None:
    shape = [int(a) for a in call.args[1:4]]
    if shape != [16, 16, 16]:
        raise LoweringError(f"warp matrix fragments of shape {shape}: the SIMT runner "
                            "emulates 16x16x16 ones")


def emulate_wmma(device: IRModule, half_accumulators: set[str]) -> IRModule:
    """``device`` with its warp matrix fragments in private arrays and its warp matrix
    intrinsics calling :data:`WMMA_DEFINITIONS`; accumulators named in
    ``half_accumulators`` round to half after each multiply-add."""

    def on_call(call: tvm.ir.Call) -> tvm.ir.PrimExpr:
        a = list(call.args)
        if call.op.same_as(_FILL):
            _tile_16(call)
            return tirx.call_extern("void", WMMA_PREFIX + "fill", a[0], a[4], a[5])
        if call.op.same_as(_LOAD) or call.op.same_as(_STORE):
            _tile_16(call)
            layout = a[7].value.removesuffix("_major")
            if call.op.same_as(_STORE):
                kind = "store"
            else:
                kind = "load_" + _FRAGMENT_SCOPES[_fragment(a[0]).ty.storage_scope]
            return tirx.call_extern("void", f"{WMMA_PREFIX}{kind}_{layout}", a[0], a[4],
                                    a[5], a[6])
        if call.op.same_as(_MMA):
            half = _fragment(a[0]).name in half_accumulators
            return tirx.call_extern("void", WMMA_PREFIX + ("mma_half" if half else "mma"), *a)
        return call

    def on_attr(attr: tirx.AttrStmt) -> tirx.Stmt:
        return attr.body if attr.attr_key in _FRAGMENT_ATTRS else attr

    calls = tvm_ffi.structural_map(device, [(tvm.ir.Call, on_call), (tirx.AttrStmt, on_attr)])
    return _rescoped(calls, dict.fromkeys(_FRAGMENT_SCOPES, "local"))


def _wmma_definitions() -> str:
    # Element e of a tile is (e / 16, e % 16); the layout says where it lies in memory.
    at = {"row": "(e / 16) * stride + e % 16", "col": "(e % 16) * stride + e / 16"}
    own = f"for (int e = {WMMA_PREFIX}lane(); e < 256; e += 32)"
    lines = [f"int {WMMA_PREFIX}lane(void) {{\n"
             "  return (int)(((get_local_id(2) * get_local_size(1) + get_local_id(1))\n"
             "                * get_local_size(0) + get_local_id(0)) % 32);\n}",
             f"void {WMMA_PREFIX}fill(float* frag, int index, float value) {{\n"
             f"  {own} frag[index * 256 + e] = value;\n}}"]
    for space in ("__local", "__global"):
        for layout, where in at.items():
            lines += [
                f"__attribute__((overloadable)) void {WMMA_PREFIX}load_tile_{layout}("
                f"float* frag, int index, const {space} float* src, int stride) {{\n"
                f"  for (int e = 0; e < 256; ++e) frag[index * 256 + e] = src[{where}];\n}}",
                f"__attribute__((overloadable)) void {WMMA_PREFIX}load_c_{layout}("
                f"float* frag, int index, const {space} float* src, int stride) {{\n"
                f"  {own} frag[index * 256 + e] = src[{where}];\n}}",
                f"__attribute__((overloadable)) void {WMMA_PREFIX}store_{layout}("
                f"float* frag, int index, {space} float* dst, int stride) {{\n"
                f"  {own} dst[{where}] = frag[index * 256 + e];\n}}"]
    for name, result in (("mma", "sum"), ("mma_half", f"{ROUND_HALF}(sum)")):
        lines.append(
            f"void {WMMA_PREFIX}{name}(float* d, int di, float* a, int ai, float* b, int bi, "
            f"float* c, int ci) {{\n"
            f"  {own} {{\n"
            f"    float sum = c[ci * 256 + e];\n"
            f"    for (int k = 0; k < 16; ++k)\n"
            f"      sum += a[ai * 256 + (e / 16) * 16 + k] * b[bi * 256 + k * 16 + e % 16];\n"
            f"    d[di * 256 + e] = {result};\n"
            f"  }}\n}}")
    return "\n".join(lines) + "\n"


WMMA_DEFINITIONS = _wmma_definitions()
"""OpenCL C of the :data:`WMMA_PREFIX` functions :func:`emulate_wmma` calls (the float16
version of the multiply-add calls ``retype.ROUND_HALF``)."""
