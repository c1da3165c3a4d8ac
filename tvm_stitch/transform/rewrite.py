"""The loop every Relax rewrite pass of the stitch flow shares: one mutator over each Relax
function of a module; and the removal of the aliases a rewrite can leave behind."""

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


@relax.expr_functor.mutator
class _WithoutAliases(relax.PyExprMutator):
    """Drops every binding of a dataflow variable to another variable, its uses reading
    that variable instead."""

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        """Nothing for an alias of a dataflow variable (remapped); others as they are."""
        if isinstance(binding.var, relax.DataflowVar) and isinstance(binding.value, relax.Var):
            self.set_var_remap(binding.var, self.visit_expr(binding.value))
            return
        super().visit_var_binding_(binding)


def without_aliases(mod: IRModule) -> IRModule:
    """``mod`` without the bindings of one dataflow variable to another (what a rewrite that
    replaces an op by a value already bound leaves), their uses reading the value itself.
    Grouping sees such a binding as an op outside every group: the value it names would
    leave its group as an output, and its reader would be stitched apart (fuzz graph
    11003:403, a mean over axes of extent 1 and others: three kernels where TVM's flow runs
    two). A graph output's alias (``gv = lv``, as TVM's importer binds some outputs) stays,
    and so do the names of the bindings (CanonicalizeBindings would rename the value a graph
    output aliases after the output, and the report maps ONNX nodes to bindings by name)."""
    aliased = any(isinstance(b.var, relax.DataflowVar) and isinstance(b.value, relax.Var)
                  for func in mod.functions.values() if isinstance(func, relax.Function)
                  and isinstance(func.body, relax.SeqExpr)
                  for block in func.body.blocks for b in block.bindings)
    return rewrite_functions(_WithoutAliases(mod), mod) if aliased else mod


__all__ = ["rewrite_functions", "without_aliases"]
