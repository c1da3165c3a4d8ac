"""Which blocks may access their buffers in vectors: aligned whole vectors, and the lanes
TVM's CUDA code generator can give a boolean value."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV
from tvm.sym import Analyzer

from ..graph.ops import EXPENSIVE_CALLS
from ..transform.expressions import substituted, uses
from ..transform.uniform_conditions import IF_THEN_ELSE, lane_uniform
from .mapping import VECTOR_BYTES


def aligned_vectors(block: s_tir.stmt.SBlock, vector: int) -> bool:
    """Whether every vector of ``vector`` consecutive values of ``block``'s innermost
    iterator is a whole aligned vector of every buffer access that moves with it: that
    iterator's extent divides into vectors, and at a multiple of ``vector`` each such access
    is at a multiple of ``vector`` elements of its buffer. TVM's CUDA code reads a vector it
    cannot prove aligned lane by lane, each thread on ``vector`` consecutive elements: a
    warp's load then spans ``vector`` times the cache lines it uses, where a scalar block
    keeps consecutive threads on consecutive elements. Booleans limit the lanes
    (``MAX_BOOLEAN_LANES``). In a spatial block, an access whose element moves with that
    iterator but is the same for every lane of a vector is a broadcast too (a group
    normalisation's scale, one channel per ``H x W`` elements of its row): its lanes read
    one element (``gathered_broadcasts``)."""
    if not block.iter_vars or not lanes_fit_booleans(block, vector):
        return False  # a block of no iterators computes one value: no vector moves
    frame = _LaneFrame.of(block, vector)
    if frame is None:
        return False
    spatial = spatial_block(block)
    for region in (*block.reads, *block.writes):
        moved = frame.at_vector(region)
        if moved is None or (spatial and frame.uniform(region)):
            continue
        found = frame.ana.modular_set(moved)
        if found.coeff % vector or found.base % vector:
            return False
    return True


MAX_GATHERED_LANES = 4
"""Most lanes of a read that ``gathered_broadcasts`` finds that TVM's CUDA code generator
prints right: it gathers eight lanes of float16 from an index vector of eight int32, and
prints both as four-element vectors built from eight arguments (``make_longlong4``,
``make_uint4``), which nvcc rejects (fuzz graph 12039:120: a maximum of (2, 96, 56, 56) and
a (1, 56, 1) broadcast along its rows)."""


def gathered_broadcasts(block: s_tir.stmt.SBlock, vector: int, flat: bool = False) -> bool:
    """Whether a spatial ``block`` reads an element that is the same for every lane of an
    aligned vector, but at an index that TVM's VectorizeLoop computes lane by lane, and so
    gathers: one that moves with its innermost iterator (``aligned_vectors``' broadcast: no
    simplification shows that the lanes' indices are equal), or, in a ``flat`` mapping (its
    iterators fused into one index, ``emit._map_flat``), one that moves with its other
    iterators only (a divide of the fused index, a row's scale)."""
    frame = _LaneFrame.of(block, vector) if block.iter_vars and spatial_block(block) else None
    if frame is None:
        return False
    outer = [iv.var for iv in block.iter_vars[:-1]]
    return any((frame.at_vector(r) is not None and frame.uniform(r))
               or (flat and frame.at_vector(r) is None
                   and any(uses(flat_index(r), v) for v in outer)) for r in block.reads)


class _LaneFrame:
    """The lanes of a vector of ``vector`` consecutive values of a block's innermost
    iterator: its value at a vector's first lane and at any lane, with an analyzer that
    knows the block's other iterators."""

    def __init__(self, block: s_tir.stmt.SBlock, vector: int) -> None:
        inner = block.iter_vars[-1]
        dtype = str(inner.var.ty.dtype)
        step, lane = tvm.ir.Var("vector_index", dtype), tvm.ir.Var("lane", dtype)
        self.inner = inner.var
        self.first = step * tirx.IntImm(dtype, vector)
        self.any = self.first + lane
        self.ana = Analyzer()
        for iv in block.iter_vars[:-1]:
            self.ana.bind(iv.var, iv.dom)
        self.ana.bind(step, tvm.ir.Range(0, int(inner.dom.extent) // vector))
        self.ana.bind(lane, tvm.ir.Range(0, vector))

    @classmethod
    def of(cls, block: s_tir.stmt.SBlock, vector: int) -> _LaneFrame | None:
        """The frame of ``block``'s vectors; None when its innermost iterator's extent does
        not divide into them."""
        extent = block.iter_vars[-1].dom.extent
        if not isinstance(extent, tirx.IntImm) or int(extent) % vector:
            return None
        return cls(block, vector)

    def at_vector(self, region: tvm.ir.TensorRegion) -> tvm.ir.PrimExpr | None:
        """The flat index of ``region`` at a vector's first lane; None where it does not
        move with the lanes (one element for all: a broadcast)."""
        index = flat_index(region)
        moved = substituted(index, self.inner, self.first)
        return None if moved.same_as(index) else moved

    def uniform(self, region: tvm.ir.TensorRegion) -> bool:
        """Whether ``region``'s flat index is the same at every lane of a vector."""
        index = flat_index(region)
        return self.ana.can_prove_equal(substituted(index, self.inner, self.any),
                                        substituted(index, self.inner, self.first))


MAX_BOOLEAN_LANES = 4
"""Most lanes of a vector with a boolean value in it (a comparison, a mask): TVM's CUDA code
generator has no type for eight booleans ("Cannot convert type T.boolx8"), so an eight-lane
float16 block that compares stays scalar (fuzz case g386)."""


def lanes_fit_booleans(block: s_tir.stmt.SBlock, vector: int) -> bool:
    """Whether ``block`` may run ``vector`` lanes at once: any number without a boolean
    value in it (computed or moved), at most ``MAX_BOOLEAN_LANES`` with one, and one when a
    boolean value is the same for every lane (a comparison of the row's maximum): TVM's CUDA
    code generator declares such a broadcast as a vector of the select's type
    (``float4 v = make_ushort4(...)``), which nvcc rejects (fuzz seed 2027, graph 85). The
    condition of an ``if_then_else`` that is the same for every lane of an aligned vector
    (``uniform_conditions``: emission states it once per vector) is no boolean lane, nor is
    one inside a selection that is the same for every lane as a whole (a scalar)."""
    if vector == 1:
        return True
    inner = block.iter_vars[-1].var if block.iter_vars else None
    uniform: list[tvm.ir.Expr] = []  # conditions stated once per vector (uniform_conditions)
    if inner is not None:
        tvm_ffi.structural_walk(block.body, [
            (tvm.ir.Call, lambda c: _uniform_parts(c, inner, vector, uniform)),
            (tirx.Select, lambda s: _scalar_parts(s, inner, uniform))])
    found: list[tvm.ir.Expr] = []
    tvm_ffi.structural_walk(block.body, [(tvm.ir.Expr, lambda e: found.append(e)
                                          if str(e.ty.dtype).startswith("bool")
                                          and not any(e.same_as(u) for u in uniform)
                                          else None)])
    if any(inner is None or not uses(e, inner) for e in found):
        return False
    if vector <= MAX_BOOLEAN_LANES:
        return True
    return not found and all(str(r.source.dtype) != "bool"
                             for r in (*block.reads, *block.writes))


def _uniform_parts(call: tvm.ir.Call, inner: tvm.ir.Var, vector: int,
                   out: list[tvm.ir.Expr]) -> None:
    """Add the condition of ``call`` (an ``if_then_else`` whose condition depends on
    ``inner`` and is the same for every lane) and every expression in it to ``out``."""
    if not call.op.same_as(IF_THEN_ELSE) or not uses(call.args[0], inner) \
            or not lane_uniform(call.args[0], inner, vector):
        return
    tvm_ffi.structural_walk(call.args[0], [(tvm.ir.Expr, out.append)])


def _scalar_parts(select: tirx.Select, inner: tvm.ir.Var, out: list[tvm.ir.Expr]) -> None:
    """Add every expression of ``select`` to ``out`` when none of it depends on ``inner``:
    TVM's VectorizeLoop computes it once, as a scalar (a gathered row's index, normalised
    for negative ids), and broadcasts only its value."""
    if not uses(select, inner):
        tvm_ffi.structural_walk(select, [(tvm.ir.Expr, out.append)])


def flat_index(region: tvm.ir.TensorRegion) -> tvm.ir.PrimExpr:
    """The element offset of a region's first element in its buffer's memory."""
    buffer = region.source
    strides = list(buffer.strides)
    if not strides:
        stride, strides = 1, []
        for dim in reversed(list(buffer.shape)):
            strides.insert(0, stride)
            stride = dim * stride
    index = buffer.elem_offset
    for r, stride in zip(region.region, strides, strict=True):
        index = index + r.min * stride
    return index


def spatial_block(block: s_tir.stmt.SBlock) -> bool:
    """Whether ``block`` reduces over nothing: only such blocks take vectors (a reduction
    reads scalars, consecutive threads on consecutive elements)."""
    return all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in block.iter_vars)


HALF_MATH_CALLS = 2
"""Transcendental calls on float16 values (``half_math_calls``) from which a row group takes
at most ``decisions.flat.HELD_LANES`` halves per access, and holds no input in registers: a
LayerNorm over rows of 4112 halves on 1024 threads (64 registers), its input's ``hlog`` and
sigmoid (``hexp``, a division) as two more outputs, spilled 40 B on sm_80 in vectors of 8
and took 40 registers in vectors of 4; either call alone did not spill (fuzz graph
5150:1007). nvcc leaves the walks over a held copy rolled when their bodies compute such
calls, and the copy then goes to a stack frame (a softmax of ``exp(tanh(x))`` over a row of
30000 halves in one block, 30 held per thread: 112 B, fuzz graph 8111:1241)."""


def half_math_calls(sch: s_tir.Schedule, blocks: list[SBlockRV]) -> int:
    """Calls of transcendental functions (``graph.ops.EXPENSIVE_CALLS``) on float16 values
    in the spatial blocks among ``blocks``: CUDA computes each lane of ``hexp``, ``hlog`` and
    their kind through float32 in several instructions, and a vector's lanes interleave."""
    calls: list[tvm.ir.Call] = []
    for rv in blocks:
        block = sch.get(rv)
        if spatial_block(block):
            tvm_ffi.structural_walk(block.body, [(tvm.ir.Call, calls.append)])
    return sum(1 for c in calls if isinstance(c.op, tvm.ir.Op) and c.op.name in EXPENSIVE_CALLS
               and str(c.ty.dtype) == "float16")


def scalar_blocks(sch: s_tir.Schedule, blocks: list[SBlockRV], vector: int
                  ) -> tuple[str, ...]:
    """The names of the spatial blocks among ``blocks`` (in the form the mapping sees,
    ``emit.rewritten``) that cannot take ``vector`` lanes (``aligned_vectors``): the plan
    keeps them scalar."""
    if vector == 1:
        return ()
    found: list[str] = []
    for rv in blocks:
        block = sch.get(rv)
        if spatial_block(block) and not aligned_vectors(block, vector) \
                and block.name_hint not in found:
            found.append(block.name_hint)
    return tuple(found)


def vector_reads(sch: s_tir.Schedule, blocks: list[SBlockRV], vector: int
                 ) -> tuple[str, ...]:
    """The names of the reduction blocks among ``blocks`` that can read their global inputs
    ``vector`` elements at a time: they read one at least, and every access moves with the
    reduced (innermost) iterator in whole aligned vectors (``aligned_vectors``)."""
    found: list[str] = []
    for rv in blocks:
        block = sch.get(rv)
        if vector == 1 or spatial_block(block) or block.name_hint in found:
            continue
        if any(r.source.scope() == "global" for r in block.reads) \
                and aligned_vectors(block, vector):
            found.append(block.name_hint)
    return tuple(found)


def lane_blocks(sch: s_tir.Schedule, blocks: list[SBlockRV], vector: int,
                flat: bool = False) -> tuple[str, ...]:
    """The names of the spatial blocks among ``blocks`` that take ``vector`` lanes
    (``aligned_vectors``, ``lanes_fit_booleans``) and access global memory, but whose lanes
    TVM's code would not compute as one vector: they call an intrinsic that TVM's
    VectorizeLoop has no vector form of (no ``TVectorizable``: ``erf``, ``rsqrt``,
    ``log1p``) on a value that differs between lanes, so VectorizeLoop runs their lanes one
    by one, every load and store a scalar (bias + GELU stored a thread's four floats with
    four instructions, each a quarter of a cache line per warp); or they compute values
    wider than a vector of ``VECTOR_BYTES`` holds (a float16 LayerNorm of eight lanes that
    normalises in float32: TVM's CUDA code generator prints eight floats as a
    ``make_ulonglong4`` that nvcc rejects), or gather more than ``MAX_GATHERED_LANES``
    lanes of a broadcast (``gathered_broadcasts``; ``flat``: the mapping fuses the blocks'
    iterators). The plan has them compute their lanes into registers one by one and move
    their data in whole vectors."""
    if vector == 1:
        return ()
    found: list[str] = []
    for rv in blocks:
        block = sch.get(rv)
        if block.name_hint in found or not spatial_block(block) \
                or not aligned_vectors(block, vector) or not lanes_fit_booleans(block, vector):
            continue
        if any(r.source.scope() == "global" for r in (*block.reads, *block.writes)) \
                and (_lane_by_lane(block) or computed_bytes(block) * vector > VECTOR_BYTES
                     or (vector > MAX_GATHERED_LANES
                         and gathered_broadcasts(block, vector, flat))):
            found.append(block.name_hint)
    return tuple(found)


def computed_bytes(block: s_tir.stmt.SBlock) -> int:
    """Bytes of the widest value ``block`` moves with its lanes or computes (floating-point
    casts inside it included, not the index casts of its accesses). A value read at the same
    place for every lane (a row's int64 token id, a row's mean) is a scalar of the thread,
    not a vector: where it joins the lanes' values, a cast does."""
    regions = moving_regions(block) if block.iter_vars else [*block.reads, *block.writes]
    casts: list[tirx.Cast] = []
    tvm_ffi.structural_walk(block.body, [(tirx.Cast, casts.append)])
    return max([_bytes(r.source.dtype) for r in (*regions, *block.writes)]
               + [_bytes(c.ty.dtype) for c in casts
                  if str(c.ty.dtype).startswith(("float", "bfloat"))])


def moving_regions(block: s_tir.stmt.SBlock) -> list[tvm.ir.TensorRegion]:
    """The accesses of ``block`` whose element moves with its innermost iterator: those a
    block computed lane by lane loads or stores in vectors."""
    inner = block.iter_vars[-1].var
    return [r for r in (*block.reads, *block.writes)
            if any(uses(d.min, inner) for d in r.region)]


def _bytes(dtype: tvm.DataType) -> int:
    return max(dtype.bits * dtype.lanes // 8, 1)


def _lane_by_lane(block: s_tir.stmt.SBlock) -> bool:
    """Whether ``block`` calls an intrinsic without a vector form on its lanes' values."""
    inner = block.iter_vars[-1].var
    calls: list[tvm.ir.Call] = []
    tvm_ffi.structural_walk(block.body, [(tvm.ir.Call, calls.append)])
    return any(isinstance(c.op, tvm.ir.Op) and c.op.get_attr("cuda.FLowerIntrinsic") is not None
               and not c.op.get_attr("TVectorizable") and uses(c, inner) for c in calls)
