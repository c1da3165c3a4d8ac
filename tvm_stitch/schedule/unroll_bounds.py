"""Emission of the plan's unroll bounds (``Group.unrolled``): each named block's loop over a
thread's elements (its serial loop inside the thread binding) is split into runs of the
bound's elements, unrolled, inside a loop nvcc must not unroll (TVM's ``disable_unroll``
annotation, printed as ``#pragma unroll 1`` on the loop itself; a ``pragma_unroll``
annotation becomes a statement of its own, before which TVM may insert a barrier, and then
binds nothing)."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV

from ..plan import Unrolled

NOT_UNROLLED = "disable_unroll"


def bound_unrolling(sch: s_tir.Schedule, unrolled: tuple[Unrolled, ...]) -> None:
    """Split the element loop of every block of ``unrolled`` (mapped: inside a loop bound to
    a thread, then the loop of its steps, then its vector's lanes if it has them, vectorised
    or, for a block computed lane by lane, unrolled: ``lanes.register_lanes``) into a
    rolled loop over unrolled runs of the bound's ``steps * lanes`` elements; a block the
    plan keeps scalar takes them one a step (the last run guarded where they do not divide
    its steps). A loop no longer than a run is left as it is; asserts a block has at most
    one loop to split."""
    for bound in unrolled:
        loops = sch.get_loops(sch.get_sblock(bound.block))
        bound_at = [i for i, loop in enumerate(loops)
                    if sch.get(loop).kind == tirx.ForKind.THREAD_BINDING]
        assert bound_at, f"{bound.block} is not mapped to threads"
        inner = loops[bound_at[-1] + 1:]
        lanes = int(sch.get(inner[-1]).extent) if sch.get(inner[-1]).kind in (
            tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED) else 1  # lane by lane: unrolled
        run = bound.steps * bound.lanes // lanes
        longer = [loop for loop in inner if sch.get(loop).kind == tirx.ForKind.SERIAL
                  and isinstance(sch.get(loop).extent, tirx.IntImm)
                  and int(sch.get(loop).extent) > run]
        assert run >= 1 and len(longer) <= 1, f"{bound.block}: element loops {longer}, {bound}"
        if not longer:  # no longer than a run (a scalar block walking fewer elements)
            continue
        sch.unroll(_roll_runs(sch, longer[0], run))


def bound_row_walk(sch: s_tir.Schedule, walk: LoopRV, rows: int) -> None:
    """Split a Global tile's walk over its rows (``walk``) into runs of the plan's ``rows``
    (``Group.walk_unrolled``) inside a loop nvcc must not unroll; each run is left to nvcc,
    which unrolls a short static loop whole; a walk of one run at most is left whole (a
    phase's tasks of fewer rows, ``Phase.row_steps``). Asserts the runs divide a longer
    walk."""
    extent = sch.get(walk).extent
    assert isinstance(extent, tirx.IntImm), (extent, rows)
    if int(extent) > rows:
        assert int(extent) % rows == 0, (extent, rows)
        _roll_runs(sch, walk, rows)


def _roll_runs(sch: s_tir.Schedule, loop: LoopRV, run: int) -> LoopRV:
    """Split ``loop`` into runs of ``run`` steps inside a loop marked not to be unrolled;
    returns the loop of a run's steps."""
    rolled, steps = sch.split(loop, [None, run])
    sch.annotate(rolled, NOT_UNROLLED, 1)
    return steps


__all__ = ["NOT_UNROLLED", "bound_row_walk", "bound_unrolling"]
