"""Blocks computed lane by lane (``vectors.lane_blocks``): their lanes are computed into a
register vector of the thread, one lane at a time, and their data moves between it and
global or shared memory as whole vectors.

TVM's VectorizeLoop turns a vectorised loop whose body calls an intrinsic without a vector
form (``erf``) into a serial loop over the lanes, loads and stores included: a warp's store
then writes a quarter of each cache line it touches, four times; and it types the float32
values of an eight-lane float16 block as eight-float vectors that TVM's CUDA code cannot
build. Here the block reads its inputs from register copies loaded a vector at a time and
writes its outputs into a register vector stored at once; only the arithmetic runs lane by
lane (as a GPU runs it anyway: it has no float32 vector arithmetic).
"""

from __future__ import annotations

from math import prod

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..transform.expressions import uses
from .blocks import LOCAL, SHARED, name_of


def register_lanes(sch: s_tir.Schedule, names: tuple[str, ...], vector: int) -> None:
    """Give each block of ``names`` (mapped: its innermost loop the vectorised lanes) a
    register vector for every global buffer it writes, stored a vector at a time, and one for
    every global or shared buffer whose reads all move with its lanes, loaded a vector at a
    time; its lanes then run one by one (unrolled). Asserts that each copy moves exactly
    one vector of the thread."""
    for name in names:
        block = sch.get_sblock(name)
        loops = sch.get_loops(block)
        lanes = sch.get(loops[-1])
        assert lanes.kind == tirx.ForKind.VECTORIZED and int(lanes.extent) == vector, name
        at = loops[-2]
        written = [i for i, w in enumerate(sch.get(block).writes)
                   if w.source.scope() == "global"]
        for index in written:
            copy = sch.cache_write(block, index, LOCAL)
            sch.reverse_compute_at(copy, at, preserve_unit_loops=True)
            _vectorise_copy(sch, copy, at, vector)
            local = sch.get(block).writes[index].source
            sch.transform_layout(block, ("write", index), lane_map(local, vector),
                                 assume_injective_transform=True)
        for buffer in _moving_inputs(sch.get(block)):
            if not _one_vector(sch, name, buffer, vector):
                continue
            index = next(i for i, r in enumerate(sch.get(block).reads)
                         if r.source.same_as(buffer))
            # this block's copy only: another block may read the buffer elsewhere
            copy = sch.cache_read(block, index, LOCAL, consumer_blocks=[block])
            sch.compute_at(copy, at, preserve_unit_loops=True)
            _vectorise_copy(sch, copy, at, vector)
            local = sch.get(copy).writes[0].source
            sch.transform_layout(copy, ("write", 0), lane_map(local, vector),
                                 assume_injective_transform=True)
        # one lane at a time, never a vector TVM would type wider than its lanes allow
        sch.unroll(sch.get_loops(block)[-1])


def _moving_inputs(block: s_tir.stmt.SBlock) -> list[tirx.Buffer]:
    """The global and shared buffers ``block`` reads only at places that move with its
    lanes (each read one element, a different one in every lane): a copy of one vector
    holds them."""
    inner = block.iter_vars[-1].var
    found: dict[str, tirx.Buffer] = {}
    moving: dict[str, bool] = {}
    for region in block.reads:
        buffer = region.source
        if buffer.scope() not in ("global", SHARED):
            continue
        found[buffer.name] = buffer
        if not region.region:  # a scalar: the same value in every lane
            moving[buffer.name] = False
            continue
        # a region of several reads (x[r, c] and x[r, 0]) spans more than one lane's element;
        # a read of a flat index's row (x[f // 16, f % 16]) moves with the lanes too where
        # an aligned vector stays in one row (``_one_vector`` checks the copy)
        moves = all(isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1
                    for r in region.region) and uses(region.region[-1].min, inner)
        moving[buffer.name] = moving.get(buffer.name, True) and moves
    return [found[n] for n, ok in moving.items() if ok]


def _one_vector(sch: s_tir.Schedule, name: str, buffer: tirx.Buffer, vector: int) -> bool:
    """Whether the copy of ``buffer`` that block ``name`` reads at the thread's vector
    holds exactly one vector: an index that names the lane variable but takes one value
    over an aligned vector (a scale per 64 elements, ``(f // 64) % 2`` of a flat row index
    ``f``, fuzz graph 3301:723) is no moving input; each lane then reads its one element
    (the same word) itself. Tried on a copy of the schedule."""
    trial = sch.copy()
    block = trial.get_sblock(name)
    at = trial.get_loops(block)[-2]
    index = next(i for i, r in enumerate(trial.get(block).reads) if r.source.same_as(buffer))
    copy = trial.cache_read(block, index, LOCAL, consumer_blocks=[block])
    trial.compute_at(copy, at, preserve_unit_loops=True)
    loops = trial.get_loops(copy)
    above = trial.get(at)
    inner = loops[next(i for i, loop in enumerate(loops) if trial.get(loop).same_as(above)) + 1:]
    extents = [trial.get(loop).extent for loop in inner]
    return all(isinstance(e, tirx.IntImm) for e in extents) \
        and prod(int(e) for e in extents) == vector


def _vectorise_copy(sch: s_tir.Schedule, copy: SBlockRV, at: LoopRV, vector: int) -> None:
    """Vectorise the loops of ``copy`` under ``at`` (fused into one), asserted to move one
    vector."""
    loops = sch.get_loops(copy)
    above = sch.get(at)
    inner = loops[next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(above)) + 1:]
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    extent = sch.get(fused).extent
    assert isinstance(extent, tirx.IntImm) and int(extent) == vector, \
        (name_of(sch, copy), extent, vector)
    sch.vectorize(fused)


def lane_map(buffer: tirx.Buffer, vector: int) -> tirx.IndexMap:
    """``buffer``'s indices to the lane of their flattened offset in a ``vector``."""
    shape = list(buffer.shape)

    def lane(*indices: tvm.ir.PrimExpr) -> list[tvm.ir.PrimExpr]:
        flat = indices[0]
        for i, dim in zip(indices[1:], shape[1:], strict=True):
            flat = flat * dim + i
        return [flat % vector]

    return tirx.IndexMap.from_func(lane, ndim=len(shape), index_dtype=str(shape[0].ty.dtype))
