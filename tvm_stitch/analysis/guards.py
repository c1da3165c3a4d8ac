"""How many (thread, iteration) points of a kernel execute a statement under ``if`` guards.

A statement inside loops and ``if`` s of a kernel runs once per point of the iteration space
(every block, every thread, every enclosing loop iteration) at which all enclosing conditions
hold. The conditions TVM emits are integer arithmetic on thread indices and loop variables
(``threadIdx.x < 232``, ``threadIdx.x == 0``), so we count them exactly by evaluating the
conditions with numpy over the axes they mention; the other axes only multiply the count.
A condition we cannot evaluate (it reads memory, or its axes span too many points) gives
``None`` and the caller falls back to counting every point.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

# Axes a condition mentions are enumerated jointly, CHUNK_POINTS at a time (about 0.1 s and
# 40 MB of numpy work); beyond MAX_ENUMERATED_POINTS we give up rather than take seconds.
MAX_ENUMERATED_POINTS = 1 << 27
CHUNK_POINTS = 1 << 22


@dataclass(frozen=True)
class Axis:
    """One dimension of a kernel's iteration space: ``var`` takes ``min + step * k``."""

    var: tvm.ir.Var
    min: int
    extent: int
    step: int = 1

    @property
    def trips(self) -> int:
        """How many values the axis takes."""
        return max(0, -(-self.extent // self.step))

    def values(self) -> np.ndarray:
        """The values of the axis, as int64."""
        return np.arange(self.min, self.min + self.extent, self.step, dtype=np.int64)


class Unsupported(Exception):
    """A condition the numpy evaluator cannot handle."""


_BINARY: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    tirx.Add: operator.add,
    tirx.Sub: operator.sub,
    tirx.Mul: operator.mul,
    tirx.FloorDiv: np.floor_divide,
    tirx.FloorMod: np.mod,
    tirx.Min: np.minimum,
    tirx.Max: np.maximum,
    tirx.EQ: operator.eq,
    tirx.NE: operator.ne,
    tirx.LT: operator.lt,
    tirx.LE: operator.le,
    tirx.GT: operator.gt,
    tirx.GE: operator.ge,
    tirx.And: np.logical_and,
    tirx.Or: np.logical_or,
    tirx.LShift: np.left_shift,
    tirx.RShift: np.right_shift,
    tirx.BitwiseAnd: np.bitwise_and,
    tirx.BitwiseOr: np.bitwise_or,
    tirx.BitwiseXor: np.bitwise_xor,
}

IF_THEN_ELSE = "prim.if_then_else"  # the op name of tirx.if_then_else calls

_CALLS: dict[str, Callable[..., np.ndarray]] = {
    "prim.likely": lambda x: x,
    "tirx.tvm_thread_invariant": lambda x: x,  # a condition every thread agrees on
    IF_THEN_ELSE: np.where,
}


def _truncdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C division (TIR ``Div`` on integers rounds toward zero)."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


class Evaluator:
    """Evaluates integer/boolean TIR expressions over numpy arrays of axis values.

    ``env`` maps axis variables to (broadcastable) arrays, ``lets`` maps let-bound variables
    to their value expressions, and ``constant`` resolves any other variable (a kernel's
    scalar parameter) to an int, or None when it has no known value.
    """

    def __init__(self, env: Mapping[tvm.ir.Var, np.ndarray],
                 lets: Mapping[tvm.ir.Var, tvm.ir.PrimExpr],
                 constant: Callable[[tvm.ir.Var], int | None]) -> None:
        self.env = dict(env)
        self.lets = lets
        self.constant = constant

    def __call__(self, expr: tvm.ir.PrimExpr) -> np.ndarray:
        if isinstance(expr, tirx.IntImm | tirx.FloatImm):
            return np.asarray(expr.value)
        if isinstance(expr, tvm.ir.Var):
            return self._var(expr)
        op = _BINARY.get(type(expr))
        if op is not None:
            return op(self(expr.a), self(expr.b))
        if isinstance(expr, tirx.Div):
            return _truncdiv(self(expr.a), self(expr.b))
        if isinstance(expr, tirx.Mod):
            a, b = self(expr.a), self(expr.b)
            return a - b * _truncdiv(a, b)
        if isinstance(expr, tirx.Not):
            return np.logical_not(self(expr.a))
        if isinstance(expr, tirx.BitwiseNot):
            return np.invert(self(expr.a))
        if isinstance(expr, tirx.Select):
            return np.where(self(expr.condition), self(expr.true_value), self(expr.false_value))
        if isinstance(expr, tirx.Cast):
            value = self(expr.value)
            return value != 0 if str(expr.ty.dtype) == "bool" else value
        if isinstance(expr, tirx.Let):
            self.env[expr.var] = self(expr.value)
            return self(expr.body)
        if isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op):
            fn = _CALLS.get(expr.op.name)
            if fn is not None:
                return fn(*(self(a) for a in expr.args))
        raise Unsupported(f"cannot evaluate {type(expr).__name__}: {expr}")

    def _var(self, var: tvm.ir.Var) -> np.ndarray:
        if var in self.env:
            return self.env[var]
        if var in self.lets:
            value = self(self.lets[var])
            self.env[var] = value
            return value
        value = self.constant(var)
        if value is None:
            raise Unsupported(f"variable {var} has no known value")
        return np.asarray(value)


