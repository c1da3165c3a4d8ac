"""Guard counting agrees with brute-force enumeration, and gives up instead of guessing."""

import itertools

import pytest
from tvm import tirx

from tvm_stitch.analysis.guards import MAX_ENUMERATED_POINTS, Axis, count_points

tx = tirx.Var("threadIdx_x", "int32")
bx = tirx.Var("blockIdx_x", "int32")
k = tirx.Var("k", "int32")
n = tirx.Var("n", "int32")
AXES = (Axis(bx, 0, 6), Axis(tx, 0, 64), Axis(k, 2, 9, 3))  # k in 2, 5, 8


def _brute(predicate) -> int:
    return sum(predicate(b, t, kk) for b, t, kk in
               itertools.product(range(6), range(64), range(2, 11, 3)))


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


# Python's == and != on PrimExprs build lazy helpers, not IR nodes: spell EQ and NE out.
CASES = [
    (tx < 37, lambda b, t, kk: t < 37),
    (tirx.EQ(tx, 0), lambda b, t, kk: t == 0),
    (tirx.EQ(tirx.floormod(tx, 32), 0), lambda b, t, kk: t % 32 == 0),
    (tirx.EQ(tirx.truncmod(tx - 40, 7), -3),
     lambda b, t, kk: (t - 40) - 7 * _c_div(t - 40, 7) == -3),
    (tirx.truncdiv(tx - 40, 7) > -2, lambda b, t, kk: _c_div(t - 40, 7) > -2),
    ((tx >> 3) + k * 2 < 13, lambda b, t, kk: (t >> 3) + kk * 2 < 13),
    (tirx.And(bx * 64 + tx < 300, tirx.NE(k, 5)), lambda b, t, kk: b * 64 + t < 300 and kk != 5),
    (tirx.Or(tirx.EQ(tx & 1, 1), tirx.EQ(bx, 5)), lambda b, t, kk: (t & 1) == 1 or b == 5),
    (tirx.Min(tx, 20) + tirx.Max(bx, 3) > 22, lambda b, t, kk: min(t, 20) + max(b, 3) > 22),
    (tirx.Select(bx < 3, tx, 63 - tx) < 10, lambda b, t, kk: (t if b < 3 else 63 - t) < 10),
    (tirx.Not(tx * k < 100), lambda b, t, kk: not t * kk < 100),
]


@pytest.mark.parametrize("guard,predicate", CASES, ids=[str(c[0]) for c in CASES])
def test_guard_counts_match_enumeration(guard, predicate) -> None:
    assert count_points(AXES, [guard], {}, lambda v: None) == _brute(predicate)


def test_nested_guards_let_bindings_and_constant_parameters() -> None:
    row = tirx.Var("row", "int32")
    guards = [row < n, tirx.EQ(tirx.floormod(tx, 2), 0)]
    lets = {row: bx * 64 + tx}
    count = count_points(AXES, guards, lets, lambda v: 200 if v.same_as(n) else None)
    assert count == _brute(lambda b, t, kk: b * 64 + t < 200 and t % 2 == 0)


def test_unknown_variables_and_huge_spaces_are_not_guessed() -> None:
    assert count_points(AXES, [tx < n], {}, lambda v: None) is None
    big = (Axis(bx, 0, MAX_ENUMERATED_POINTS), Axis(tx, 0, 2))
    assert count_points(big, [bx + tx < 5], {}, lambda v: None) is None


def test_no_guard_is_the_product_of_trip_counts() -> None:
    assert count_points(AXES, [], {}, lambda v: None) == 6 * 64 * 3
