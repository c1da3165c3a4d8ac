"""Decide how a fused group becomes one kernel: Local vs Regional per block, staging, mapping,
shared-memory budget.

Works on the fused PrimFunc of a group (FuseTIR's output), block by block:

- an output that is also read inside the kernel gets a shared copy for its readers;
- a spatial block whose result is read once, at one position, by one block is inlined
  (Local: computed in registers by its consumer); so is a block producing one value per row;
- any other intermediate is Regional: kept in shared memory for the thread block's rows;
  a reduction result stays in registers: TVM's cross-thread reduction leaves it with every
  thread of the row (a warp shuffle, or its shared staging slot after a barrier), so no
  thread reads a copy another thread wrote without a barrier between them;
- an input read at several places inside the row is staged in shared memory (read from
  global memory once); inputs read from other rows or by data-dependent indices are not;
- an input that runs of consecutive rows read alike (a bias, a scale, the mask row of a
  batch) is staged once per thread block, and each block then walks several rows in
  sequence (vertical packing) so that it is read once per block rather than once per row;
- then the thread mapping, and the shared-memory budget: over it, inputs staged per row are
  demoted (largest first) to registers, each thread holding the elements of the row it
  reads (``REGISTER_ROW_ELEMENTS`` at most), else to re-reads from global memory; then
  inputs staged per block are demoted, then
  packed rows are halved, then Regional intermediates are recomputed (inlined) instead; if it
  still does not fit, the group falls back with the reason.

One module per kind of group and per concern: ``flat`` (element-wise), ``rows`` (row
groups: inlining, staging, vertical packing, the register cache), ``split`` (task
splitting), ``global_stitch`` (column reductions on a persistent grid), ``tiles`` (its row
and column tiles), ``budget`` (demotions to fit shared memory) and ``state`` (what they
collect, and shared sizes). This module picks the kind and checks the result by building it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from tvm import s_tir, tirx
from tvm.target import Target

from ...analysis.report import global_bytes, lowered_reports
from ...analysis.roofline import GPU, TIME_MARGIN, kernel_time_us
from ...analysis.traffic import AnalysisError
from ...lowering import LoweredFunc, lower
from ...plan import BufferRole, Choices, Group, MappingKind, StorageLevel
from ...symbolic import declared_bounds, is_symbolic, yardstick_sizes
from ...target import MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK
from ...transform.online_softmax import find_online_pairs
from ...transform.online_variance import find_variance_triples
from ..blocks import (
    LOCAL,
    SHARED,
    add_unit_loops,
    cache_reused_outputs,
    child_blocks,
    name_of,
    prepare,
    prepare_one_pass,
    split_sinks,
)
from ..emit import kernel, rewritten
from ..occupancy import device_of, kernel_shared_bytes, max_registers, with_blocks_per_sm
from ..phases import column_reductions
from ..row_permutation import keepable_transposes, permute_rows
from ..rows import Unstitchable, error_summary
from ..rows_first import rows_first
from ..vectors import lane_blocks, scalar_blocks, vector_reads
from . import memo
from .flat import decide_flat
from .global_stitch import decide_global
from .row_walk import decide_row_walk, walk_rows
from .rows import decide_rows
from .split import split_candidates
from .state import launch_of
from .tiles import SMALL_GLOBAL_ELEMENTS

logger = logging.getLogger(__name__)

T = TypeVar("T")


def target_budget(target: Target | None) -> tuple[int, int]:
    """Shared-memory bytes and threads one block may use on ``target``."""
    if target is None:
        return MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK
    attrs = target.attrs
    smem = int(attrs.get("max_shared_memory_per_block", MAX_SHARED_MEMORY_PER_BLOCK))
    threads = int(attrs.get("max_num_threads", attrs.get("max_threads_per_block",
                                                          MAX_THREADS_PER_BLOCK)))
    return smem, threads


@dataclass(frozen=True)
class Decided:
    """A group with its kernel decisions, its scheduled kernel, and that kernel lowered for
    the target (None when decided without one)."""

    group: Group
    scheduled: tirx.PrimFunc
    lowered: LoweredFunc | None


def decide(func: tirx.PrimFunc, group: Group, rows: int | None,
           target: Target | None = None, choices: Choices | None = None) -> Decided:
    """``group`` completed with its kernel decisions for ``func``; raises Unstitchable.

    ``choices`` fixes what it names (``plan.Choices``), the rules decide the rest; an
    illegal choice raises Unstitchable. The decisions are checked by scheduling ``func``
    with them once (``kernel``) and, given a target, building it; the launch configuration
    is settled against the shared memory the built kernel really declares.

    A row group with a softmax's maximum and sum of exponentials (``find_online_pairs``)
    takes them as one online reduction when ``choices`` say so; left to the rules, when the
    two-pass kernel does not build, or when one of its bodies reads an input from global
    memory again and the online kernel moves no more bytes at any size counted and fewer at
    one (counted from the built kernels): on chip, the two passes take two exponentials per
    element, the online reduction and its output pass three. Rows split over several blocks
    take it too when it moves no more bytes: its partial pairs are combined after one grid
    barrier, where the two passes need two (a maximum, then a sum of exponentials).
    Likewise a sum and the sum of squares about its mean (a variance's,
    ``find_variance_triples``) as one online variance, over rows or columns; and either
    kind when the one-pass kernel takes fewer grid barriers and is estimated faster for it,
    though it moves a few more bytes (the partial means and counts beside the squares, which
    stay in L2).

    Few long rows are split over several blocks (``split.split_candidates``): of the first
    split that builds at each block size, the one the roofline estimates fastest from its
    counted traffic (the first on a tie), so that a block size whose sub-rows stay on chip
    across the grid barriers wins over one that reads them again in each phase; unless a
    block per row is counted with ``SPLIT_EXTRA_BYTES`` fewer bytes (a split that reads its
    row once per phase).

    A kernel that the rules' vectors make unbuildable (lowering fails) is decided again in
    scalar accesses, unless ``choices`` fix the vector.

    Within ``memo.remembering``, a function and group decided before get the same decisions
    at once (identical layers, the stitch pass's rounds); their ``scheduled`` and ``lowered``
    kernels are the first's, the same TIR.
    """
    choices = choices or Choices()
    key = memo.key_of(func, group, rows, target, choices)
    known = memo.recalled(key, group)
    if known is not None:
        return known
    return memo.remember(key, _decide_vectors(func, group, rows, target, choices))


def _decide_vectors(func: tirx.PrimFunc, group: Group, rows: int | None,
                    target: Target | None, choices: Choices) -> Decided:
    """``decide``, in scalar accesses where the rules' vectors do not build."""
    try:
        return _decide_pairs(func, group, rows, target, choices)
    except Unstitchable as err:
        # Vectors on a row of threads with one element each for some (rows too few to fill
        # the GPU get a thread per element): 16 rows of 8 on 8 threads in vectors of 4 ran
        # its element-wise blocks under a per-thread condition, and TVM could not place the
        # barrier after a staged intermediate outside it (fuzz graph 2612:294)
        if choices.vector is not None or not isinstance(err, LoweringFailed):
            raise
        logger.debug("%s does not build in vectors, tried in scalars: %s", group.ops,
                     error_summary(err))
        try:
            return _decide_pairs(func, group, rows, target, replace(choices, vector=1))
        except Unstitchable:
            raise err from None


@dataclass(frozen=True)
class OnePass:
    """The reduction pairs a kernel takes in one pass: the maximum blocks of online softmaxes
    (``transform.online_softmax``) and the sum blocks of online variances
    (``transform.online_variance``)."""

    softmax: tuple[str, ...] = ()
    variance: tuple[str, ...] = ()


def _decide_pairs(func: tirx.PrimFunc, group: Group, rows: int | None, target: Target | None,
                  choices: Choices) -> Decided:
    """``decide`` with ``choices`` as they are: each kind of one-pass reduction where it is
    chosen, else the rules' pick between two passes and one."""
    prepared = prepare(func) if rows is not None else None
    pairs = tuple(dict.fromkeys(p.maximum for p in find_online_pairs(prepared))) \
        if prepared is not None else ()
    triples = tuple(t.total for t in find_variance_triples(prepared)) \
        if prepared is not None else ()
    for chosen, found, what in ((choices.online_softmax, pairs,
                                 "maximum and sum of exponentials"),
                                (choices.online_variance, triples,
                                 "sum and sum of squares about its mean")):
        if chosen and not found:
            raise Unstitchable(f"no {what} to take as one online reduction")
    fixed = OnePass(pairs if choices.online_softmax else (),
                    triples if choices.online_variance else ())
    most = OnePass(pairs if choices.online_softmax is not False else (),
                   triples if choices.online_variance is not False else ())
    if fixed == most:
        return _decide(func, group, rows, target, choices, fixed)
    return _two_pass_or_online(func, group, rows, target, choices, fixed, most)


def _two_pass_or_online(func: tirx.PrimFunc, group: Group, rows: int, target: Target | None,
                        choices: Choices, fewest: OnePass, most: OnePass) -> Decided:
    """The rules' pick between the kernel with the ``fewest`` one-pass reductions (two
    passes) and the one with the ``most`` (``decide``)."""
    try:
        two_pass = _decide(func, group, rows, target, choices, fewest)
    except Unstitchable as err:
        try:
            return _decide(func, group, rows, target, choices, most)
        except Unstitchable:
            raise err from None
    bodies = [two_pass.group, *filter(None, [two_pass.group.beyond_bound])]
    if not two_pass.group.row_split and not any(
            b.role is BufferRole.INPUT and b.level is StorageLevel.GLOBAL
            for body in bodies for b in body.buffers):
        return two_pass
    try:
        online = _decide(func, group, rows, target, choices, most)
    except Unstitchable:
        return two_pass
    sizes = _counted_sizes(func, two_pass)
    counts = _byte_counts(online, two_pass, func)
    fewer_barriers = online.group.row_split == two_pass.group.row_split \
        and len(online.group.phases) < len(two_pass.group.phases)
    if _no_more(counts) and (fewer_barriers or any(o < t for o, t in counts)):
        return online
    if not fewer_barriers:
        return two_pass
    gpu = device_of(target)
    try:
        times = [(_estimate_us(online, gpu, at), _estimate_us(two_pass, gpu, at))
                 for at in sizes]
    except AnalysisError:
        return two_pass
    return online if times and all(o < t for o, t in times) else two_pass


def _byte_counts(one: Decided, other: Decided, func: tirx.PrimFunc
                 ) -> list[tuple[int | None, int | None]]:
    """The global bytes the kernels ``one`` and ``other`` (of ``func``) move at each size
    counted (``_counted_sizes``)."""
    return [(global_bytes(one.lowered, sizes=at), global_bytes(other.lowered, sizes=at))
            for at in _counted_sizes(func, other)]


def _no_more(counts: list[tuple[int | None, int | None]]) -> bool:
    """Whether every pair of ``counts`` is counted, the first no more than the second."""
    return all(o is not None and t is not None and o <= t for o, t in counts)


def _counted_sizes(func: tirx.PrimFunc, decided: Decided) -> list[dict[str, int]]:
    """The sizes of ``func``'s symbolic dimensions to compare kernels at: the yardstick's,
    and for a kernel with a second body beyond declared bounds, the bounded ones one past
    their bounds; none when not built for a target."""
    if decided.lowered is None:
        return []
    sizes = yardstick_sizes(func)
    bounds = declared_bounds(func.attrs)
    beyond = [{n: bounds[n] + 1 if n in bounds else v for n, v in sizes.items()}] \
        if decided.group.beyond_bound is not None and bounds else []
    return [sizes, *beyond]


def _decide(func: tirx.PrimFunc, group: Group, rows: int | None, target: Target | None,
            choices: Choices, online: OnePass) -> Decided:
    """``decide`` with the reduction pairs ``online`` taken in one pass and the transposing
    copies of inputs (``row_permutation``) kept as blocks as ``choices.kept_transposes``
    says; left to the rules, those that move their input's innermost axis are kept, or
    inlined where that does not stitch, and the others kept too where that builds and moves
    fewer bytes (a batch norm's channel rows of (32, 2048, 7, 7) staged once: 38.6 MB ->
    25.7 MB; rows of (32, 64, 56, 56) do not fit on chip, and kept they would be read three
    times)."""
    prepared = prepare_one_pass(func, online.softmax, online.variance)
    moving, others = keepable_transposes(rows_first(prepared, rows), rows,
                                         target_budget(target)[0]) \
        if rows is not None else ((), ())
    if choices.kept_transposes is not None:
        keep = moving + others if choices.kept_transposes else ()
        return _decide_moves(func, prepared, group, rows, target, choices, online, keep)
    try:
        decided = _decide_moves(func, prepared, group, rows, target, choices, online, moving)
    except Unstitchable as err:
        if not moving:
            raise
        logger.debug("%s with its transposes kept does not stitch: %s", group.ops,
                     error_summary(err))
        decided = _decide_moves(func, prepared, group, rows, target, choices, online, ())
    if not others or target is None:
        return decided
    try:
        kept = _decide_moves(func, prepared, group, rows, target, choices, online, moving + others)
    except Unstitchable as err:
        logger.debug("%s with every transpose kept does not stitch: %s", group.ops,
                     error_summary(err))
        return decided
    counts = _byte_counts(kept, decided, func)
    return kept if counts and _no_more(counts) and any(o < t for o, t in counts) else decided


def _decide_moves(func: tirx.PrimFunc, prepared: tirx.PrimFunc, group: Group,
                  rows: int | None, target: Target | None, choices: Choices, online: OnePass,
                  keep: tuple[str, ...]) -> Decided:
    """``_decide`` with the transposing copies of inputs ``keep`` kept as blocks;
    ``prepared`` is ``func`` as ``prepare_one_pass`` makes it for ``online``."""
    group = replace(group, choices=choices, online=online.softmax,
                    online_variance=online.variance)
    budget, max_threads = target_budget(target)
    gpu = device_of(target)
    fused, func = func, prepared
    if rows is not None:
        func, moves = permute_rows(rows_first(func, rows), keep)
        group = replace(group, permuted_copies=moves.copies, permuted_outputs=moves.outputs,
                        transposed_copies=moves.kept)
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    _check_flat_structure(sch)
    if rows is None:
        done = _element_wise(func, sch, group, max_threads, gpu)
    elif column_reductions(sch, rows):
        return _even_or_ragged(fused, func, group, rows, target, budget, max_threads, gpu)
    else:
        failure, built, estimates = None, [], {}
        for split in split_candidates(func, group, rows, budget, max_threads, gpu):
            threads = split.mapping.threads_per_block
            if any(b.group.mapping.threads_per_block == threads for b in built):
                continue  # the first that builds at each block size
            try:
                decided = _built(fused, split, target, gpu)
                if target is not None:  # a kernel whose traffic cannot be counted is not one
                    estimates[threads] = _estimate_us(decided, gpu)
            except (Unstitchable, ValueError, AnalysisError) as err:  # the next, or a block
                failure = err                                         # per row
                logger.debug("task splitting of %s does not build: %s", group.ops,
                             error_summary(err))
                continue
            built.append(decided)
            if target is None:  # nothing to count: the first that builds
                return built[0]
        if failure is not None and choices.split_parts and not built:
            raise Unstitchable(f"task splitting in {choices.split_parts} parts does not "
                               f"build: {error_summary(failure)}") from failure
        if (choices.split_parts or 1) > 1 and not built:
            raise Unstitchable(f"the rows cannot be split in {choices.split_parts} parts")
        if (choices.cluster or 1) > 1 and not built:
            raise Unstitchable(f"no task splitting for clusters of {choices.cluster} blocks")
        if built:
            best = min(built, key=lambda d: estimates[d.group.mapping.threads_per_block])
            if choices.split_parts is not None or choices.cluster:
                return best
            try:  # a block per row where the split would read more (an input per phase)
                per_row = _built(fused, _block_per_row(func, sch, group, rows, budget,
                                                       max_threads, gpu), target, gpu)
            except (Unstitchable, ValueError) as err:
                logger.debug("no block per row for %s: %s", group.ops, error_summary(err))
                return best
            fewer = _fewer_bytes(per_row, best, SPLIT_EXTRA_BYTES)
            if fewer and target is not None and _estimate_us(per_row, gpu) \
                    > SPLIT_FASTER * estimates[best.group.mapping.threads_per_block]:
                logger.debug("split of %s kept: a block per row moves fewer bytes but is "
                             "estimated slower", group.ops)
                fewer = False
            return per_row if fewer else best
        done = _block_per_row(func, sch, group, rows, budget, max_threads, gpu)
    return _built(fused, done, target, gpu)


def _even_or_ragged(fused: tirx.PrimFunc, func: tirx.PrimFunc, group: Group, rows: int,
                    target: Target | None, budget: int, max_threads: int, gpu: GPU) -> Decided:
    """A Global group's kernel in row tiles that divide its rows, or in ragged ones
    (``tiles.ragged_tiles``: the last tile short) where its choices say so; left to the
    rules, where the even kernel does not build or is estimated slower. Rows no divisor
    splits into about a wave (ViT's 197 tokens) otherwise take one long tile, or a tile per
    row and a partial sum per row and column: a LayerNorm backward's dgamma and dbeta over
    (197, 768) fell back that way (3 kernels, 3.6 MB); in 22 tiles of 9 rows, the last 8,
    it is one kernel of 2.4 MB. An estimate no slower and fewer bytes takes the ragged too
    (a softmax down the 257 rows of (257, 2), both at the launch floor: 7.6 KB, not the
    17.5 KB of 257 one-row tiles; fuzz graph 12041:277), and so does an estimate within
    ``TIME_MARGIN`` where the row phases walk at most ``tiles.SMALL_GLOBAL_ELEMENTS``
    elements: too little work for the parallelism to matter, and the one-row tiles a prime
    row count gets under the register cap move two to three times the bytes of TVM's
    fusion (fuzz 12044:80, a log-softmax down (257, 3): 43.2 KB, ragged 27.1 KB, TVM's
    27.8 KB; estimated 6.6 and 7.1 us)."""
    def built(ragged: bool) -> Decided:
        sch = s_tir.Schedule(func)
        add_unit_loops(sch)
        return _built(fused, decide_global(sch, func, group, rows, budget, max_threads, gpu,
                                           ragged=ragged), target, gpu)

    if group.choices.ragged_tiles is not None:
        return built(group.choices.ragged_tiles)
    try:
        even = built(False)
    except Unstitchable as err:
        try:
            return built(True)
        except Unstitchable:
            raise err from None
    if target is None or is_symbolic(rows):
        return even
    try:
        ragged = built(True)
        ragged_us, even_us = _estimate_us(ragged, gpu), _estimate_us(even, gpu)
    except (Unstitchable, ValueError, AnalysisError) as err:
        logger.debug("no ragged row tiles for %s: %s", group.ops, error_summary(err))
        return even
    counts = _byte_counts(ragged, even, func)
    fewer = _no_more(counts) and any(r < e for r, e in counts)
    mapping = even.group.mapping
    margin = TIME_MARGIN if rows * mapping.row_length <= SMALL_GLOBAL_ELEMENTS else 1.0
    return ragged if ragged_us < even_us or (ragged_us <= margin * even_us and fewer) \
        else even


def _block_per_row(func: tirx.PrimFunc, sch: s_tir.Schedule, group: Group, rows: int,
                   budget: int, max_threads: int, gpu: GPU) -> Group:
    """A row group's rows mapped a block (or less) each, on ``sch`` (``func`` scheduled)."""
    reused = cache_reused_outputs(sch, func, SHARED)
    done = decide_rows(sch, func, group, rows, reused, budget, max_threads, gpu)
    if done.mapping.length_bound:
        done = _beyond_bound(func, done, rows, budget, max_threads, gpu)
    return done


SPLIT_EXTRA_BYTES = 0.1
"""A split row group gives way to a block per row that is counted with at least this
fraction fewer bytes: one that reads an input again in a later phase, not one that only adds
its partials (a few KB)."""


SPLIT_FASTER = 2.0
"""A block per row that moves fewer bytes still gives way to a split estimated this many times
faster (few rows on few SMs: two rows of 30000 on two blocks of 1024 threads, 20.7 us, where
the split reading an input in each phase takes 5.6 us, and kept 30 elements of it per thread
in registers, beside its element-wise ops, and spilled 424 B; fuzz graph 3301:327)."""


def _fewer_bytes(a: Decided, b: Decided, margin: float) -> bool:
    """Whether built kernel ``a`` is counted with fewer global bytes than ``b`` by at least
    the fraction ``margin`` of ``b``'s."""
    counted_a, counted_b = global_bytes(a.lowered), global_bytes(b.lowered)
    return counted_a is not None and counted_b is not None \
        and counted_a < (1 - margin) * counted_b


def _estimate_us(decided: Decided, gpu: GPU, sizes: dict[str, int] | None = None) -> float:
    """The roofline estimate of a built kernel: its counted traffic on ``gpu``, symbolic
    dimensions at ``sizes``."""
    return sum(kernel_time_us(gpu, r.work)
               for r in lowered_reports(decided.lowered, shape_vars=sizes))


def _element_wise(func: tirx.PrimFunc, sch: s_tir.Schedule, group: Group, max_threads: int,
                  gpu: GPU) -> Group:
    """An element-wise group walking its rows (``row_walk``) when its choices ask for it, or
    leave it to the rules and some input is read alike by runs of rows; else flat."""
    walk = group.choices.walk_rows
    if walk is not False:
        walking = s_tir.Schedule(func)
        add_unit_loops(walking)
        try:
            rows = walk_rows(func, walking)
            reused = cache_reused_outputs(walking, func, LOCAL)
            return decide_row_walk(walking, func, group, rows, reused, max_threads, gpu)
        except Unstitchable:
            if walk:
                raise
    reused = cache_reused_outputs(sch, func, LOCAL)
    return decide_flat(sch, func, group, reused, max_threads, gpu)


def _beyond_bound(func: tirx.PrimFunc, done: Group, rows: int, budget: int,
                  max_threads: int, gpu: GPU) -> Group:
    """``done``, a row group whose rows of symbolic length are staged for a declared bound,
    with the plan of its kernel's second body (``Group.beyond_bound``): the same threads,
    re-reading what ``done`` stages and recomputing its Regional intermediates, run when the
    length exceeds the bound. None is needed, and ``done`` is returned as it is, when
    ``done`` stages nothing of the row's size."""
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    reused = cache_reused_outputs(sch, func, SHARED)
    mapping = done.mapping
    pinned = replace(done.choices, threads_per_row=mapping.threads_per_row,
                     rows_per_block=mapping.rows_per_block, vector=mapping.vector,
                     row_steps=None if mapping.row_steps == 1 else mapping.row_steps)
    beyond = decide_rows(sch, func, replace(done, choices=pinned), rows, reused, budget,
                         max_threads, gpu, bounded=False)
    if not _on_chip(done) - _on_chip(beyond):  # all demoted: nothing sized for the bound
        return done
    differs = replace(beyond.mapping, mapped_length=mapping.mapped_length,
                      length_bound=mapping.length_bound)
    if differs != mapping:
        raise Unstitchable(f"beyond the declared bound the rows would need another mapping "
                           f"({beyond.mapping}) than within it ({mapping})")
    return replace(done, beyond_bound=replace(beyond, mapping=mapping, choices=done.choices))


def _built(fused: tirx.PrimFunc, done: Group, target: Target | None, gpu: GPU) -> Decided:
    """``done`` checked by scheduling ``fused`` with it and, given a target, building it, its
    launch settled against the shared memory the built kernel declares."""
    done = _with_vector_plan(fused, done)
    scheduled = _schedule(fused, done)  # emission prepares (and permutes) as decide does
    if target is None:
        return Decided(done, scheduled, None)
    lowered = _lower(scheduled, done, target)
    settled = _settle_launch(done, lowered, gpu)
    if settled is not done:
        scheduled = _schedule(fused, settled)
        lowered = _lower(scheduled, settled, target)
    return Decided(settled, scheduled, lowered)


def _on_chip(group: Group) -> set[str]:
    return {b.name for b in group.buffers if b.level is StorageLevel.SHARED}


def _with_vector_plan(fused: tirx.PrimFunc, group: Group) -> Group:
    """``group`` with the blocks its mapping keeps scalar and those it computes lane by lane
    (``vectors.lane_blocks``, sinks only), found on the blocks as the mapping will see them
    (``emit.rewritten``)."""
    mapping = group.mapping
    if mapping is None or mapping.vector == 1:
        return group
    done = _scheduling(rewritten, fused, group)
    scalar = tuple(dict.fromkeys(group.scalar_blocks + scalar_blocks(
        done.sch, done.vectorisable(), mapping.vector)))
    lanes = () if group.phases else lane_blocks(done.sch, split_sinks(done.sch)[0],
                                                mapping.vector,
                                                mapping.kind is MappingKind.FLAT)
    group = replace(group, scalar_blocks=scalar,
                    lane_blocks=tuple(n for n in lanes if n not in scalar))
    if not group.choices.vector_reads:
        return group
    found = () if group.phases else vector_reads(done.sch, done.vectorisable(), mapping.vector)
    if not found:
        raise Unstitchable(f"no reduction reads its inputs in whole aligned vectors of "
                           f"{mapping.vector}")
    return replace(group, vector_reads=found)


def _schedule(func: tirx.PrimFunc, group: Group) -> tirx.PrimFunc:
    return _scheduling(kernel, func, group).func


def _scheduling(step: Callable[[tirx.PrimFunc, Group], T], func: tirx.PrimFunc,
                group: Group) -> T:
    """``step(func, group)``, any schedule error in it an Unstitchable (fall back)."""
    try:
        return step(func, group)
    except Unstitchable:
        raise
    except Exception as err:  # noqa: BLE001 - any schedule error means: fall back
        raise Unstitchable(f"scheduling failed: {error_summary(err)}") from err


class LoweringFailed(Unstitchable):
    """A scheduled kernel that TVM does not lower (``decide`` tries it in scalars)."""


def _lower(scheduled: tirx.PrimFunc, group: Group, target: Target) -> LoweredFunc:
    try:
        return lower(scheduled, group.function or "stitched", target)
    except Exception as err:  # noqa: BLE001 - the kernel must build, or fall back
        raise LoweringFailed(f"lowering failed: {error_summary(err)}") from err


def _settle_launch(group: Group, lowered: LoweredFunc, gpu: GPU) -> Group:
    """``group`` with its launch configuration recomputed from the shared memory its built
    kernel declares, when that differs from the plan's estimate, at no more blocks per SM
    than keep the register cap every choice of the plan was made under: the elements a
    thread caches (``occupancy.launch_for_cached``, ``tiles.tiles_for_cached``) and the
    loads an unrolled loop has in flight (``unrolling.bound_unrolling``). A softmax down
    (2, 3136, 96) float16 planned 25344 B of shared memory (8 blocks per SM, 64 registers)
    and unrolled its 25 strided loads whole; its kernel declared 12800 B, and 10 blocks per
    SM at 48 registers spilled 24 B on sm_90 (fuzz graph 12012:253). A persistent grid
    shrinks to the new wave if it must (its phases loop over more tasks per block)."""
    launch = group.launch
    declared = max((kernel_shared_bytes(lowered.kernel(k.kernel)) for k in lowered.launches),
                   default=0)
    if launch is None or declared == launch.shared_bytes:
        return group
    settled = launch_of(gpu, launch.threads, declared, launch.grid)
    if settled.max_registers < launch.max_registers:
        settled = with_blocks_per_sm(gpu, settled, max(
            b for b in range(launch.blocks_per_sm, settled.blocks_per_sm + 1)
            if max_registers(gpu, launch.threads, b) >= launch.max_registers))
    if group.cluster > 1:  # clusters are resident one by one: a block per sub-row still
        settled = replace(settled, grid=launch.grid)
    elif group.phases:
        settled = replace(settled, grid=min(launch.grid, settled.wave))
        if settled.grid < max(p.tasks for p in group.phases) \
                and any(b.across_barriers for b in group.buffers):
            raise Unstitchable(f"inputs kept on chip across the grid barriers need a block "
                               f"per task, and {declared} B of shared memory leave a wave "
                               f"of {settled.wave} blocks")
    return replace(group, launch=settled)


def _check_flat_structure(sch: s_tir.Schedule) -> None:
    for block in child_blocks(sch):
        if sch.get_child_blocks(block):
            raise Unstitchable(f"block {name_of(sch, block)} has nested blocks")
        if len(sch.get_loops(block)) != len(sch.get(block).iter_vars):
            raise Unstitchable(f"block {name_of(sch, block)} is not in normal form")