def free_vars(exprs: Sequence[tvm.ir.PrimExpr], lets: Mapping[tvm.ir.Var, tvm.ir.PrimExpr]
              ) -> list[tvm.ir.Var]:
    """Variables the expressions depend on, looking through let bindings.

    Raises Unsupported if one of them reads memory (a data-dependent condition).
    """
    found: dict[tvm.ir.Var, None] = {}
    loads: list[tvm.ir.TensorLoad] = []
    pending = list(exprs)

    def var(v: tvm.ir.Var) -> None:
        if v not in found:
            found[v] = None
            if v in lets:
                pending.append(lets[v])

    # Exceptions do not cross the FFI walk, so loads are collected and checked after it.
    while pending and not loads:
        tvm_ffi.structural_walk(pending.pop(), [(tvm.ir.TensorLoad, loads.append),
                                                (tvm.ir.Var, var)])
    if loads:
        raise Unsupported(f"condition reads memory: {loads[0]}")
    return list(found)


def reads_memory(expr: tvm.ir.PrimExpr, lets: Mapping[tvm.ir.Var, tvm.ir.PrimExpr]) -> bool:
    """True when ``expr`` (looking through let bindings) depends on a memory load."""
    try:
        free_vars([expr], lets)
    except Unsupported:
        return True
    return False


def count_points(axes: Sequence[Axis], guards: Sequence[tvm.ir.PrimExpr],
                 lets: Mapping[tvm.ir.Var, tvm.ir.PrimExpr],
                 constant: Callable[[tvm.ir.Var], int | None]) -> int | None:
    """Points of the space ``axes`` at which every guard holds; None if not computable."""
    total = math.prod(a.trips for a in axes)
    if not guards or total == 0:
        return total
    try:
        mentioned = free_vars(guards, lets)
    except Unsupported:
        return None
    used = [a for a in axes if a.var in mentioned]
    size = math.prod(a.trips for a in used)
    if size > MAX_ENUMERATED_POINTS:
        return None
    # Enumerate in slices of the longest axis so that memory stays bounded.
    split = max(range(len(used)), key=lambda i: used[i].trips, default=0)
    step = max(1, CHUNK_POINTS // max(1, size // used[split].trips)) if used else 1
    count = 0
    try:
        for start in range(0, used[split].trips if used else 1, step):
            count += _count_slice(used, split, start, step, guards, lets, constant)
    except Unsupported:
        return None
    return count * (total // size)


def _count_slice(used: Sequence[Axis], split: int, start: int, length: int,
                 guards: Sequence[tvm.ir.PrimExpr], lets: Mapping[tvm.ir.Var, tvm.ir.PrimExpr],
                 constant: Callable[[tvm.ir.Var], int | None]) -> int:
    """Points with the ``split`` axis restricted to values ``start`` .. ``start + length``."""
    env = {}
    shape = []
    for i, a in enumerate(used):
        values = a.values()[start:start + length] if i == split else a.values()
        dims = [1] * len(used)
        dims[i] = len(values)
        env[a.var] = values.reshape(dims)
        shape.append(len(values))
    evaluate = Evaluator(env, lets, constant)
    mask = np.ones(shape, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for guard in guards:
            mask &= np.broadcast_to(evaluate(guard).astype(bool), mask.shape)
    return int(np.count_nonzero(mask))
