"""StackReduction: a reduction over the axis a ``stack`` made is an element-wise fold of the
stacked tensors.

TVM's ONNX importer turns the variadic element-wise ops (Max, Min, Sum, Mean of two or more
inputs) into ``stack`` along a new leading axis and a reduction over that axis. Stitched as
it is, that is a column reduction over as many rows as there are inputs: a Global group,
whose partial sums of a large tensor need more shared memory than a block has (fuzz graph
L:9, Max of two (2048, 4096) tensors, fell back). As element-wise ops (``maximum``,
``minimum``, ``add``, ``add`` then ``divide`` for the mean, ``multiply`` for the product)
the inputs are read once each and the stacked tensor is never made.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import IRModule

from .rewrite import rewrite_functions
from .unit_reduction import reduced_axes

_STACK = tvm.ir.Op.get("relax.stack")
_BROADCAST = tvm.ir.Op.get("relax.broadcast_to")
_FOLD = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum,
         "relax.sum": relax.op.add, "relax.mean": relax.op.add,
         "relax.prod": relax.op.multiply}


@relax.expr_functor.mutator
class _StackReduction(relax.PyExprMutator):
    """Rewrites ``reduce(stack(xs, axis=a), axis=[a])`` into an element-wise fold of ``xs``."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """The fold of the stacked tensors for a reduction over a stack's axis; other calls
        unchanged."""
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in _FOLD):
            return call
        data = call.args[0]
        stack = self.lookup_binding(data) if isinstance(data, relax.Var) else None
        if not (isinstance(stack, relax.Call) and isinstance(stack.op, tvm.ir.Op)
                and stack.op.same_as(_STACK) and isinstance(stack.args[0], relax.Tuple)):
            return call
        ndim = data.ty.ndim
        if ndim < 0 or reduced_axes(call) != [int(stack.attrs.axis) % ndim]:
            return call
        parts = list(stack.args[0].fields)
        if len(parts) > 1:  # the importer broadcast each input: the fold broadcasts itself
            parts = [self._unbroadcast(p) for p in parts]
        fold = _FOLD[call.op.name]
        result = parts[0]
        for part in parts[1:-1]:
            result = self.builder_.emit(fold(result, part), name_hint="folded")
        # the last op is returned, not emitted, so that it stays the binding of the reduction
        # (a variable returned would be bound to it as an alias, which grouping does not see
        # through)
        last = fold(result, parts[-1]) if len(parts) > 1 else relax.op.reshape(result,
                                                                                 result.ty.shape)
        if call.op.name == "relax.mean":
            count = relax.const(len(parts), call.ty.dtype)
            last = relax.op.divide(self.builder_.emit(last, name_hint="folded"), count)
        if call.attrs.keepdims:
            return relax.op.reshape(self.builder_.emit(last, name_hint="folded"), call.ty.shape)
        if not tvm_ffi.structural_equal(self.builder_.normalize(last).ty.shape, call.ty.shape):
            return relax.op.broadcast_to(self.builder_.emit(last, name_hint="folded"),
                                         call.ty.shape)
        return last

    def _unbroadcast(self, part: relax.Expr) -> relax.Expr:
        bound = self.lookup_binding(part) if isinstance(part, relax.Var) else None
        if isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op) \
                and bound.op.same_as(_BROADCAST):
            return bound.args[0]
        return part


@tvm.transform.module_pass(opt_level=0, name="StackReduction")
class StackReduction:
    """Replace every reduction over the axis of a ``stack`` in the module's Relax functions by
    an element-wise fold of the stacked tensors, and drop the stacks no longer read."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        return rewrite_functions(_StackReduction(mod), mod, relax.analysis.remove_all_unused)


__all__ = ["StackReduction"]
