"""ExactPower: ``power(x, n)`` with a constant small integer ``n`` becomes multiplications.

TVM builds CUDA with ``--use_fast_math``, under which ``powf(x, y)`` is ``exp2(y * log2(x))``:
NaN for every negative ``x``, even for ``y = 2``. ONNX exports spell RMSNorm's and variance's
square and GELU's cube as ``Pow(x, 2)`` and ``Pow(x, 3)``, so TVM's default flow returns NaN on
a GPU for them (measured on an H200, docs/results/); OpenCL's exact ``pow`` on the SIMT runner
does not show it. ``x * x`` is exact, IEEE-correct for every sign and cheaper.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import IRModule

from .rewrite import rewrite_functions

_POWER = tvm.ir.Op.get("relax.power")
MAX_EXPONENT = 4
"""Largest exponent written as multiplications (two at most: x2 = x*x, x4 = x2*x2)."""


def integer_exponent(expr: relax.Expr) -> int | None:
    """The exponent ``expr`` holds when it is a constant scalar (or one-element tensor) equal
    to an integer from 1 to ``MAX_EXPONENT``; None otherwise."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    if value.size != 1 or value.dtype.kind != "f":
        return None
    n = float(value.reshape(()))
    return int(n) if n.is_integer() and 1 <= n <= MAX_EXPONENT else None


@relax.expr_functor.mutator
class _ExactPower(relax.PyExprMutator):
    """Rewrites ``power(x, n)`` (``n`` a constant small integer) into products of ``x``."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """The product for a power with a small integer exponent; other calls unchanged."""
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_POWER)):
            return call
        n = integer_exponent(call.args[1])
        base = call.args[0]
        if n is None or not _keeps_type(call, base):
            return call
        square = relax.op.multiply(base, base) if n >= 2 else base
        return {1: base, 2: square, 3: relax.op.multiply(square, base),
                4: relax.op.multiply(square, square)}[n]


def _keeps_type(call: relax.Call, base: relax.Expr) -> bool:
    """Whether the product has the power's shape and dtype (the exponent does not broadcast
    the base to a larger shape or another dtype)."""
    out, of_base = call.ty, base.ty
    return (isinstance(out, relax.TensorType) and isinstance(of_base, relax.TensorType)
            and out.dtype == of_base.dtype and out.ndim == of_base.ndim
            and tvm_ffi.structural_equal(out.shape, of_base.shape))


@tvm.transform.module_pass(opt_level=0, name="ExactPower")
class ExactPower:
    """Replace every ``power`` by a small constant integer in the module's Relax functions
    by multiplications."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        return rewrite_functions(_ExactPower(mod), mod)


__all__ = ["ExactPower", "MAX_EXPONENT", "integer_exponent"]
