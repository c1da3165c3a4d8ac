"""Divisions and remainders by symbolic extents, settled by the domains of the iterators
(``transform.symbolic_division``): what a reshape between ``(batch * seq, d)`` and
``(batch, seq, d)`` of a model with dynamic axes indexes with."""

from __future__ import annotations

import itertools

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer

from tvm_stitch.transform.symbolic_division import SymbolicDivision

I64 = "int64"
BATCH, SEQ = tirx.Var("batch", I64), tirx.Var("seq", I64)
IB, IS, IK = tirx.Var("i", I64), tirx.Var("j", I64), tirx.Var("k", I64)


def _c(value: int) -> tirx.IntImm:
    return tirx.IntImm(I64, value)


def _division() -> SymbolicDivision:
    ana = Analyzer()
    for var, extent in ((IB, BATCH), (IS, SEQ), (IK, _c(64))):
        ana.bind(var, tvm.ir.Range.from_min_extent(_c(0), extent))
    return SymbolicDivision(ana)


ROW = IB * SEQ + IS
CASES = [
    # (expression, what the domains settle it to; None: left as it is)
    (tirx.floormod(tirx.floordiv(tirx.floordiv(IK, _c(64)) + ROW, SEQ), BATCH), IB),
    (tirx.floormod(tirx.floordiv(IK, _c(64)) + ROW, SEQ), IS),
    (tirx.floormod(ROW, BATCH * SEQ), ROW),
    (tirx.floordiv(ROW, BATCH * SEQ), _c(0)),
    (tirx.floordiv(ROW * _c(64) + IK, SEQ * _c(64)), IB),
    (tirx.floordiv(IS, SEQ + _c(1)), _c(0)),
    # j + 1 may reach seq: the next row
    (tirx.floordiv(ROW + _c(1), SEQ), None),
    (tirx.floormod(ROW + _c(1), SEQ), None),
    # i may reach seq
    (tirx.floormod(IB, SEQ), None),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_settles_only_what_the_domains_prove(case: int) -> None:
    expr, expected = CASES[case]
    settled = _division().settle(expr)
    if expected is None:
        assert any(isinstance(settled, t) for t in (tirx.FloorDiv, tirx.FloorMod)), settled
    else:
        assert tvm_ffi.structural_equal(settled, expected) or \
            Analyzer().can_prove_equal(settled, expected), settled


@pytest.mark.parametrize("case", range(len(CASES)))
def test_settled_values_equal_the_originals_at_every_point(case: int) -> None:
    expr, _ = CASES[case]
    settled = _division().settle(expr)
    for batch, seq in ((1, 1), (2, 3), (3, 5)):
        for i, j, k in itertools.product(range(batch), range(seq), (0, 31, 63)):
            values = {BATCH: batch, SEQ: seq, IB: i, IS: j, IK: k}
            assert _value(settled, values) == _value(expr, values), (batch, seq, i, j, k)


def _value(expr: tvm.ir.PrimExpr, values: dict) -> int:
    by_name = {str(v.name): _c(n) for v, n in values.items()}
    bound = tvm_ffi.structural_map(expr, [(tvm.ir.Var, lambda v: by_name.get(str(v.name), v))])
    out = Analyzer().simplify(bound)
    assert isinstance(out, tirx.IntImm), out
    return int(out.value)
