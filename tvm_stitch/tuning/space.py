"""The candidate space of a group: every kernel the rules can build with other choices.

The rules' own kernel (``Choices()``) comes first. The other choices vary what the rules
decide (``plan.Choices``) around the rules' kernel: threads per row and per block, rows
packed per block and walked in sequence, elements per access, whether an element-wise group
walks its rows or is flat, task-splitting parts and thread-block clusters (sm_90), column
tiles and whether row tiles may be ragged, which staged inputs are re-read or held in
registers instead, whether reductions
read their inputs in vectors, and a row group's softmax in two passes or online (the
other of the rules' pick; ``decide`` refuses it where there is no softmax). A choice is
offered only once
``decisions.decide`` has built it, so every candidate is legal by construction: its
resource checks (shared memory, registers, waves of a persistent grid) ran before it is
offered, and a choice the rules refuse is dropped.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..plan import BufferRole, Choices, Group, MappingKind, StorageLevel
from ..schedule.cluster import MAX_CLUSTER, has_clusters
from ..schedule.decisions import Decided, decide, target_budget
from ..schedule.decisions.choosing import Chooser, Task
from ..schedule.occupancy import device_of
from ..schedule.rows import Unstitchable
from ..target import WARP_SIZE
from .tasks import workload_key

SPREAD = 4
"""Thread counts are varied up to this factor either way of the rules' choice."""

FLAT_THREADS = (64, 128, 256, 512, 1024)
"""Threads per block an element-wise kernel may take."""

PACKED_ROWS = (1, 2, 4, 8, 16, 32, 6, 12, 24, 30)
"""Rows per block a row group may pack (as many as its block's threads allow, rows of more
than a warp too): powers of two, and counts that need not
divide the rows (the last block is guarded) so that a block's threads may follow occupancy
(30 rows of 8 threads: 240)."""

SPLIT_PARTS = (2, 4, 5, 8, 10, 16, 20, 32, 64)
"""Parts a split row group may try (those its rows cannot be split in are refused by the
rules): powers of two, and counts of whole channels of a group normalisation's groups of
5, 10 or 20 channels."""

ROW_STEPS = (1, 2, 4, 8, 16, 32)
"""Groups of rows a block may walk in sequence (besides the rules' own)."""


@dataclass(frozen=True)
class Candidate:
    """A kernel for a task: the choices it was built with, and what ``decide`` made of
    them."""

    choices: Choices
    decided: Decided

    @property
    def group(self) -> Group:
        """The candidate's plan entry."""
        return self.decided.group


def _powers_of_two(low: int, high: int) -> list[int]:
    out, p = [], 1
    while p <= high:
        if p >= low:
            out.append(p)
        p *= 2
    return out


