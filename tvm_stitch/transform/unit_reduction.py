"""UnitReduction: a reduction whose reduced axes all have extent 1 becomes a reshape, one
that reduces unit axes among others reduces the others only, a softmax (log-softmax) over
an axis of extent 1 is 1 (0) where ``x`` is finite and NaN elsewhere, as ``exp(x - x)``
(``x - x``) is, a layer norm over axes of extent 1 is that 0 or NaN times ``gamma`` plus
``beta`` (over unit and longer ones, a layer norm over the longer ones), and a matmul over
an inner dimension of 1 is a broadcast multiply; a sum, mean, max or min over axes that a
broadcast repeats reduces the broadcast's source there (a sum times the repeats). Not
``x - x`` itself: TVM's simplifier folds it to 0 for floats too, and an infinite input gave
1 where onnxruntime gives NaN.

Summing, averaging, or taking the maximum, minimum or product over axes of one element
returns each element unchanged: the result is the input with those axes dropped (or kept
as ones). ONNX graphs produce such reductions (a ReduceMean over an axis that a Reshape made
1), and TVM mis-schedules them: FuseOps and FuseTIR make a correct kernel of the reduction
and the element-wise ops after it, but dlight's default schedule inlines that epilogue into
the reduction block, whose unit reduction loop is gone, so it is applied to the accumulator
itself, in the init and again in the update (``pow(|acc + x| + 0.5, 2)`` after
``acc = pow(|0| + 0.5, 2)``: wrong numbers). A reshape has no reduction kernel to get wrong,
and stitches with its neighbours as an injective op (or becomes a view). A reduction over a
unit axis and longer ones (ReduceMin over both axes of a (1, 1024) tensor) reduces the longer
ones and reshapes: its unit reduction iterator would sit among the rows of its block, which
the stitch schedule cannot map ("does not iterate over the 1 rows first"). A matmul of
(M, 1) by (1, N) meets the same dlight bug in both flows (fuzz graph 4242:1010, an outer
product then ``pow(|x| + 0.5, 2)``: max error 0.61; 7321:865, float16 operands multiplied in
float32, then ``exp(tanh(x))``: 1.15); as a multiply in its output type it is element-wise.
"""

from __future__ import annotations

from math import prod

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import IRModule

from .rewrite import rewrite_functions

REDUCTIONS = {"relax.sum": relax.op.sum, "relax.mean": relax.op.mean,
              "relax.max": relax.op.max, "relax.min": relax.op.min, "relax.prod": relax.op.prod}
"""The reductions the stitch flow's rewrites handle, by op name: each returns its only
element for an axis of extent 1 and does not depend on the order of the elements."""

UNIT_REDUCIBLE = tuple(tvm.ir.Op.get(name) for name in REDUCTIONS)
"""Reductions that return their only element for an axis of extent 1."""


def reduced_axes(call: relax.Call) -> list[int] | None:
    """The axes ``call`` (a reduction of ``UNIT_REDUCIBLE``) reduces, non-negative; None when
    its input's rank is unknown."""
    ndim = call.args[0].ty.ndim
    if ndim < 0:
        return None
    if call.attrs.axis is None:
        return list(range(ndim))
    return [int(a) % ndim for a in call.attrs.axis]


def is_unit_reduction(call: relax.Call) -> bool:
    """Whether ``call`` is a reduction of ``UNIT_REDUCIBLE`` whose reduced axes all have the
    static extent 1 and whose result shape is known."""
    unit = unit_axes(call)
    return bool(unit) and len(unit) == len(reduced_axes(call))


def unit_axes(call: relax.Call) -> list[int]:
    """The axes of static extent 1 among those ``call`` (a reduction of ``UNIT_REDUCIBLE``
    with known shapes) reduces."""
    if not (isinstance(call.op, tvm.ir.Op) and any(call.op.same_as(op)
                                                   for op in UNIT_REDUCIBLE)):
        return []
    data, out = call.args[0].ty, call.ty
    if not (isinstance(data, relax.TensorType) and isinstance(out, relax.TensorType)) \
            or data.shape is None or out.shape is None:
        return []
    dims = list(data.shape)
    return [a for a in reduced_axes(call) or []
            if isinstance(dims[a], tirx.IntImm) and int(dims[a]) == 1]


