"""SplitToSlices: each used part of a ``split`` becomes its own ``strided_slice``.

A split is one op with a tuple of results, and the parts are read through tuple projections.
Grouping works on single-result ops connected by their dataflow edges, so a split sat alone
between the op that produces its input and the ops that read its parts: one more kernel
writing every part to DRAM. Slices are single-result injective ops, so each part stitches
with what produces its input and what reads it, as any other injective op does. Parts that
nothing reads are not computed.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .rewrite import rewrite_functions

_SPLIT = tvm.ir.Op.get("relax.split")


@relax.expr_functor.mutator
class _SplitToSlices(relax.PyExprMutator):
    """Rewrites ``split(x)[i]`` into the slice of ``x`` that is part ``i``."""

    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        """The slice of the split's input for a projection of a split with static parts."""
        tuple_value = self.visit_expr(op.tuple_value)
        split = self.lookup_binding(tuple_value) if isinstance(tuple_value, relax.Var) else None
        bounds = _part_bounds(split, op.index) if isinstance(split, relax.Call) else None
        if bounds is None:
            return super().visit_tuple_getitem_(op)
        axis, begin, end = bounds
        return relax.op.strided_slice(split.args[0], axes=[axis], begin=[begin], end=[end])


def _part_bounds(call: relax.Call, index: int) -> tuple[int, int, int] | None:
    """(axis, begin, end) of part ``index`` of ``call`` when it is a split whose parts have
    static extents along a static axis; None otherwise."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(_SPLIT)):
        return None
    ty = call.ty
    if not isinstance(ty, tvm.ir.TupleType):
        return None
    axis = int(call.attrs.axis)
    extents = []
    for field in ty.fields:
        if not isinstance(field, relax.TensorType) or field.ndim < 0:
            return None
        axis %= field.ndim
        shape = field.shape
        if not isinstance(shape, relax.ShapeExpr) or not isinstance(shape.values[axis],
                                                                      tirx.IntImm):
            return None
        extents.append(int(shape.values[axis]))
    begin = sum(extents[:index])
    return axis, begin, begin + extents[index]


@tvm.transform.module_pass(opt_level=0, name="SplitToSlices")
class SplitToSlices:
    """Replace the projections of every ``split`` of the module's Relax functions by slices
    and drop the splits no longer read."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        return rewrite_functions(_SplitToSlices(mod), mod, relax.analysis.remove_all_unused)


__all__ = ["SplitToSlices"]
