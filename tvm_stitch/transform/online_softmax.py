"""Online softmax: a row's maximum and its sum of exponentials in one pass.

A softmax (or log-softmax, or a cross-entropy's normaliser) reduces its row twice: the
maximum ``m``, then the sum ``s`` of ``exp(x - m)``. Taken together as one reduction of the
pairs ``(s, m)``, with the combination

    (s1, m1) . (s2, m2) = (s1 * exp(m1 - M) + s2 * exp(m2 - M), M),  M = max(m1, m2)

and each element entering as ``(1, x)``, a thread, a warp and a block combine partial pairs
in any order, so the row is read once for both (Milakov and Gimelshein, "Online normalizer
calculation for softmax", 2018). ``merge_online_softmax`` rewrites a fused PrimFunc's pair of
reduction blocks into one block of two outputs in the form TVM's reduction analysis reads
(``register_reducer`` registers the combination with it), so rfactor and the cross-thread
reduction lower it as they lower a sum. The sum comes first: TVM's shared-memory tree
reduction stores a reducer's values one after the other, each computed from the buffers as
they then are, and the sum reads the maximum's old value.

The identity is the maximum block's own initial value (TVM's legalised softmax starts from
the lowest finite float, not -inf), so no combination subtracts two infinities that the
two-pass softmax would not.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..symbolic import substitute
from .merged_reductions import (
    FLOATS,
    initial_is,
    iter_map,
    operand_of,
    register_reducer,
    replaced,
    same_domain,
    sblocks,
    update_of,
)


def _combine(x: list[tvm.ir.Var], y: list[tvm.ir.Var]) -> list[tvm.ir.PrimExpr]:
    most = tirx.max(x[1], y[1])
    return [x[0] * tirx.exp(x[1] - most) + y[0] * tirx.exp(y[1] - most), most]


def _identity(values: list[tvm.ir.PrimExpr]) -> list[tvm.ir.PrimExpr]:
    return [tirx.const(0, values[0].ty.dtype), tirx.min_value(values[1].ty.dtype)]


register_reducer("online_softmax", 2, _combine, _identity)


@dataclass(frozen=True)
class OnlinePair:
    """A maximum block and the sum block of its exponentials, merged (``merge_online_softmax``):
    ``maximum`` then writes both results; ``exponentials`` names the block of
    ``exp(x - m)`` the sum read, removed when nothing else reads it ("" when the sum
    computed it itself)."""

    maximum: str
    total: str
    exponentials: str


def _exponent_of(expr: tvm.ir.PrimExpr, maximum: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr | None:
    """``x`` when ``expr`` is ``exp(x - maximum)``."""
    if isinstance(expr, tvm.ir.Call) and expr.op.same_as(tvm.ir.Op.get("tirx.exp")) \
            and isinstance(expr.args[0], tirx.Sub) \
            and tvm_ffi.structural_equal(expr.args[0].b, maximum):
        return expr.args[0].a
    return None


def find_online_pairs(func: tirx.PrimFunc) -> list[OnlinePair]:
    """The (maximum, sum of exponentials) reduction pairs of ``func`` that
    ``merge_online_softmax`` can merge: a maximum ``m[i] = max over k of x`` whose initial
    value is the lowest finite float, and a sum over the same domain of ``exp(x - m[i])``,
    computed in the sum's block or read from a block that computes it at every element."""
    blocks = sblocks(func)
    writers = {w.source.name: b for b in blocks for w in b.writes}
    pairs = []
    for high in blocks:
        store = update_of(high)
        x = operand_of(store, tirx.Max) if store is not None else None
        if x is None or store.buffer.dtype not in FLOATS \
                or not initial_is(high, tirx.min_value(store.buffer.dtype)):
            continue
        for total in blocks:
            sum_store = update_of(total)
            term = operand_of(sum_store, tirx.Add) if sum_store is not None else None
            if term is None or total.same_as(high) or not same_domain(high, total) \
                    or sum_store.buffer.dtype != store.buffer.dtype \
                    or not initial_is(total, tirx.const(0, store.buffer.dtype)):
                continue
            pair = _match_sum(high, store, x, total, term, writers)
            if pair is not None:
                pairs.append(pair)
    return pairs


