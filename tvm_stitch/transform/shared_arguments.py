"""SharedArguments: a kernel called with one tensor as several of its inputs reads it
through one parameter.

An element-wise op of a tensor with itself (``x * x``; ``x + x`` of ``x + Cast(x)`` once
``IdentityViews`` removed a same-type cast) is legalized into a PrimFunc of two input
buffers, each loaded: its kernel reads the tensor twice, where TVM's fusion of the cast
into the add reads it once (fuzz graph 12038:187: 391,680 B against 261,120 B). Each
``call_tir`` whose inputs repeat a tensor calls its callee specialized
(``PrimFunc.specialize``) with each repeated parameter bound to the first, the repeats
dropped from the call. Callers that repeat their inputs alike share one such function, a
copy when the callee is also called otherwise.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .rewrite import rewrite_functions

_CALL_TIR = "relax.call_tir"

# the positions of a call's inputs that repeat an earlier one -> that one's position
Repeats = tuple[tuple[int, int], ...]


def repeats(call: relax.Call) -> Repeats:
    """The inputs of ``call`` (a ``call_tir``) that repeat an earlier input, each with the
    position of its first: the same variable or constant passed twice."""
    inputs = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else []
    found = []
    for j, arg in enumerate(inputs):
        first = next((i for i in range(j) if inputs[i].same_as(arg)), None)
        if first is not None:
            found.append((j, first))
    return tuple(found)


def _is_call_tir(expr: relax.Expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
        and expr.op.name == _CALL_TIR


def _call_sites(mod: IRModule) -> dict[tvm.ir.GlobalVar, set[Repeats]]:
    """Each PrimFunc called by ``call_tir`` -> the repeats of its calls."""
    sites: dict[tvm.ir.GlobalVar, set[Repeats]] = {}

    def visit(expr: relax.Expr) -> None:
        if _is_call_tir(expr):
            sites.setdefault(expr.args[0], set()).add(repeats(expr))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sites


def _specialized(func: tirx.PrimFunc, found: Repeats) -> tirx.PrimFunc:
    """``func`` with each repeated input parameter bound to its first."""
    params = func.params
    return func.specialize({params[j]: params[i] for j, i in found})


@relax.expr_functor.mutator
class _SharedArguments(relax.PyExprMutator):
    """Calls each ``call_tir`` with repeated inputs makes through a specialized callee."""

    def __init__(self, mod: IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.sites = _call_sites(mod)
        self.made: dict[tuple[tvm.ir.GlobalVar, Repeats], tvm.ir.GlobalVar] = {}

    def callee(self, gv: tvm.ir.GlobalVar, found: Repeats) -> tvm.ir.GlobalVar:
        """The function a call of ``gv`` with ``found`` repeats calls: ``gv`` itself,
        specialized in place when every call of it repeats alike, else a specialized copy."""
        if (gv, found) not in self.made:
            func = _specialized(self.mod[gv], found)
            if self.sites[gv] == {found}:
                self.builder_.update_func(gv, func)
                self.made[(gv, found)] = gv
            else:
                self.made[(gv, found)] = self.builder_.add_func(func, gv.name_hint)
        return self.made[(gv, found)]

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """A ``call_tir`` without its repeated inputs; other calls as they are."""
        call = super().visit_call_(call)
        if not _is_call_tir(call) or not isinstance(self.mod[call.args[0]], tirx.PrimFunc):
            return call
        found = repeats(call)
        if not found:
            return call
        dropped = {j for j, _ in found}
        inputs = [a for k, a in enumerate(call.args[1].fields) if k not in dropped]
        args = [self.callee(call.args[0], found), relax.Tuple(inputs), *call.args[2:]]
        return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)


@tvm.transform.module_pass(opt_level=0, name="SharedArguments")
class SharedArguments:
    """Specialize every PrimFunc a ``call_tir`` passes one tensor as several inputs, so that
    its kernel reads the tensor through one parameter."""

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        if not any(any(found) for found in _call_sites(mod).values()):
            return mod
        return rewrite_functions(_SharedArguments(mod), mod)


__all__ = ["SharedArguments", "repeats"]
