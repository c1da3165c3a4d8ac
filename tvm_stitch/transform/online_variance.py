"""Online variance: a row's mean and its sum of squared deviations in one pass.

A variance (a LayerNorm's, a GroupNorm's, a batch norm's) reduces its row twice: the sum
``s``, then, about the mean ``m = s / n``, the sum of squares ``q`` of ``x - m`` (the stitch
flow's corrected LayerNorm also sums the deviations ``x - m``,
``transform.corrected_layer_norm``). Where the row stays on chip the second pass costs no
memory; where it does not (a row split over several blocks, a column reduction over many
rows), it reads the row again after a grid barrier. Taken as one reduction of the triples
``(q, m, n)`` (squared deviations about the mean, mean, count), with Chan, Golub and
LeVeque's pairwise combination

    n = n1 + n2,  d = m2 - m1,  m = m1 + d * (n2 / n),  q = q1 + q2 + d * d * (n1 * n2 / n)

and each element entering as ``(0, x, 1)`` (Welford's update), a thread, a warp and a block
combine partial triples in any order, and the row is read once for both. A mean that meets
an empty partial takes the other's exactly, so a row of one repeated value has that value
as its mean and 0 as its squares, as the corrected two-pass algorithm gives.

``merge_online_variance`` rewrites a fused PrimFunc's sum block, the block of its mean and
the sum of squares about that mean into one reduction block of three outputs, in the form
TVM's reduction analysis reads (``register_reducer`` registers the combination with it);
the sum of deviations about that mean, if any, is 0 and its readers read 0. The squares
come first and the count last: TVM's shared-memory tree reduction stores a reducer's values
one after the other, each computed from the buffers as they then are (as
``transform.online_softmax`` says), and the squares read the old mean and count, the mean
the old count.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..symbolic import substitute
from .merged_reductions import (
    initial_is,
    iter_map,
    operand_of,
    register_reducer,
    replaced,
    same_domain,
    sblocks,
    update_of,
)

# counts are kept in the sums' dtype: exact up to 2**24 in float32
_EXACT_COUNT = {"float32": 1 << 24, "float64": 1 << 53}
_MAX_EXPANSION = 16  # element-wise producers substituted into a term, at most


def _combine(x: list[tvm.ir.Var], y: list[tvm.ir.Var]) -> list[tvm.ir.PrimExpr]:
    """Chan's combination of ``(q, m, n)`` triples, spelled with explicit nodes: TVM
    matches the reducer by the form of the expressions, and an element's constants (its
    ``q`` of 0 and ``n`` of 1) must not be folded away. Only the weights are conditional
    (TVM lowers a select to a branch, and the partials read in both branches of one would
    count twice): a pair with an empty side adds no squares, and a mean meeting an empty
    partial (whose mean is 0) takes the other's whole, exactly."""
    q1, m1, n1 = x
    q2, m2, n2 = y
    dtype = q1.ty.dtype
    zero, one = tirx.const(0, dtype), tirx.const(1, dtype)
    total = tirx.Add(n1, n2)
    delta = tirx.Sub(m2, m1)
    both = tirx.Mul(n1, n2)
    squares = tirx.Add(tirx.Add(q1, q2), tirx.Mul(
        tirx.Mul(delta, delta), tirx.Select(tirx.GT(both, zero), tirx.Div(both, total), zero)))
    mean = tirx.Add(m1, tirx.Mul(delta, tirx.Select(tirx.EQ(n1, zero), one,
                                                    tirx.Div(n2, total))))
    return [squares, mean, total]


def _identity(values: list[tvm.ir.PrimExpr]) -> list[tvm.ir.PrimExpr]:
    return [tirx.const(0, v.ty.dtype) for v in values]


register_reducer("online_variance", 3, _combine, _identity)


@dataclass(frozen=True)
class VarianceTriple:
    """A sum block, the block of its mean and the sum of squares about that mean, merged
    (``merge_online_variance``): ``total`` then writes the squares, the mean and a count;
    ``deviations`` names a sum of the deviations about the mean ("" when none), whose
    readers then read 0."""

    total: str
    mean: str
    squares: str
    deviations: str = ""


def _elementwise(block: s_tir.SBlock) -> tirx.BufferStore | None:
    body = block.body
    if block.init is None and isinstance(body, tirx.BufferStore) and len(block.writes) == 1 \
            and all(isinstance(i, tvm.ir.Var) for i in body.indices):
        return body
    return None


def _expand(expr: tvm.ir.PrimExpr, producers: dict[str, tirx.BufferStore], stop: str
            ) -> tvm.ir.PrimExpr:
    """``expr`` with each load of an element-wise intermediate (``producers``) replaced by
    the value its block stores there, recursively; loads of ``stop`` are kept."""
    budget = [_MAX_EXPANSION]

    def on_load(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        store = producers.get(load.source.name)
        if store is None or load.source.name == stop or budget[0] <= 0 \
                or len(store.indices) != len(load.indices):
            return load
        budget[0] -= 1
        value = substitute(store.value, dict(zip(store.indices, load.indices, strict=True)))
        return tvm_ffi.structural_map(value, [(tvm.ir.TensorLoad, on_load)])

    return tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, on_load)])