_SOFTMAX = tvm.ir.Op.get("relax.nn.softmax")
_LOG_SOFTMAX = tvm.ir.Op.get("relax.nn.log_softmax")


def _is_unit_softmax(call: relax.Call) -> bool:
    """Whether ``call`` is a softmax or log-softmax over an axis of static extent 1: its
    result is 1 (or 0) wherever the input is finite."""
    if not (isinstance(call.op, tvm.ir.Op)
            and (call.op.same_as(_SOFTMAX) or call.op.same_as(_LOG_SOFTMAX))):
        return False
    data = call.args[0].ty
    if not isinstance(data, relax.TensorType) or data.shape is None:
        return False
    extent = list(data.shape)[int(call.attrs.axis) % data.ndim]
    return isinstance(extent, tirx.IntImm) and int(extent) == 1


_LAYER_NORM = tvm.ir.Op.get("relax.nn.layer_norm")


def _layer_norm_axes(call: relax.Call) -> tuple[list[int], list[int]]:
    """The axes of static extent 1 among those the layer norm ``call`` normalises over, and
    the others; both empty for any other call."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_LAYER_NORM)):
        return [], []
    data = call.args[0].ty
    if not isinstance(data, relax.TensorType) or data.shape is None:
        return [], []
    dims = list(data.shape)
    axes = [int(a) % data.ndim for a in call.attrs.axes]
    unit = [a for a in axes if isinstance(dims[a], tirx.IntImm) and int(dims[a]) == 1]
    return unit, [a for a in axes if a not in unit]


_MATMUL = tvm.ir.Op.get("relax.matmul")


def _is_outer_product(call: relax.Call) -> bool:
    """Whether ``call`` is a matmul of two tensors of rank 2 or more over an inner dimension
    of static extent 1: ``a * b`` with broadcasting, both cast to the matmul's output type,
    then gives the same (batch dims broadcast alike)."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_MATMUL)):
        return False
    a, b = (arg.ty for arg in call.args)
    if not all(isinstance(t, relax.TensorType) and t.shape is not None and t.ndim >= 2
               for t in (a, b)):
        return False
    inner = list(a.shape)[-1]
    return isinstance(inner, tirx.IntImm) and int(inner) == 1


