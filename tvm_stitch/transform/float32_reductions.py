"""A float16 sum, mean, product, variance, standard deviation, softmax or log-softmax computes
in float32 and rounds its result to float16, in one kernel as TVM's float16 op is.

TVM's legalization of these Relax ops (topi's ``sum``, ``mean``, ``prod``, ``variance``,
``nn.softmax``, ``nn.log_softmax``) reduces in the input's dtype, so a float16 reduction
accumulates in float16: past 2048 a sum of ones no longer grows (half the step is rounded
away). onnxruntime and PyTorch accumulate float16 reductions in float32, and so does TVM's own
``layer_norm``, ``rms_norm``, ``group_norm`` and ``instance_norm``.

The stitch flow legalizes such an op as TVM does, with its TE computation applied to the
input cast to float32 and its result cast back: one PrimFunc, with the op pattern TVM gives
the float16 op. Casts of their own in front and behind (a Relax rewrite to ``astype``, as
before) made a group that falls back to TVM's fusion run more kernels than TVM's flow:
FuseOps fuses no cast into a softmax (its pattern is out-element-wise fusable) nor a cast
after a sum, so a float16 column softmax left to TVM ran a cast kernel and a softmax kernel,
5.2 MB, where TVM's flow ran one, 2.1 MB. A stitched group reads the same blocks as before:
the cast of the input, the reduction, the cast of its result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, te, topi
from tvm.ir import Call
from tvm.relax import BlockBuilder

WIDENED = ("relax.sum", "relax.mean", "relax.prod", "relax.variance", "relax.std",
           "relax.nn.softmax", "relax.nn.log_softmax")
"""Reductions that accumulate in their input's dtype after TVM's legalization."""

_COMM_REDUCE = 3
"""TVM's op pattern of a plain reduction (``kCommReduce``): FuseOps fuses the injective ops
that make its input into it. TVM gives it to ``sum`` and ``prod``; with the cast of the result
as a block of their own, AnnotateTIROpPattern would take them for out-element-wise fusable,
whose producers FuseOps leaves in kernels of their own."""

_PATTERNS = {"relax.sum": _COMM_REDUCE, "relax.prod": _COMM_REDUCE}


class _Widening:
    """A BlockBuilder for TVM's legalization of one float16 op: its ``call_te`` computes the
    TE function on the first argument cast to float32 and casts the result back; everything
    else is the builder's."""

    def __init__(self, bb: BlockBuilder, name: str) -> None:
        self._bb = bb
        self._name = name

    def call_te(self, func: Callable[..., te.Tensor], data: relax.Expr, *args: Any,
                **kwargs: Any) -> relax.Expr:
        """``bb.call_te`` of ``func`` computed in float32 on float16 ``data`` (a tensor;
        other first arguments, the shape of a sum over an axis of extent 0, pass as they
        are)."""
        if not isinstance(data, relax.Expr):
            return self._bb.call_te(func, data, *args, **kwargs)

        def widened(x: te.Tensor, *rest: Any, **named: Any) -> te.Tensor:
            result = func(topi.cast(x, "float32"), *rest, **named)
            return topi.cast(result, x.dtype)

        kwargs.setdefault("primfunc_name_hint", self._name)
        return self._bb.call_te(widened, data, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bb, name)


def _legalize_widened(bb: BlockBuilder, call: Call) -> relax.Expr:
    """TVM's legalization of ``call``, in float32 for a float16 input (``_Widening``)."""
    name = call.op.name
    tvm_legalization = tvm.ir.Op.get(name).get_attr("FLegalize")
    if call.args[0].ty.dtype != "float16":
        return tvm_legalization(bb, call)
    result = tvm_legalization(_Widening(bb, name.rsplit(".", 1)[-1]), call)
    if name in _PATTERNS and isinstance(result, Call) and len(result.args) > 0 \
            and isinstance(result.args[0], tvm.ir.GlobalVar):
        gv = result.args[0]
        bb.update_func(gv, bb.get()[gv].with_attr("op_pattern", _PATTERNS[name]))
    return result


FLOAT32_LEGALIZATIONS: dict[str, Callable[[BlockBuilder, Call], relax.Expr]] = {
    name: _legalize_widened for name in WIDENED}
"""Legalizations of the ``WIDENED`` ops for ``relax.transform.LegalizeOps``: float16 inputs
reduce in float32."""


__all__ = ["FLOAT32_LEGALIZATIONS", "WIDENED"]
