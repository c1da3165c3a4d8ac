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
    # a flat row index of (batch * seq, d) read as (batch, seq, d): the batch needs no wrap
    (tirx.floormod(tirx.floordiv(ROW, SEQ), BATCH), IB),

    # j + 1 may reach seq: the next row
    (tirx.floordiv(ROW + _c(1), SEQ), None),
    (tirx.floormod(ROW + _c(1), SEQ), None),
    # i may reach seq
    (tirx.floormod(IB, SEQ), None),
    # i // seq may reach batch
    (tirx.floormod(tirx.floordiv(IB * _c(2), SEQ), BATCH), None),
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


def test_a_flat_index_taken_apart_and_put_together_again_is_one_division() -> None:
    """A flat kernel over (batch * seq * 64) elements that writes a (batch, seq, 64) output
    reads a (batch * seq, 64) value at row ``f % (seq * 64) // 64 + f // (seq * 64) * seq``,
    which is ``f // 64``: settled, two readers of the row agree (no register copy over a
    ``min``/``max`` of both forms)."""
    flat = tirx.Var("f", I64)
    ana = Analyzer()
    ana.bind(flat, tvm.ir.Range.from_min_extent(_c(0), BATCH * SEQ * _c(64)))
    whole = SEQ * _c(64)
    expr = tirx.floordiv(tirx.floormod(flat, whole), _c(64)) + tirx.floordiv(flat, whole) * SEQ
    settled = SymbolicDivision(ana).settle(expr)
    assert tvm_ffi.structural_equal(settled, tirx.floordiv(flat, _c(64))), settled
    for seq, f in itertools.product((1, 3, 7), range(0, 3 * 7 * 64, 37)):
        values = {SEQ: seq, flat: f}
        assert _value(settled, values) == _value(expr, values), (seq, f)
    # not a whole multiple: left as it is
    odd = tirx.floordiv(tirx.floormod(flat, whole), _c(64)) + tirx.floordiv(flat, whole)
    assert not tvm_ffi.structural_equal(SymbolicDivision(ana).settle(odd),
                                        tirx.floordiv(flat, _c(64)))