@relax.expr_functor.mutator
class _UnitReduction(relax.PyExprMutator):
    """Rewrites a reduction over axes of extent 1 into a reshape of its input (or the input
    itself when the shape stays), and one over unit and longer axes into a reduction over the
    longer ones and a reshape."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """The reshape for a unit reduction; other calls unchanged."""
        call = super().visit_call_(call)
        if _is_outer_product(call):
            # the matmul multiplies in its output type (float32 for float16 operands)
            dtype = call.ty.dtype
            a, b = (arg if arg.ty.dtype == dtype else
                    self.builder_.emit(relax.op.astype(arg, dtype), name_hint="operand")
                    for arg in call.args)
            return relax.op.multiply(a, b)
        if _is_unit_softmax(call):
            # exp(x - x) (x - x): 1 (0) for a finite x, NaN for an infinite or NaN one
            return self._where_finite(call.args[0], 1 if call.op.same_as(_SOFTMAX) else 0)
        unit, rest = _layer_norm_axes(call)
        if unit and rest:  # the same statistics over the longer axes alone
            data, gamma, beta = call.args
            shape = [list(data.ty.shape)[a] for a in rest]
            return relax.op.nn.layer_norm(
                data, self.builder_.emit(relax.op.reshape(gamma, shape), name_hint="gamma"),
                self.builder_.emit(relax.op.reshape(beta, shape), name_hint="beta"), rest,
                call.attrs.epsilon, call.attrs.center, call.attrs.scale)
        if unit:
            # each element is its own mean: the normalised value is 0 (NaN for an infinite or
            # NaN input)
            data, gamma, beta = call.args
            result = self._where_finite(data, 0)
            if call.attrs.scale:
                result = relax.op.multiply(self.builder_.emit(result, name_hint="unit_norm"),
                                           gamma)
            if call.attrs.center:
                result = relax.op.add(self.builder_.emit(result, name_hint="unit_norm"), beta)
            return result
        call, repeats = self._over_source(call)
        reduced = self._without_unit_axes(call)
        if repeats == 1:
            return reduced
        return relax.op.multiply(self.builder_.emit(reduced, name_hint="summed_once"),
                                 relax.const(repeats, call.ty.dtype))

    def _without_unit_axes(self, call: relax.Call) -> relax.Expr:
        """A reshape of ``call``'s input for a reduction over unit axes only, a reduction
        over the longer axes and a reshape for one over unit and longer axes; ``call``
        otherwise."""
        unit = unit_axes(call)
        if not unit:
            return call
        data = call.args[0]
        rest = [a for a in reduced_axes(call) if a not in unit]
        if rest:
            data = self.builder_.emit(REDUCTIONS[call.op.name](data, axis=rest, keepdims=True),
                                      name_hint="reduced")
        if tvm_ffi.structural_equal(data.ty.shape, call.ty.shape):
            return data
        return relax.op.reshape(data, call.ty.shape)

    def _over_source(self, call: relax.Call) -> tuple[relax.Expr, int]:
        """A sum, mean, max or min of ``broadcast_to(x, shape)`` over axes that the
        broadcast made longer as the same reduction of ``x`` broadcast to those axes at
        extent 1 (which ``_without_unit_axes`` then drops), and how many times each of its
        values repeats there (a sum's factor; 1 for the others): each such axis repeats one
        value. A mean down the 2 rows of a row broadcast to them, in one kernel with the
        broadcast, held 32 sums a thread and the loads nvcc hoisted out of the row walk
        beside them: 64 registers, 184 B spilled (fuzz graph 12039:299). ``call`` and 1
        otherwise."""
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in REDUCTIONS \
                or call.op.name == "relax.prod" or not isinstance(call.args[0], relax.Var):
            return call, 1
        bound = self.lookup_binding(call.args[0])
        if not (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)
                and bound.op.name == "relax.broadcast_to"):
            return call, 1
        source, wide = bound.args[0].ty, list(call.args[0].ty.shape or [])
        if not isinstance(source, relax.TensorType) or source.shape is None \
                or not all(isinstance(d, tirx.IntImm) for d in [*source.shape, *wide]):
            return call, 1
        given = [1] * (len(wide) - source.ndim) + [int(d) for d in source.shape]
        repeated = [a for a in reduced_axes(call) or []
                    if given[a] == 1 and int(wide[a]) > 1]
        if not repeated:
            return call, 1
        narrow = [1 if a in repeated else int(d) for a, d in enumerate(wide)]
        data = bound.args[0]
        if given != narrow or source.ndim != len(wide):  # a reshape where only ones differ
            move = relax.op.reshape if given == narrow else relax.op.broadcast_to
            data = self.builder_.emit(move(data, narrow), name_hint="repeated_once")
        reduced = self.builder_.normalize(REDUCTIONS[call.op.name](
            data, axis=call.attrs.axis, keepdims=call.attrs.keepdims))
        return reduced, prod(int(wide[a]) for a in repeated) \
            if call.op.name == "relax.sum" else 1

    def _where_finite(self, data: relax.Expr, value: float) -> relax.Expr:
        """``value`` where ``data`` is finite, NaN elsewhere: what ``x - x`` (or ``x * 0``)
        plus ``value`` gives, written so that TVM's simplifier, which folds ``x - x`` and
        ``x * 0`` to 0 for floats too, keeps the NaNs."""
        dtype = data.ty.dtype
        finite = self.builder_.emit(relax.op.isfinite(data), name_hint="finite")
        return relax.op.where(finite, relax.const(value, dtype), relax.const(float("nan"), dtype))


@tvm.transform.module_pass(opt_level=0, name="UnitReduction")
class UnitReduction:
    """Replace every sum, mean, max, min or prod over axes of extent 1 in the module's Relax
    functions by a reshape."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        return rewrite_functions(_UnitReduction(mod), mod)


__all__ = ["REDUCTIONS", "UNIT_REDUCIBLE", "UnitReduction", "is_unit_reduction", "reduced_axes",
           "unit_axes"]
