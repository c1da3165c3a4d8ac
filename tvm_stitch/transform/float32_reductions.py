"""Float32Reductions: a float16 sum, mean, product, variance, standard deviation, softmax or
log-softmax computes in float32 and rounds its result to float16.

TVM's legalization of these Relax ops (topi's ``sum``, ``mean``, ``prod``, ``variance``,
``nn.softmax``, ``nn.log_softmax``) reduces in the input's dtype, so a float16 reduction
accumulates in float16: past 2048 a sum of ones no longer grows (half the step is rounded
away). onnxruntime and PyTorch accumulate float16 reductions in float32, and so does TVM's own
``layer_norm``, ``rms_norm``, ``group_norm`` and ``instance_norm``. The rewrite is the cast in
front, the reduction in float32 and the cast back, which the stitch flow fuses into the one
kernel that reads the float16 input and writes the float16 result. A maximum or minimum is
exact in any precision and stays float16.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import IRModule

from .rewrite import rewrite_functions

WIDENED = tuple(tvm.ir.Op.get(f"relax.{name}")
                for name in ("sum", "mean", "prod", "variance", "std", "nn.softmax",
                             "nn.log_softmax"))
"""Reductions that accumulate in their input's dtype after TVM's legalization."""


def is_float16_reduction(call: relax.Call) -> bool:
    """Whether ``call`` is a reduction of ``WIDENED`` over float16 values."""
    if not (isinstance(call.op, tvm.ir.Op) and any(call.op.same_as(op) for op in WIDENED)):
        return False
    data = call.args[0].ty
    return isinstance(data, relax.TensorType) and data.dtype == "float16"


@relax.expr_functor.mutator
class _Float32Reductions(relax.PyExprMutator):
    """Rewrites a float16 reduction into the same reduction of its input cast to float32,
    cast back to float16."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """The float32 reduction for a float16 one; other calls unchanged."""
        call = super().visit_call_(call)
        if not is_float16_reduction(call):
            return call
        data = relax.op.astype(call.args[0], "float32")
        wide = relax.Call(call.op, [data, *call.args[1:]], call.attrs)
        return relax.op.astype(wide, "float16")


@tvm.transform.module_pass(opt_level=0, name="Float32Reductions")
class Float32Reductions:
    """Make every float16 reduction of ``WIDENED`` in the module's Relax functions accumulate
    in float32."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        return rewrite_functions(_Float32Reductions(mod), mod)


__all__ = ["Float32Reductions", "WIDENED", "is_float16_reduction"]