def _analyzer(block: s_tir.SBlock) -> Analyzer:
    ana = Analyzer()
    for it in block.iter_vars:
        ana.bind(it.var, it.dom)
    return ana


def _mean_of(block: s_tir.SBlock, total: tirx.Buffer, count: int) -> bool:
    """Whether the element-wise ``block`` stores ``total / count`` at its own element."""
    store = _elementwise(block)
    if store is None or not tvm_ffi.structural_equal(store.buffer.shape, total.shape):
        return False
    value = store.value
    if isinstance(value, tirx.Div) and isinstance(value.b, tirx.FloatImm):
        scale = 1.0 / value.b.value
    elif isinstance(value, tirx.Mul) and isinstance(value.b, tirx.FloatImm):
        scale = value.b.value
    else:
        return False
    load = value.a
    return isinstance(load, tvm.ir.TensorLoad) and load.source.same_as(total) \
        and tvm_ffi.structural_equal(list(load.indices), list(store.indices)) \
        and abs(scale * count - 1) < 1e-6


def _deviation(expr: tvm.ir.PrimExpr, element: tvm.ir.PrimExpr, mean: tvm.ir.PrimExpr,
               ana: Analyzer) -> bool:
    """Whether ``expr`` is ``element - mean`` (``mean`` a load, indices proven equal)."""
    if not isinstance(expr, tirx.Sub) or not tvm_ffi.structural_equal(expr.a, element):
        return False
    load = expr.b
    return isinstance(load, tvm.ir.TensorLoad) and load.source.same_as(mean.source) \
        and all(ana.can_prove_equal(a, b) for a, b in zip(load.indices, mean.indices,
                                                          strict=True))


