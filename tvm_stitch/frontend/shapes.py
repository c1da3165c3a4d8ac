"""ONNX nodes whose output shape TVM 0.27's importer loses when it depends on a symbolic
dimension, converted by us so that the shape stays an expression of the model's dim_params.

Models exported with dynamic axes compute index tensors from the input shapes: torch's
exporter writes ``Range(0, Shape(x)[1], 1)`` for the positions of a sequence and for the rows
and columns of an attention mask. TVM's ``Range`` converter computes the length as a tensor
and turns it into a fresh shape variable (``range_len_0``), unrelated to ``seq``; the mask then
broadcasts against scores of shape ``(batch, heads, seq, seq)`` to a tensor of unknown shape,
and the importer fails at the next Reshape. With an integer start and step and a limit that
is a shape value, the length is the expression ``ceil((limit - start) / step)`` itself.

GPT-2 and LLaMA reshape a shape value (``1 + seq``) to one element before concatenating it
into a shape, which TVM's Reshape refuses (it takes tensors): it becomes that one-element
shape.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx.onnx_frontend import get_constant

Converter = Callable[[relax.BlockBuilder, list, dict, list], relax.Expr | None]


def _integer(value: object) -> int | tvm.ir.PrimExpr | None:
    """A scalar Range operand as an int (a constant) or a PrimExpr (a shape value)."""
    if tvm.ir.is_prim_expr(value):
        return value
    if isinstance(value, tvm.ir.GenericConst):
        array = value.value.numpy()
        if array.size == 1 and array.dtype.kind in "iu":
            return int(array.item())
    return None


def _int64(value: int | tvm.ir.PrimExpr) -> int | tvm.ir.PrimExpr:
    if isinstance(value, int) or str(value.ty.dtype) == "int64":
        return value
    return tirx.Cast("int64", value)


def convert_range(bb: relax.BlockBuilder, inputs: list, attrs: dict, params: list
                  ) -> relax.Expr | None:
    """``Range(start, limit, delta)`` as ``arange`` with symbolic bounds when every operand
    is an integer constant or a shape value and ``delta`` a constant; None (TVM's converter)
    otherwise."""
    values = [_integer(get_constant(x, params)) for x in inputs]
    dtype = getattr(inputs[0].ty, "dtype", None)
    if any(v is None for v in values) or dtype is None or str(dtype) not in ("int32", "int64"):
        return None
    start, limit, delta = values
    if not isinstance(delta, int) or delta == 0 or all(isinstance(v, int) for v in values):
        return None
    return bb.normalize(relax.op.arange(_int64(start), _int64(limit), delta, str(dtype)))


def convert_reshape(bb: relax.BlockBuilder, inputs: list, attrs: dict, params: list
                    ) -> relax.Expr | None:
    """``Reshape`` of a shape value (``seq + 1``, from Squeeze of a Shape) to one element as
    that one-element shape, or to a scalar as the value itself; None (TVM's converter, which
    takes tensors only) for anything else."""
    data = inputs[0]
    shape = get_constant(inputs[1], params)
    if not tvm.ir.is_prim_expr(data) or not isinstance(shape, tvm.ir.GenericConst):
        return None
    dims = [int(d) for d in shape.value.numpy().reshape(-1)]
    if not dims:
        return data
    if len(dims) == 1 and dims[0] in (1, -1):
        return relax.ShapeExpr([_int64(data)])
    return None


CONVERTERS: dict[str, Converter] = {"Range": convert_range, "Reshape": convert_reshape}
"""Our converters by ONNX op type, tried before TVM's."""
