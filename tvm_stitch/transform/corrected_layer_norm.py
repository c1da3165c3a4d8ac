"""The stitch flow's legalization of ``relax.nn.layer_norm``: topi's LayerNorm with the
corrected two-pass mean and variance.

topi's ``layer_norm`` sums a row in float32, divides by its length, and sums the squares of
``x - mean``. Over a row of one repeated value ``c`` (a LayerNorm over an axis that an Expand
made) that float32 mean is not ``c`` but a few ulps away, so ``x - mean`` is not 0, the
variance about 1e-14, and the difference is divided by ``sqrt(epsilon)``: 1e-4 where
onnxruntime, which accumulates in double, gives exactly 0. The corrected two-pass algorithm
(Chan, Golub and LeVeque) sums the deviations from that rough mean beside their squares and
corrects both: mean = rough + sum(d) / n, variance = sum(d^2) / n - (sum(d) / n)^2. For a
constant row every deviation is the same small value, so the sums are exact and the
corrected mean is ``c`` and the variance 0; elsewhere it is the more accurate of the two. The
deviations' sum is one more reduction in the pass that already sums their squares (no
further read of the row, no further grid barrier). The float16 casts are topi's.

That holds where the row stays on chip. A kernel of TVM's schedules each reduction as a loop
of its own over the row: the corrected LayerNorm there reads its row four times, topi's
three. So a LayerNorm that falls back to TVM's fusion is topi's, TVM's own kernel
(:func:`plain_layer_norms`), and the yardstick, which measures what TVM's fusion would move,
measures topi's too: a stitched kernel that re-reads the row for each reduction (a row too
long for the chip) then loses to TVM's kernel as it should.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce

from tvm import relax, te, tirx, topi
from tvm.ir import Call, IRModule
from tvm.relax import BlockBuilder

PLAIN_ATTR = "stitch.plain_layer_norm"
"""The attribute of a corrected LayerNorm's PrimFunc that holds topi's arguments (the axes
and epsilon), from which :func:`plain_layer_norms` builds topi's kernel."""


def corrected_layer_norm(data: te.Tensor, gamma: te.Tensor, beta: te.Tensor,
                         axes: Sequence[int], epsilon: float) -> te.Tensor:
    """topi's float32 or float16 ``layer_norm`` of ``data`` over ``axes``, with the mean and
    variance corrected by the sum of the deviations from the rough mean."""
    ndim = len(data.shape)
    reduced = sorted(int(a) % ndim for a in axes)
    kept = [i for i in range(ndim) if i not in reduced]
    kept_shape = [data.shape[i] for i in kept]
    count = tirx.Cast("float32", reduce(lambda a, b: a * b, [data.shape[a] for a in reduced]))

    def wide(value: tirx.PrimExpr) -> tirx.PrimExpr:
        return value if data.dtype == "float32" else value.astype("float32")

    def element(row: Sequence[tirx.PrimExpr], within: Sequence[tirx.PrimExpr]) -> tirx.PrimExpr:
        index: list[tirx.PrimExpr] = [0] * ndim
        for axis, value in zip(kept, row, strict=True):
            index[axis] = value
        for axis, value in zip(reduced, within, strict=True):
            index[axis] = value
        return wide(data[tuple(index)])

    def row_sum(name: str, term: Callable[[tirx.PrimExpr, Sequence[tirx.PrimExpr]],
                                          tirx.PrimExpr]) -> te.Tensor:
        over = [te.reduce_axis((0, data.shape[a]), f"k{a}") for a in reduced]
        return te.compute(kept_shape, lambda *row: te.sum(term(element(row, over), row),
                                                          axis=over), name=name)

    total = row_sum("x_sum", lambda value, row: value)
    rough = te.compute(kept_shape, lambda *row: total[row] / count, name="x_mean")
    deviation = row_sum("x_dev_sum", lambda value, row: value - rough[tuple(row)])
    squares = row_sum("x_var_sum", lambda value, row: (value - rough[tuple(row)])
                      * (value - rough[tuple(row)]))

    # the corrections are computed where the normalised values are, not as blocks of their
    # own: a row split over several blocks combines both sums where they are read, after the
    # same grid barrier (a corrected-mean block would take a phase and a barrier more)
    def normalised(*index: tirx.PrimExpr) -> tirx.PrimExpr:
        row = tuple(index[a] for a in kept)
        within = tuple(index[a] for a in reduced)
        shift = deviation[row] / count
        # >= 0 in exact arithmetic; rounding must not take rsqrt below sqrt(epsilon)
        variance = tirx.max(squares[row] / count - shift * shift, tirx.const(0, "float32"))
        value = (wide(data[index]) - (rough[row] + shift)) * tirx.rsqrt(
            variance + tirx.const(epsilon, "float32"))
        if data.dtype != "float32":
            value = value.astype(data.dtype)
        return value * gamma[within] + beta[within]

    return te.compute(data.shape, normalised, name="T_layer_norm")


def _legalize_layer_norm(bb: BlockBuilder, call: Call) -> relax.Expr:
    if call.args[0].ty.dtype not in ("float32", "float16"):
        return bb.call_te(topi.nn.layer_norm, *call.args[:3], axis=call.attrs.axes,
                          epsilon=call.attrs.epsilon)
    axes, epsilon = [int(a) for a in call.attrs.axes], float(call.attrs.epsilon)
    return bb.call_te(corrected_layer_norm, *call.args[:3], axes=axes, epsilon=epsilon,
                      primfunc_name_hint="layer_norm",
                      primfunc_attrs={PLAIN_ATTR: {"axes": axes, "epsilon": epsilon}})


def plain_layer_norms(mod: IRModule) -> IRModule:
    """``mod`` with every corrected LayerNorm PrimFunc replaced by topi's, with the same
    parameters and attributes: TVM's legalization of the same op."""
    functions = {gv: _plain(func) if isinstance(func, tirx.PrimFunc) and func.attrs is not None
                 and PLAIN_ATTR in func.attrs else func for gv, func in mod.functions_items()}
    return IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _plain(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """topi's LayerNorm of the shapes and dtypes of corrected ``func``'s parameters."""
    args = func.attrs[PLAIN_ATTR]
    data, gamma, beta = (te.placeholder(p.shape, p.dtype, p.name) for p in func.params[:3])
    out = topi.nn.layer_norm(data, gamma, beta, [int(a) for a in args["axes"]],
                             float(args["epsilon"]))
    attrs = {k: v for k, v in func.attrs.items() if k != PLAIN_ATTR}
    return te.create_prim_func([data, gamma, beta, out]).with_attrs(attrs)


LEGALIZATIONS: dict[str, Callable[[BlockBuilder, Call], relax.Expr]] = {
    "relax.nn.layer_norm": _legalize_layer_norm,
}
"""The stitch flow's ``customize_legalize_map`` for ``relax.transform.LegalizeOps``."""
