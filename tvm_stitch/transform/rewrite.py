"""The loop every Relax rewrite pass of the stitch flow shares: one mutator over each Relax
function of a module."""

from __future__ import annotations

from collections.abc import Callable

from tvm import relax
from tvm.ir import IRModule


def rewrite_functions(mutator: relax.PyExprMutator, mod: IRModule,
                      finish: Callable[[relax.Expr], relax.Expr] | None = None) -> IRModule:
    """``mod`` with every Relax function rewritten by ``mutator`` (built over ``mod``), each
    result passed through ``finish`` when given (e.g. to drop bindings no longer read)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewritten = mutator.visit_expr(func)
            mutator.builder_.update_func(gv, finish(rewritten) if finish else rewritten)
    return mutator.builder_.get()


__all__ = ["rewrite_functions"]