def _match_sum(high: s_tir.SBlock, store: tirx.BufferStore, x: tvm.ir.PrimExpr,
               total: s_tir.SBlock, term: tvm.ir.PrimExpr, writers: dict[str, s_tir.SBlock]
               ) -> OnlinePair | None:
    """The pair of ``high`` (its update ``store`` takes the maximum with ``x``) and
    ``total`` (adding ``term``) when ``term`` is ``exp(x - m[i])`` at the same element."""
    to_sum = iter_map(high, total)
    maximum = tirx.BufferLoad(store.buffer, [substitute(i, to_sum) for i in store.indices])
    exponentials = ""
    if isinstance(term, tvm.ir.TensorLoad) and term.source.name in writers:
        producer = writers[term.source.name]
        value = producer.body
        if not isinstance(value, tirx.BufferStore) or producer.init is not None \
                or len(value.indices) != len(term.indices) \
                or not all(isinstance(i, tvm.ir.Var) for i in value.indices):
            return None
        term = substitute(value.value, dict(zip(value.indices, term.indices, strict=True)))
        exponentials = producer.name_hint
    exponent = _exponent_of(term, maximum)
    if exponent is None or not tvm_ffi.structural_equal(exponent, substitute(x, to_sum)):
        return None
    return OnlinePair(high.name_hint, total.name_hint, exponentials)


def with_online_softmax(func: tirx.PrimFunc, maxima: tuple[str, ...]) -> tirx.PrimFunc:
    """``func`` with the pair of each maximum block named in ``maxima`` merged
    (``merge_online_softmax``): the plan's ``Group.online``. Every one must be found."""
    if not maxima:
        return func
    pairs = {p.maximum: p for p in find_online_pairs(func)}
    missing = [m for m in maxima if m not in pairs]
    assert not missing, f"no sum of exponentials pairs with {missing}"
    for name in maxima:
        func = merge_online_softmax(func, pairs[name])
    return func


def merge_online_softmax(func: tirx.PrimFunc, pair: OnlinePair) -> tirx.PrimFunc:
    """``func`` with the blocks of ``pair`` merged: the maximum's block also writes the sum,
    each element entering the pair ``(s, m)`` as ``(1, x)`` (``register_reducer``); the sum's
    loop nest is removed, and so is the exponentials' block when nothing else reads it."""
    blocks = {b.name_hint: b for b in sblocks(func)}
    high, total = blocks[pair.maximum], blocks[pair.total]
    store, sum_store = high.body, total.body
    x = operand_of(store, tirx.Max)
    own = tirx.BufferLoad(store.buffer, store.indices)
    to_high = iter_map(total, high)
    sum_indices = [substitute(i, to_high) for i in sum_store.indices]
    own_sum = tirx.BufferLoad(sum_store.buffer, sum_indices)
    dtype = store.buffer.dtype
    new_sum, new_max = tirx.Var("s", dtype), tirx.Var("m", dtype)
    # the combination of (s, m) with (1, x), spelled as ``_combine`` spells it: TVM matches
    # the reducer by the form of the expressions
    most = tirx.max(own, x)
    body = tirx.SeqStmt([
        tirx.Bind(new_sum, own_sum * tirx.exp(own - most)
                  + tirx.Mul(tirx.const(1, dtype), tirx.exp(x - most))),
        tirx.Bind(new_max, most),
        tirx.BufferStore(sum_store.buffer, new_sum, sum_indices),
        tirx.BufferStore(store.buffer, new_max, store.indices),
    ])
    init = tirx.SeqStmt([tirx.BufferStore(sum_store.buffer, total.init.value, sum_indices),
                         high.init])
    merged = s_tir.SBlock(high.iter_vars, high.reads,
                          [substitute(total.writes[0], to_high), *high.writes],
                          high.name_hint, body, init, high.alloc_buffers, high.match_buffers,
                          high.annotations)
    drop = {pair.total}
    if pair.exponentials:
        written = blocks[pair.exponentials].writes[0].source.name
        if not any(r.source.name == written for name, b in blocks.items()
                   if name not in (pair.total, pair.exponentials) for r in b.reads):
            drop.add(pair.exponentials)
    return replaced(func, high, merged, drop)