def _around(value: int, max_threads: int, low: int = 1) -> list[int]:
    return _powers_of_two(max(low, value // SPREAD), min(max_threads, value * SPREAD))


def _stagings(group: Group) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(re-read, held) inputs: none, or each staged input alone re-read, or held in
    registers when staged per row."""
    staged = [b for b in group.buffers
              if b.level is StorageLevel.SHARED and b.role is BufferRole.INPUT]
    names = dict.fromkeys(b.name for b in staged)
    per_row = dict.fromkeys(b.name for b in staged if not b.per_block)
    return [((), ()), *(((n,), ()) for n in names), *(((), (n,)) for n in per_row)]


def choice_space(group: Group, max_threads: int, clusters: bool = False) -> list[Choices]:
    """Every set of choices to try for a group whose rules' kernel is ``group``, the rules'
    own (``Choices()``) first, thread-block clusters for a split row group when the target
    has them (``clusters``); not all of them are legal (``candidates`` keeps those that
    are)."""
    mapping = group.mapping
    space = [Choices()]
    if mapping is None:
        return space
    vectors = _powers_of_two(1, max(mapping.vector, 1))
    if mapping.kind in (MappingKind.FLAT, MappingKind.ROW_WALK):
        walked = mapping.kind is MappingKind.ROW_WALK
        flat = [1] if mapping.rows_expr else [*vectors, 2 * mapping.vector]
        space += [Choices(block_threads=t, vector=v, walk_rows=False if walked else None)
                  for t, v in itertools.product(FLAT_THREADS, flat) if t <= max_threads]
        if not mapping.rows_expr:  # a symbolic row count has no rows to walk
            space += [Choices(row_steps=s, vector=v, walk_rows=True)
                      for s, v in itertools.product([None, *ROW_STEPS], vectors)]
    elif group.row_split > 1:
        counts = dict.fromkeys([1, *SPLIT_PARTS, group.row_split // 2, group.row_split * 2])
        threads = [None, *_powers_of_two(WARP_SIZE * 4, max_threads)]
        space += [Choices(split_parts=p, threads_per_row=t)
                  for p, t in itertools.product(counts, threads) if p]
        if clusters:  # a row, or two, per cluster
            space += [Choices(split_parts=p, threads_per_row=t, cluster=c)
                      for p, t in itertools.product(counts, threads) if p > 1
                      for c in (p, 2 * p) if c <= MAX_CLUSTER]
    elif group.phases:
        threads = _around(mapping.threads_per_row, max_threads, WARP_SIZE)
        tiles = [None, 1, *{p.column_tiles for p in group.phases if p.column_tiles > 1}]
        space += [Choices(threads_per_row=t, column_tiles=c, vector=v, reread=r)
                  for t, c, v, (r, _) in itertools.product(threads, tiles, vectors,
                                                           _stagings(group))]
        ragged = bool(mapping.row_tiles) and not mapping.rows_expr
        space.append(Choices(ragged_tiles=not ragged))
    else:
        threads = _around(mapping.threads_per_row, max_threads)
        for t, v, (r, h) in itertools.product(threads, vectors, _stagings(group)):
            packs = [p for p in PACKED_ROWS if p * t <= max_threads]
            reads = [None, True] if v > 1 else [None]
            space += [Choices(threads_per_row=t, rows_per_block=p, row_steps=s, vector=v,
                              reread=r, held=h, vector_reads=w)
                      for p, s, w in itertools.product(packs, [None, *ROW_STEPS], reads)]
    if mapping.kind not in (MappingKind.FLAT, MappingKind.ROW_WALK):
        space.append(Choices(online_softmax=not group.online))
        space.append(Choices(online_variance=not group.online_variance))
        space.append(Choices(kept_transposes=not group.transposed_copies))
    return list(dict.fromkeys(space))


def _unchosen(group: Group) -> Group:
    return replace(group, choices=Choices())


def iter_candidates(task: Task, seed: int = 0) -> Iterator[Candidate]:
    """The legal candidates of ``task``: the rules' kernel first (raises Unstitchable if
    even it does not build), then the others in a random order fixed by ``seed``, each a
    kernel different from all before it."""
    first = decide(task.func, task.group, task.rows, task.target)
    yield Candidate(Choices(), first)
    _, max_threads = target_budget(task.target)
    rest = choice_space(first.group, max_threads,
                        has_clusters(device_of(task.target).arch))[1:]
    random.Random(seed).shuffle(rest)
    seen = {_unchosen(first.group)}
    for choices in rest:
        try:
            decided = decide(task.func, task.group, task.rows, task.target, choices)
        except Unstitchable:
            continue
        key = _unchosen(decided.group)
        if key not in seen:
            seen.add(key)
            yield Candidate(choices, decided)


def candidates(task: Task, limit: int | None = None, seed: int = 0) -> list[Candidate]:
    """Up to ``limit`` legal candidates of ``task`` (all without a limit), the rules' kernel
    first (``iter_candidates``)."""
    return list(itertools.islice(iter_candidates(task, seed), limit))


class Sampling(Chooser):
    """Prefers, for every task, one candidate drawn at random (``seed``) from its first
    ``limit`` legal ones other than the rules' kernel (the rules' when it has none): how the
    tests check that any candidate gives right numbers."""

    def __init__(self, seed: int = 0, limit: int = 8) -> None:
        self.seed = seed
        self.limit = limit
        self.drawn: dict[str, Candidate | None] = {}

    def preferred(self, task: Task) -> Iterator[Decided]:
        """A random candidate of ``task`` other than the first, if it has any; one per
        workload (identical layers draw alike)."""
        key = workload_key(task)
        if key not in self.drawn:
            try:
                found = candidates(task, self.limit, self.seed)[1:]
            except Unstitchable:
                found = []
            self.drawn[key] = random.Random(self.seed).choice(found) if found else None
        pick = self.drawn[key]
        if pick is not None:
            yield decide(task.func, task.group, task.rows, task.target, pick.choices)
