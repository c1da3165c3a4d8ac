"""Questions and substitutions on TIR expressions that analysis and rewrites share."""

from __future__ import annotations

from collections.abc import Mapping

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


def substituted_all(expr: tvm.ir.PrimExpr, values: Mapping[tvm.ir.Var, tvm.ir.PrimExpr]
                    ) -> tvm.ir.PrimExpr:
    """``expr`` with every variable of ``values`` replaced by its value there."""
    if not values:
        return expr
    return tvm_ffi.structural_map(expr, [(tvm.ir.Var, lambda v: values.get(v, v))])


__all__ = ["substituted", "substituted_all", "uses"]