def _square_of(expr: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr | None:
    """``a`` when ``expr`` is ``a * a`` or ``pow(a, 2)``."""
    if isinstance(expr, tirx.Mul) and tvm_ffi.structural_equal(expr.a, expr.b):
        return expr.a
    if isinstance(expr, tvm.ir.Call) and expr.op.same_as(tvm.ir.Op.get("tirx.pow")) \
            and isinstance(expr.args[1], tirx.FloatImm) and expr.args[1].value == 2.0:
        return expr.args[0]
    return None


def find_variance_triples(func: tirx.PrimFunc) -> list[VarianceTriple]:
    """The (sum, mean, sum of squares about the mean) blocks of ``func`` that
    ``merge_online_variance`` can merge: a float sum ``s[i]`` of ``x`` over a static
    domain, read by one element-wise block alone that stores ``m[i] = s[i] / n``, and a sum
    over the same domain of ``(x - m[i])`` squared, where ``x`` is the same element once the
    element-wise intermediates both read are substituted. A sum of ``x - m[i]`` over the
    same domain comes along (the corrected LayerNorm's)."""
    blocks = sblocks(func)
    params = {p.name for p in func.params if isinstance(p.ty, tirx.BufferType)}
    producers = {s.buffer.name: s for b in blocks if (s := _elementwise(b)) is not None}
    readers: dict[str, list[s_tir.SBlock]] = {}
    for b in blocks:
        for r in b.reads:
            readers.setdefault(r.source.name, []).append(b)
    found = []
    for total in blocks:
        store = update_of(total)
        x = operand_of(store, tirx.Add) if store is not None else None
        dtype = store.buffer.dtype if store is not None else ""
        if x is None or dtype not in _EXACT_COUNT \
                or not initial_is(total, tirx.const(0, dtype)) \
                or store.buffer.name in params:
            continue
        reduced = [it.dom.extent for it in total.iter_vars
                   if it.iter_type == tirx.IterVar.CommReduce]
        if not reduced or not all(isinstance(e, tirx.IntImm) for e in reduced):
            continue
        count = prod(int(e) for e in reduced)
        users = readers.get(store.buffer.name, [])
        if count > _EXACT_COUNT[dtype] or len(users) != 1 \
                or not _mean_of(users[0], store.buffer, count):
            continue
        mean_block = users[0]
        mean_buffer = mean_block.writes[0].source
        triple = _match_squares(blocks, total, store, x, mean_block, mean_buffer, producers,
                                params)
        if triple is not None:
            found.append(triple)
    return found


def _match_squares(blocks: list[s_tir.SBlock], total: s_tir.SBlock, store: tirx.BufferStore,
                   x: tvm.ir.PrimExpr, mean_block: s_tir.SBlock, mean_buffer: tirx.Buffer,
                   producers: dict[str, tirx.BufferStore], params: set[str]
                   ) -> VarianceTriple | None:
    squares, deviations = "", ""
    for other in blocks:
        other_store = update_of(other)
        term = operand_of(other_store, tirx.Add) if other_store is not None else None
        if term is None or other.same_as(total) or not same_domain(total, other) \
                or other_store.buffer.dtype != store.buffer.dtype \
                or not initial_is(other, tirx.const(0, store.buffer.dtype)) \
                or not tvm_ffi.structural_equal(other_store.buffer.shape, store.buffer.shape):
            continue
        to_other = iter_map(total, other)
        element = _expand(substitute(x, to_other), producers, mean_buffer.name)
        mean = tirx.BufferLoad(mean_buffer, [substitute(i, to_other) for i in store.indices])
        ana = _analyzer(other)
        expanded = _expand(term, producers, mean_buffer.name)
        squared = _square_of(expanded)
        if not squares and squared is not None and _deviation(squared, element, mean, ana):
            squares = other.name_hint
        elif not deviations and other_store.buffer.name not in params \
                and _deviation(expanded, element, mean, ana):
            deviations = other.name_hint
    if not squares:
        return None
    return VarianceTriple(total.name_hint, mean_block.name_hint, squares, deviations)


def with_online_variance(func: tirx.PrimFunc, totals: tuple[str, ...]) -> tirx.PrimFunc:
    """``func`` with the triple of each sum block named in ``totals`` merged
    (``merge_online_variance``): the plan's ``Group.online_variance``. Every one must be
    found."""
    if not totals:
        return func
    triples = {t.total: t for t in find_variance_triples(func)}
    missing = [t for t in totals if t not in triples]
    assert not missing, f"no sum of squares about the mean pairs with {missing}"
    for name in totals:
        func = merge_online_variance(func, triples[name])
    return func


def merge_online_variance(func: tirx.PrimFunc, triple: VarianceTriple) -> tirx.PrimFunc:
    """``func`` with the blocks of ``triple`` merged: the sum's block writes the squares,
    the mean (into the mean block's buffer) and a count, each element entering as
    ``(0, x, 1)`` (``register_reducer``); the mean's and the squares' loop nests are
    removed, so is the sum of deviations (its readers read 0), and so are the element-wise
    blocks that only fed them."""
    blocks = {b.name_hint: b for b in sblocks(func)}
    total = blocks[triple.total]
    store = total.body
    x = operand_of(store, tirx.Add)
    squares = blocks[triple.squares]
    squares_buffer = squares.body.buffer
    mean_buffer = blocks[triple.mean].writes[0].source
    dtype = store.buffer.dtype
    # layout=None as TVM's own buffers (``task_split.combine_per_reader``): decl_buffer's
    # default layout makes a one-element buffer a scalar, which TVMScript prints as
    # ``X.source[i]`` and cannot parse back (the SIMT runner's float16 retyping)
    count = tirx.decl_buffer(store.buffer.shape, dtype, f"{store.buffer.name}_count",
                             scope=store.buffer.scope(), layout=None)
    indices = list(store.indices)
    own = [tirx.BufferLoad(b, indices) for b in (squares_buffer, mean_buffer, count)]
    element = [tirx.const(0, dtype), x, tirx.const(1, dtype)]
    values = _combine(own, element)
    bound = [tirx.Var(n, dtype) for n in ("q", "m", "n")]
    body = tirx.SeqStmt([*(tirx.Bind(v, e) for v, e in zip(bound, values, strict=True)),
                         *(tirx.BufferStore(o.source, v, indices)
                           for o, v in zip(own, bound, strict=True))])
    init = tirx.SeqStmt([tirx.BufferStore(o.source, tirx.const(0, dtype), indices)
                         for o in own])
    region = total.writes[0].region
    merged = s_tir.SBlock(total.iter_vars, total.reads,
                          [tvm.ir.TensorRegion(o.source, region, total.writes[0].ty) for o in own],
                          total.name_hint, body, init, total.alloc_buffers,
                          total.match_buffers, total.annotations)
    drop = {triple.mean, triple.squares} | ({triple.deviations} if triple.deviations else set())
    zeroed = [blocks[triple.deviations].writes[0].source] if triple.deviations else []
    drop |= _only_feeding(func, drop | {triple.total}, merged)
    return replaced(func, total, merged, drop, added=[count], zeroed=zeroed)


def _only_feeding(func: tirx.PrimFunc, dropped: set[str], merged: s_tir.SBlock) -> set[str]:
    """The element-wise blocks whose results are read by the blocks ``dropped`` alone (and
    not by ``merged``), recursively: intermediates of the removed reductions."""
    params = {p.name for p in func.params if isinstance(p.ty, tirx.BufferType)}
    blocks = sblocks(func)
    kept_reads = {r.source.name for r in merged.reads}
    extra: set[str] = set()
    changed = True
    while changed:
        changed = False
        gone = dropped | extra
        for b in blocks:
            if b.name_hint in gone or _elementwise(b) is None:
                continue
            written = b.writes[0].source.name
            users = [u for u in blocks if u.name_hint not in gone
                     and any(r.source.name == written for r in u.reads)]
            if written not in params and written not in kept_reads and not users:
                extra.add(b.name_hint)
                changed = True
    return extra
