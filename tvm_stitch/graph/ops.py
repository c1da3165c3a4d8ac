"""Op classes: what one legalized Relax op (a PrimFunc called by ``call_tir``) does.

TVM's ``AnnotateTIROpPattern`` gives a coarse pattern per PrimFunc; it marks softmax and
layer norm ``kOutEWiseFusable`` like a matmul. We refine it by reading the TIR: a reduction
block that reads some input without one of its spatial axes re-uses data (matmul, conv) and is
compute-intensive; a reduction over the innermost axes of its inputs is a row reduction; one
over an outer axis is a column reduction. Element-wise ops are expensive when they call
transcendental functions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from enum import StrEnum
from math import isqrt, prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..lowering import scalar_dtype
from ..symbolic import dim_value, is_symbolic, shape_values
from .copies import Copy, copy_kind

# TVM's OpPatternKind values, as AnnotateTIROpPattern writes them into "op_pattern".
ELEMWISE, BROADCAST, INJECTIVE, COMM_REDUCE, OUT_EWISE_FUSABLE, TUPLE, OPAQUE = 0, 1, 2, 3, 4, 7, 8

EXPENSIVE_CALLS = frozenset(
    f"tirx.{name}"
    for name in ("exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "erf", "tanh",
                 "sigmoid", "pow", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan",
                 "atan2", "sinh", "cosh", "asinh", "acosh", "atanh")
)
"""The TIR intrinsics that make an element-wise op expensive (transcendental functions)."""


class OpKind(StrEnum):
    """What an op does, as far as stitching cares."""

    ELEMWISE = "elementwise"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    ROW_REDUCE = "row-reduce"
    COLUMN_REDUCE = "column-reduce"
    COMPUTE = "compute"  # data re-use: matmul, conv, and out-fusable ops we do not recognise
    OPAQUE = "opaque"  # anything TVM cannot describe (sort, scan, extern calls)

    @property
    def memory_intensive(self) -> bool:
        """True for the op classes that stitching may group."""
        return self not in (OpKind.COMPUTE, OpKind.OPAQUE)


@dataclass(frozen=True)
class OpInfo:
    """Classification of one op (one PrimFunc) and the facts grouping needs about it.

    ``input_reads[i]`` counts the loads of input parameter ``i`` over all blocks;
    ``input_aligned[i]`` says every one of them reads the element at the position the op
    writes (a one-to-one dependence). ``rows`` and ``row_length`` are the rows of a row
    reduction and their length, or the rows a column reduction reduces and the columns it
    keeps. ``unsupported`` is non-empty when the op is memory-intensive but cannot be
    stitched, and says why. ``copy`` says what the op does if it only moves elements
    (``graph.copies``).
    """

    kind: OpKind
    pattern: int | None
    out_shape: tuple[int, ...]
    expensive: bool = False
    rows: int = 0
    row_length: int = 0
    input_reads: tuple[int, ...] = ()
    input_aligned: tuple[bool, ...] = ()
    detail: str = ""
    unsupported: str = ""
    copy: Copy | None = None
    in_shape: tuple[int, ...] = ()  # of its one input, for a copy

    @property
    def out_size(self) -> int:
        """Number of output elements."""
        return prod(self.out_shape)

    @property
    def row_counts(self) -> frozenset[int]:
        """Row counts this op's output can be split into: products of its leading dims."""
        counts = {1}
        size = 1
        for d in self.out_shape:
            size *= d
            counts.add(size)
        return frozenset(counts)

    @property
    def split_row_counts(self) -> frozenset[int]:
        """Row counts this op's output can be split into when a dim may be split: products of
        its leading dims with a divisor of the next (rows of (B, G) in (B, C, H, W) of
        C = G x C / G: a group normalisation's; ``schedule.rows_first`` splits the
        iterator)."""
        counts = {1}
        size = 1
        for d in self.out_shape:
            counts.update(size * k for k in ((1, d) if is_symbolic(d) else _divisors(d)))
            size *= d
        return frozenset(counts)

    @property
    def regrouped_counts(self) -> frozenset[int]:
        """Row counts of a reshape's output that split a dim of its input: (B, G) of a
        reshape of (B, C, H, W) to (B, G, C / G x H x W), as a group normalisation exported
        as an instance normalisation reads its input (torch's ``GroupNorm`` to ONNX before
        opset 18). Its rows then split a dim as a ``GroupNormalization``'s do."""
        if self.copy is not Copy.VIEW or not self.in_shape:
            return frozenset()
        read = replace(self, out_shape=self.in_shape)
        return self.row_counts & (read.split_row_counts - read.row_counts)


