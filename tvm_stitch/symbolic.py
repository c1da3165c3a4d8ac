"""Symbolic dimensions (a batch or sequence length known only at run time) as plain numbers.

Grouping and planning count rows and elements with Python integers. A symbolic dimension
gets a *stand-in*: a number far larger than any real tensor dimension, fixed by the
variable's name, so the same dimension has the same stand-in in every op of a function
(LegalizeOps and FuseTIR keep the names of Relax's shape variables). Products of dimensions
(row counts, sizes) then compare and divide like the real ones would for any value, and any
count at or above ``SYMBOLIC`` is known to depend on a symbolic dimension. Code that builds
TIR uses the real expressions; the stand-ins only decide.
"""

from __future__ import annotations

import zlib
from math import prod

import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer

SYMBOLIC = 1 << 40
"""Every stand-in, and so every count that involves a symbolic dimension, is at least this."""


YARDSTICK_SIZE = 256
"""The size every symbolic dimension is counted at when a stitched kernel is weighed against
TVM's kernels for the same ops (``transform.yardstick``): a real length, unlike a stand-in,
so that both sides' TIR counts; bytes of these kernels scale alike with it."""


def shape_vars(exprs) -> list[tvm.ir.Var]:
    """The shape variables in the expressions ``exprs``, each occurrence."""
    found: list[tvm.ir.Var] = []
    for e in exprs:
        tvm_ffi.structural_walk(e, [(tvm.ir.Var, found.append)])
    return found


def substitute(expr: tvm.ir.PrimExpr, vmap: dict) -> tvm.ir.PrimExpr:
    """``expr`` with each variable that is a key of ``vmap`` replaced by its value."""
    def on_var(var: tvm.ir.Var) -> tvm.ir.PrimExpr:
        return next((new for old, new in vmap.items() if var.same_as(old)), var)

    return tvm_ffi.structural_map(expr, [(tvm.ir.Var, on_var)])


def shape_var_names(exprs) -> set[str]:
    """Names of the shape variables in the expressions ``exprs``."""
    return {str(v.name) for v in shape_vars(exprs)}


def stand_in(name: str) -> int:
    """The stand-in of the symbolic dimension ``name``: odd, so that it shares no factor of
    two with the static dimensions it is multiplied with."""
    return SYMBOLIC + 2 * zlib.crc32(name.encode()) + 1


def dim_value(expr: tvm.ir.PrimExpr) -> int | None:
    """The value of a dimension: its constant; for a product of shape variables and
    constants its stand-in; for any other integer expression of shape variables (a sum,
    ``past + 1``) the stand-in of its simplified text, a symbol of its own (two spellings of
    one length would count as two lengths: refused where they must agree, never merged)."""
    if isinstance(expr, tirx.IntImm):
        return int(expr)
    if isinstance(expr, tvm.ir.Var):
        return stand_in(expr.name)
    if isinstance(expr, tirx.Mul):
        a, b = dim_value(expr.a), dim_value(expr.b)
        return None if a is None or b is None else a * b
    if tvm.ir.is_prim_expr(expr) and str(expr.ty.dtype).startswith("int"):
        simplified = Analyzer().simplify(expr)
        if isinstance(simplified, tirx.IntImm | tvm.ir.Var | tirx.Mul):
            return dim_value(simplified)
        return stand_in(str(simplified))
    return None


def shape_values(shape) -> tuple[int, ...] | None:
    """``dim_value`` of every dimension of ``shape``, or None if one has no value."""
    dims = tuple(dim_value(d) for d in shape)
    return None if any(d is None for d in dims) else dims


def is_symbolic(count: int) -> bool:
    """Whether a count (rows, elements) involves a symbolic dimension."""
    return count >= SYMBOLIC


def symbolic_extent(extents: list[tvm.ir.PrimExpr]) -> str:
    """The product of ``extents`` (real TIR extents) as a readable expression, for plans."""
    total = prod(extents[1:], start=extents[0]) if extents else tirx.IntImm("int64", 1)
    return str(Analyzer().simplify(total))


BOUNDS_ATTR = "stitch.dim_max"
"""Function attribute: the declared upper bound of shape variables, by name (``--dim-max``,
``compile_onnx(dim_max=...)``). A hint: a stitched kernel sizes its on-chip staging for it
and checks it at run time, running beyond it with re-reads; unlike TVM's own
``tir_var_upper_bound`` it lets nothing be planned that a larger size would break."""

UPPER_BOUND_ATTR = "tir_var_upper_bound"
"""TVM's function attribute for the upper bounds of shape variables, which Relax's memory
planning relies on (TVM's PyTorch importer sets it from ``dynamic_shapes``); read as a bound
too."""


def declared_bounds(attrs) -> dict[str, int]:
    """The upper bounds of shape variables that function attributes ``attrs`` declare (ours
    and TVM's; the smaller where both name a variable)."""
    bounds: dict[str, int] = {}
    for key in (BOUNDS_ATTR, UPPER_BOUND_ATTR):
        if attrs is None or key not in attrs:
            continue
        for name, value in attrs[key].items():
            bounds[str(name)] = min(int(value), bounds.get(str(name), int(value)))
    return bounds


def with_bounds(func: tirx.PrimFunc, bounds: dict[str, int]) -> tirx.PrimFunc:
    """``func`` declaring (``BOUNDS_ATTR``) the ``bounds`` of the shape variables its
    parameters' shapes use; ``func`` itself when it uses none of them."""
    names = shape_var_names(d for p in func.params if isinstance(p.ty, tirx.BufferType)
                            for d in p.shape)
    mine = {name: bound for name, bound in sorted(bounds.items()) if name in names}
    return func.with_attr(BOUNDS_ATTR, mine) if mine else func


_MONOTONE = (tirx.Add, tirx.Mul, tirx.FloorDiv, tirx.Min, tirx.Max)


def upper_bound(expr: tvm.ir.PrimExpr, bounds: dict[str, int]) -> int | None:
    """The largest value of the extent ``expr`` when every shape variable in it is at most its
    bound in ``bounds``: None when a variable has no bound, or ``expr`` is not built from
    sums, products, floor divisions by constants, minima and maxima of those variables and
    non-negative constants (the only forms where the value at the bounds is the largest)."""
    def monotone(e) -> bool:
        if isinstance(e, tirx.IntImm):
            return int(e) >= 0
        if isinstance(e, tvm.ir.Var):
            return str(e.name) in bounds
        if isinstance(e, tirx.FloorDiv):
            return monotone(e.a) and isinstance(e.b, tirx.IntImm) and int(e.b) > 0
        if isinstance(e, _MONOTONE):
            return monotone(e.a) and monotone(e.b)
        if isinstance(e, tirx.Cast):
            return monotone(e.value)
        return False

    if not monotone(expr):
        return None
    ana = Analyzer()
    for var in set(shape_vars([expr])):
        ana.bind(var, tirx.IntImm(var.ty.dtype, bounds[str(var.name)]))
    value = ana.simplify(expr)
    return int(value) if isinstance(value, tirx.IntImm) else None


def yardstick_sizes(func: tirx.PrimFunc) -> dict[str, int]:
    """``YARDSTICK_SIZE`` for every shape variable of ``func``'s parameters."""
    names = shape_var_names(d for p in func.params if isinstance(p.ty, tirx.BufferType)
                            for d in p.shape)
    names |= {p.name for p in func.params if not isinstance(p.ty, tirx.BufferType)}
    return dict.fromkeys(sorted(names), YARDSTICK_SIZE)
