"""Questions and substitutions on TIR expressions that analysis and rewrites share."""

from __future__ import annotations

import tvm
import tvm_ffi


def uses(expr: tvm.ir.Expr, var: tvm.ir.Var) -> bool:
    """Whether ``expr`` refers to ``var``."""
    seen: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.Var, seen.append)])
    return any(v.same_as(var) for v in seen)


def substituted(expr: tvm.ir.PrimExpr, var: tvm.ir.Var, value: tvm.ir.PrimExpr
                ) -> tvm.ir.PrimExpr:
    """``expr`` with ``value`` in place of ``var``."""
    return tvm_ffi.structural_map(expr, [(tvm.ir.Var, lambda v: value if v.same_as(var)
                                          else v)])


__all__ = ["substituted", "uses"]