@functools.cache
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` (trial division up to its square root)."""
    small = [k for k in range(1, isqrt(n) + 1) if n % k == 0]
    return tuple(sorted({*small, *(n // k for k in small)}))


@dataclass(frozen=True)
class _Block:
    name: str
    spatial: tuple[tvm.ir.Var, ...]
    reduce: tuple[tvm.ir.Var, ...]
    extents: dict[tvm.ir.Var, int]
    order: tuple[tvm.ir.Var, ...]
    loads: tuple[tuple[tirx.Buffer, tuple[tvm.ir.PrimExpr, ...]], ...]
    writes: tuple[tvm.ir.TensorRegion, ...]
    calls: frozenset[str]


def classify(func: tirx.PrimFunc, num_outputs: int = 1) -> OpInfo:
    """Classify ``func`` (a legalized op with ``num_outputs`` trailing output parameters)."""
    pattern = _pattern(func)
    params = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    scalars = [p for p in func.params if not isinstance(p.ty, tirx.BufferType)]
    if any(not scalar_dtype(p).startswith("int") for p in scalars):  # shape values only
        return OpInfo(OpKind.OPAQUE, pattern, (), detail="scalar parameters",
                      unsupported="takes scalar parameters")
    out_shape = shape_values(params[-1].shape) if params else None  # outputs share one shape
    if out_shape is None:
        return OpInfo(OpKind.OPAQUE, pattern, (), detail="symbolic shape",
                      unsupported="output shape with a dimension that is not a product of "
                                  "shape variables")
    inputs = params[: len(params) - num_outputs]
    blocks = _blocks(func)
    gather = pattern == OPAQUE and _is_gather(blocks)
    if gather:
        pattern = INJECTIVE
    elif pattern is None or pattern >= TUPLE:
        return OpInfo(OpKind.OPAQUE, pattern, out_shape, detail="opaque op pattern")
    if blocks is None:
        return OpInfo(OpKind.OPAQUE, pattern, out_shape, detail="blocks not analysable",
                      unsupported="its TIR has loops or blocks we cannot analyse")
    reads = tuple(sum(1 for b in blocks for buf, _ in b.loads if buf.same_as(p)) for p in inputs)
    aligned = tuple(_reads_aligned(blocks, p) for p in inputs)
    expensive = any(b.calls & EXPENSIVE_CALLS for b in blocks)
    base = {"pattern": pattern, "out_shape": out_shape, "expensive": expensive,
            "input_reads": reads, "input_aligned": aligned,
            "detail": "gather (opaque to TVM)" if gather else ""}
    if len({shape_values(p.shape) for p in params[len(inputs):]}) != 1:
        return OpInfo(OpKind.OPAQUE, **{**base, "detail": "outputs of several shapes"},
                      unsupported="has outputs of different shapes")
    if any(shape_values(p.shape) is None for p in params):
        return OpInfo(OpKind.OPAQUE, **{**base, "detail": "symbolic shape"},
                      unsupported="input shape with a dimension that is not a product of "
                                  "shape variables")
    reductions = [b for b in blocks if b.reduce]
    if not reductions:
        if pattern in (ELEMWISE, BROADCAST, INJECTIVE):
            kind = (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.INJECTIVE)[pattern]
            copy = copy_kind(func)
            return OpInfo(kind, **base, copy=copy,
                          in_shape=shape_values(inputs[0].shape) if copy else ())
        return OpInfo(OpKind.COMPUTE, **{**base, "detail": "out-fusable op without a reduction"})
    for b in reductions:
        reused = _reused_input(b)
        if reused:
            return OpInfo(OpKind.COMPUTE, **{**base, "detail": f"block {b.name} re-uses {reused}"})
    not_rows = [why for why in map(_not_row_reduction, reductions) if why]
    if not_rows:
        return _column_reduction(reductions, base, not_rows[0])
    rows = {prod(b.extents[v] for v in b.spatial) for b in reductions}
    if len(rows) != 1:
        return OpInfo(OpKind.ROW_REDUCE, **{**base, "detail": "different row counts"},
                      unsupported="its reductions use different row counts")
    lengths = [prod(b.extents[v] for v in b.reduce) for b in reductions]
    return OpInfo(OpKind.ROW_REDUCE, **base, rows=rows.pop(), row_length=max(lengths))


def _pattern(func: tirx.PrimFunc) -> int | None:
    attrs = func.attrs
    if attrs is None or "op_pattern" not in attrs:
        return None
    return int(attrs["op_pattern"])


def _blocks(func: tirx.PrimFunc) -> list[_Block] | None:
    """The non-root blocks of ``func`` with their iterators and loads, or None when an iterator
    is neither spatial nor reduction or has an extent without a value (``dim_value``)."""
    found: list[s_tir.stmt.SBlock] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.stmt.SBlock, found.append)])
    blocks = []
    for blk in found:
        if blk.name_hint == "root" and not blk.iter_vars:
            continue
        spatial, reduce, extents = [], [], {}
        for iv in blk.iter_vars:
            extent = dim_value(iv.dom.extent)
            if extent is None:
                return None
            extents[iv.var] = extent
            if iv.iter_type == tirx.IterVar.DataPar:
                spatial.append(iv.var)
            elif iv.iter_type == tirx.IterVar.CommReduce:
                reduce.append(iv.var)
            else:
                return None
        loads, calls = _loads_and_calls(blk.body)
        blocks.append(_Block(blk.name_hint, tuple(spatial), tuple(reduce), extents,
                             tuple(iv.var for iv in blk.iter_vars), tuple(loads),
                             tuple(blk.writes), frozenset(calls)))
    return blocks


def _loads_and_calls(body: tirx.Stmt
                     ) -> tuple[list[tuple[tirx.Buffer, tuple[tvm.ir.PrimExpr, ...]]], set[str]]:
    loads: list[tuple[tirx.Buffer, tuple[tvm.ir.PrimExpr, ...]]] = []
    calls: set[str] = set()

    def on_load(n: tvm.ir.TensorLoad) -> None:
        loads.append((n.source, tuple(n.indices)))

    def on_call(n: tvm.ir.Call) -> None:
        if hasattr(n.op, "name"):
            calls.add(str(n.op.name))

    tvm_ffi.structural_walk(body, [(tvm.ir.TensorLoad, on_load), (tvm.ir.Call, on_call)])
    return loads, calls


def _is_gather(blocks: list[_Block] | None) -> bool:
    """An op TVM calls opaque that is a gather: spatial blocks only, each iteration writing
    its own element (reads may use data-dependent indices, writes may not)."""
    if not blocks:
        return False
    for b in blocks:
        if b.reduce:
            return False
        for region in b.writes:
            if len(region.region) != len(b.order):
                return False
            for r, v in zip(region.region, b.order, strict=True):
                if not (isinstance(r.min, tvm.ir.Var) and r.min.same_as(v)
                        and isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1):
                    return False
    return True


def _vars_of(expr: tvm.ir.PrimExpr) -> list[tvm.ir.Var]:
    found: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.Var, found.append)])
    return found


def _uses(expr: tvm.ir.PrimExpr, var: tvm.ir.Var) -> bool:
    return any(v.same_as(var) for v in _vars_of(expr))


def _reused_input(block: _Block) -> str:
    """Name of a buffer that ``block`` reads along a reduction axis but without one of its
    (non-unit) spatial axes: the data re-use of a matmul or a convolution."""
    for buf, indices in block.loads:
        along_reduce = any(_uses(i, r) for i in indices for r in block.reduce)
        if not along_reduce:
            continue
        for s in block.spatial:
            if block.extents[s] > 1 and not any(_uses(i, s) for i in indices):
                return buf.name
    return ""


def _column_reduction(reductions: list[_Block], base: dict, why: str) -> OpInfo:
    """A reduction that is not a row reduction: a column reduction (the reduced axes lead,
    the kept ones trail) over ``rows`` rows of ``row_length`` columns, which Global stitching
    handles, or a window or mixed reduction, which it does not."""
    detail = {**base, "detail": why}
    reasons = [r for r in map(_not_column_reduction, reductions) if r]
    if reasons:
        return OpInfo(OpKind.COLUMN_REDUCE, **detail,
                      unsupported=f"window or mixed reduction ({reasons[0]})")
    rows = {prod(b.extents[v] for v in b.reduce) for b in reductions}
    columns = {prod(b.extents[v] for v in b.spatial) for b in reductions}
    if len(rows) != 1 or len(columns) != 1:
        return OpInfo(OpKind.COLUMN_REDUCE, **detail,
                      unsupported="its column reductions use different shapes")
    return OpInfo(OpKind.COLUMN_REDUCE, **detail, rows=rows.pop(), row_length=columns.pop())


def _not_column_reduction(block: _Block) -> str:
    """Why ``block`` is not a column reduction (empty if it is): every buffer it reads along
    its reduction axes must be indexed by reduction axes in its leading dimensions and by
    spatial axes in the trailing ones (an axis of extent 1 may sit anywhere)."""
    long_spatial = [s for s in block.spatial if block.extents[s] > 1]
    for buf, indices in block.loads:
        kinds = []
        for idx in indices:
            has_r = any(_uses(idx, r) for r in block.reduce)
            has_s = any(_uses(idx, s) for s in long_spatial)
            if has_r and has_s:
                return f"block {block.name} reads {buf.name} with mixed indices"
            kinds.append("R" if has_r else "S" if has_s else "")
        if "R" not in kinds:
            continue
        last_r = max(i for i, k in enumerate(kinds) if k == "R")
        if "S" in kinds[:last_r]:
            return f"block {block.name} reduces {buf.name} over an inner axis too"
    return ""


def _not_row_reduction(block: _Block) -> str:
    """Why ``block`` is not a row reduction (empty if it is): its reduction axes must come
    after its spatial ones and index only the innermost dimensions of what it reads."""
    kinds = ["R" if any(v.same_as(r) for r in block.reduce) else "S" for v in block.order]
    seen_reduce = False
    for v, kind in zip(block.order, kinds, strict=True):
        if kind == "R":
            seen_reduce = True
        elif seen_reduce and block.extents[v] > 1:
            return f"block {block.name} has a spatial axis after its reduction axes"
    long_spatial = [s for s in block.spatial if block.extents[s] > 1]
    for buf, indices in block.loads:
        inner = False
        for idx in indices:
            has_r = any(_uses(idx, r) for r in block.reduce)
            has_s = any(_uses(idx, s) for s in long_spatial)  # a unit axis may sit anywhere
            if has_r and has_s:
                return f"block {block.name} reads {buf.name} with mixed indices"
            if has_r:
                inner = True
            elif inner and has_s:
                return f"block {block.name} reduces {buf.name} over an outer axis"
    return ""


def _reads_aligned(blocks: list[_Block], buf: tvm.ir.Var) -> bool:
    """Whether every load of ``buf`` reads the element at the loading block's own position
    (indices equal to the block's iterators, shapes equal): a one-to-one dependence, so the
    producer of ``buf`` can run in the same thread as each reader."""
    shape = shape_values(buf.shape)
    for b in blocks:
        for load_buf, indices in b.loads:
            if not load_buf.same_as(buf):
                continue
            if tuple(b.extents[v] for v in b.order) != shape or len(indices) != len(b.order):
                return False
            if not all(isinstance(i, tvm.ir.Var) and i.same_as(v)
                       for i, v in zip(indices, b.order, strict=True)):
                return False
    return True
