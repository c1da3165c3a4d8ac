"""IdentityViews: an op that returns its input unchanged is a view of it.

ONNX graphs carry such ops: a Cast to the type the tensor has, a Transpose by the identity
permutation, an Expand to the shape it has. TVM legalizes each into a copy kernel, which
its ``RewriteDataflowReshape`` later recognises as a view: TVM's flow moves no bytes for
them. Grouped into a stitched kernel, the same copy is a second output written out (fuzz
graph 4242:66: a maximum read through a same-type Cast by a MatMul and through an identity
Transpose as a graph output moved 576 B against TVM's 384 B). So each is removed, its uses
reading its input. Not a reshape to the same shape: TVM legalizes that to an injective
kernel, and FuseOps fuses no injective op into a matmul's epilogue (fuzz graph 9419:19: a
Mul behind an identity Transpose of a MatMul ran as a kernel of its own).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import IRModule

from .rewrite import rewrite_functions

_ASTYPE = "relax.astype"
_PERMUTE = "relax.permute_dims"
_BROADCAST = "relax.broadcast_to"


def is_identity(call: relax.Call) -> bool:
    """Whether ``call`` is a same-type ``astype``, an identity ``permute_dims`` or a
    ``broadcast_to`` to its input's own shape."""
    if not isinstance(call.op, tvm.ir.Op) or not call.args:
        return False
    data = call.args[0].ty
    if not isinstance(data, relax.TensorType) or data.shape is None:
        return False
    name = call.op.name
    if name == _ASTYPE:
        return str(call.attrs.dtype) == str(data.dtype)
    if name == _PERMUTE:
        axes = call.attrs.axes
        ndim = data.ndim
        if axes is None:  # reverses the axes
            return ndim in (0, 1)
        return [int(a) % ndim for a in axes] == list(range(ndim))
    if name == _BROADCAST:
        return tvm_ffi.structural_equal(call.ty.shape, data.shape)
    return False


@relax.expr_functor.mutator
class _IdentityViews(relax.PyExprMutator):
    """Rewrites every identity op into its input; ``removed`` says whether it met one."""

    removed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """The input of an identity op; other calls unchanged."""
        call = super().visit_call_(call)
        if not is_identity(call):
            return call
        self.removed = True
        return call.args[0]  # bound as an alias, which CanonicalizeBindings removes


@tvm.transform.module_pass(opt_level=0, name="IdentityViews")
class IdentityViews:
    """Remove every op of the module's Relax functions that returns its input unchanged, its
    uses reading that input."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        mutator = _IdentityViews(mod)
        rewritten = rewrite_functions(mutator, mod)
        # only then: it also renames the bindings a graph output aliases
        return relax.transform.CanonicalizeBindings()(rewritten) if mutator.removed \
            else rewritten


__all__ = ["IdentityViews", "is_identity"]
