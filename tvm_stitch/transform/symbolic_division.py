"""Divisions and remainders by symbolic extents that the block domains settle.

TVM's analyzer simplifies ``(i * 4 + j) // 4`` to ``i`` when ``j < 4``, but not
``(i * seq + j) // seq`` when ``j < seq``: its division rules need constant divisors. A
reshape between ``(batch * seq, hidden)`` and ``(batch, seq, hidden)`` in a model exported
with dynamic axes indexes its input through exactly such forms, so every reader looked like
it read other rows (the final LayerNorm of a dynamic GPT-2 fell back). Here a numerator is
taken apart by a symbolic factor of the divisor, ``x = q * f + r``, and when the domains put
``r`` in ``[0, f)`` the division is ``q`` and the remainder ``r``; a remainder whose numerator
the domains put below the divisor is the numerator.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer


def _terms(expr: tvm.ir.PrimExpr) -> list[tvm.ir.PrimExpr]:
    """``expr`` as a sum of terms (differences as negated terms)."""
    if isinstance(expr, tirx.Add):
        return _terms(expr.a) + _terms(expr.b)
    if isinstance(expr, tirx.Sub):
        return _terms(expr.a) + [-t for t in _terms(expr.b)]
    return [expr]


def _factors(expr: tvm.ir.PrimExpr) -> list[tvm.ir.PrimExpr]:
    """``expr`` as a product of factors."""
    if isinstance(expr, tirx.Mul):
        return _factors(expr.a) + _factors(expr.b)
    return [expr]


def _product(factors: list[tvm.ir.PrimExpr], dtype: str) -> tvm.ir.PrimExpr:
    out: tvm.ir.PrimExpr = tirx.IntImm(dtype, 1)
    for f in factors:
        out = out * f
    return out


def _sum(terms: list[tvm.ir.PrimExpr], dtype: str) -> tvm.ir.PrimExpr:
    out: tvm.ir.PrimExpr = tirx.IntImm(dtype, 0)
    for t in terms:
        out = out + t
    return out


def _without(factors: list[tvm.ir.PrimExpr], factor: tvm.ir.PrimExpr
             ) -> list[tvm.ir.PrimExpr] | None:
    for i, f in enumerate(factors):
        if tvm_ffi.structural_equal(f, factor):
            return factors[:i] + factors[i + 1:]
    return None


def _positive(divisor: tvm.ir.PrimExpr) -> bool:
    """Whether ``divisor`` is positive wherever an index divides by it: a product of positive
    constants and variables, which in an index are shape values and iterators (never
    negative), and never zero where a division by them is evaluated."""
    return all(isinstance(f, tvm.ir.Var) or (isinstance(f, tirx.IntImm) and int(f) > 0)
               for f in _factors(divisor))


class SymbolicDivision:
    """Settles ``//`` and ``%`` by symbolic divisors with ``analyzer``, which knows the
    domains of the iterators involved."""

    def __init__(self, analyzer: Analyzer) -> None:
        self.ana = analyzer

    def split(self, expr: tvm.ir.PrimExpr, factor: tvm.ir.PrimExpr
              ) -> tuple[tvm.ir.PrimExpr, tvm.ir.PrimExpr] | None:
        """``(q, r)`` with ``expr == q * factor + r`` and ``0 <= r < factor``, if the
        domains prove it."""
        dtype = str(expr.ty.dtype)
        quotient, rest = [], []
        for term in _terms(expr):
            left = _without(_factors(term), factor)
            if left is None:
                rest.append(term)
            else:
                quotient.append(_product(left, dtype))
        r = self.ana.simplify(_sum(rest, dtype))
        if not quotient or not self._within(r, factor):
            return None
        return self.ana.simplify(_sum(quotient, dtype)), r

    def _within(self, expr: tvm.ir.PrimExpr, bound: tvm.ir.PrimExpr) -> bool:
        return self.ana.can_prove(expr >= 0) and self.ana.can_prove(expr < bound)

    def below(self, expr: tvm.ir.PrimExpr, divisor: tvm.ir.PrimExpr) -> bool:
        """Whether the domains put ``expr`` in ``[0, divisor)``."""
        if self._within(expr, divisor):
            return True
        if isinstance(expr, tirx.FloorDiv) and _positive(expr.b):
            # a // d < c when a < c * d; the analyzer compares products in its domains'
            # order only, so both orders are tried.
            return self.ana.can_prove(expr.a >= 0) and (
                self.below(expr.a, divisor * expr.b) or self.below(expr.a, expr.b * divisor))
        factors = _factors(divisor)
        if len(factors) < 2:
            return False
        for i, f in enumerate(factors):
            if isinstance(f, tirx.IntImm):
                continue
            parts = self.split(expr, f)
            if parts is not None and self.below(
                    parts[0], _product(factors[:i] + factors[i + 1:], str(expr.ty.dtype))):
                return True
        return False

    def settle(self, expr: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
        """``expr`` with every ``//`` and ``%`` by a symbolic divisor that the domains settle
        replaced by its value, then simplified."""

        def on_div(node: tirx.FloorDiv) -> tvm.ir.PrimExpr:
            settled = divided(node.a, node.b)
            return node if settled is None else settled

        def divided(a: tvm.ir.PrimExpr, b: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr | None:
            """``a // b`` without a division by a symbolic factor, or None."""
            dtype = str(a.ty.dtype)
            if isinstance(b, tirx.IntImm):
                return self.ana.simplify(tirx.floordiv(a, b))
            if self.below(a, b):
                return tirx.IntImm(dtype, 0)
            factors = _factors(b)
            for i, f in enumerate(factors):
                rest = factors[:i] + factors[i + 1:]
                if isinstance(f, tirx.IntImm):  # a // (k * c) == (a // k) // c
                    inner = self.ana.simplify(tirx.floordiv(a, f))
                    if isinstance(inner, tirx.FloorDiv):
                        continue
                    return divided(inner, _product(rest, dtype))
                parts = self.split(a, f)
                if parts is not None:
                    return parts[0] if not rest else divided(parts[0], _product(rest, dtype))
            return None

        def on_mod(node: tirx.FloorMod) -> tvm.ir.PrimExpr:
            if isinstance(node.b, tirx.IntImm):
                return node
            if self.below(node.a, node.b):
                return node.a
            parts = self.split(node.a, node.b)
            return parts[1] if parts is not None else node

        settled = tvm_ffi.structural_map(
            self.ana.simplify(expr), [(tirx.FloorDiv, on_div), (tirx.FloorMod, on_mod)])
        return self.ana.simplify(self._recombined(self.ana.simplify(settled)))

    def _recombined(self, expr: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
        """``expr`` with each pair of terms ``x % (a * c) // c + x // (a * c) * a`` (an index
        taken apart by a symbolic extent and put together again: a flat kernel's reader of a
        ``(batch, seq, d)`` output of a ``(batch * seq, d)`` value) replaced by ``x // c``."""
        terms = _terms(expr)
        if len(terms) < 2:
            return expr
        for i, low in enumerate(terms):
            if not (isinstance(low, tirx.FloorDiv) and isinstance(low.a, tirx.FloorMod)
                    and _positive(low.a.b) and _positive(low.b)):
                continue
            x, whole, c = low.a.a, low.a.b, low.b
            for j, high in enumerate(terms):
                factors = _factors(high)
                quotient = next((f for f in factors if isinstance(f, tirx.FloorDiv)
                                 and tvm_ffi.structural_equal(f.a, x)
                                 and tvm_ffi.structural_equal(f.b, whole)), None)
                if j == i or quotient is None:
                    continue
                rest = [f for f in factors if f is not quotient]
                if self.ana.can_prove_equal(_product(rest, str(expr.ty.dtype)) * c, whole):
                    kept = [t for k, t in enumerate(terms) if k not in (i, j)]
                    return self._recombined(_sum([tirx.floordiv(x, c), *kept],
                                                 str(expr.ty.dtype)))
        return expr
