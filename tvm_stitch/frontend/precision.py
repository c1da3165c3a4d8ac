"""Half-precision matrix products that accumulate in float32, as onnxruntime's and PyTorch's.

TVM 0.27 imports an ONNX ``MatMul`` (and ``Gemm``'s product) of float16 or bfloat16 operands
as ``relax.op.matmul`` without an output type: the product's TIR accumulates in the operands'
type. Over a reduction of hundreds or thousands of terms float16 loses most of its digits: a
4-layer GPT-2 in float16 at hidden 768 came out 0.02 from onnxruntime's, LLaMA at hidden 2048
0.06, in TVM's flow and ours alike (H200, 2026-12-04). Here the product accumulates in
float32 and is rounded to the operands' type once.
"""

from __future__ import annotations

from tvm import relax

HALF = ("float16", "bfloat16")


def _half(a: relax.Expr, b: relax.Expr) -> str | None:
    """The half-precision type both operands have, or None."""
    dtype = getattr(a.ty, "dtype", None)
    return dtype if dtype in HALF and getattr(b.ty, "dtype", None) == dtype else None


def convert_matmul(bb: relax.BlockBuilder, inputs: list, attrs: dict, params: list
                   ) -> relax.Expr | None:
    """``MatMul`` of half-precision operands, accumulated in float32; None (TVM's converter)
    for other types."""
    a, b = inputs[0], inputs[1]
    dtype = _half(a, b)
    if dtype is None:
        return None
    return bb.normalize(relax.op.astype(relax.op.matmul(a, b, out_dtype="float32"), dtype))


def convert_gemm(bb: relax.BlockBuilder, inputs: list, attrs: dict, params: list
                 ) -> relax.Expr | None:
    """``Gemm`` (``alpha * A' B' + beta * C``) of half-precision operands: the product
    accumulated in float32, scaled and added in float32, rounded once; None (TVM's converter)
    for other types."""
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    dtype = _half(a, b)
    if dtype is None:
        return None
    if attrs.get("transA", 0):
        a = relax.op.permute_dims(a, [1, 0])
    if attrs.get("transB", 0):
        b = relax.op.permute_dims(b, [1, 0])
    y = relax.op.matmul(a, b, out_dtype="float32")
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = relax.op.multiply(y, relax.const(alpha, "float32"))
    if c is not None:
        c = relax.op.astype(c, "float32")
        if beta != 1.0:
            c = relax.op.multiply(c, relax.const(beta, "float32"))
        y = relax.op.add(y, c)
    return bb.normalize(relax.op.astype(y, dtype))
