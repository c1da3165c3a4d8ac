"""Grouping (AStitch section 4): memory-intensive clusters between compute-intensive ops.

1. Compute-intensive ops (matmul, conv, opaque) keep TVM's path, together with what TVM's
   FuseOps fuses with them (their epilogue): taking it away would add a kernel and a round
   trip through DRAM compared with TVM.
2. Memory-intensive ops merge along their dataflow edges into clusters, as long as the
   cluster stays convex (no path leaves it and comes back: that would be a cycle between
   kernels) and keeps one row space (the kernel maps threads to rows of one size). A column
   reduction belongs to the row space of the rows it reduces; it and the ops that only combine
   its results live in column space (one value per column) and fit any row space. The edges
   are visited again until nothing merges: a merge refused for a path through a third cluster
   is legal once that cluster has joined one of the two.
3. Unconnected clusters with the same row space merge when no cycle forms (remote stitching).

A group whose stitched kernel moves more bytes than TVM's kernels of its ops may be cut
where one of its results is broadcast to a larger one (``broadcast_cuts``): its pieces are
grouped again apart, each a kernel that computes the smaller result once.

Before clustering, copies next to a matmul (a transpose that splits heads, ...) may join the
compute op's kernel instead (``graph.operands``): that kernel reads or writes through them.

Ops that are memory-intensive but cannot be stitched (a window reduction, a symbolic shape,
several outputs, ...) are left out with their reason, together with what FuseOps fuses with
them, and go through TVM's FuseOps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..plan import ComputeOp, Fallback, Refusal
from .copies import Copy
from .dataflow import DataflowGraph, Node
from .operands import Limits, absorbed_copies
from .ops import OpKind


@dataclass
class _Cluster:
    members: int  # bit set of node indices
    rows: int | None  # row count of its reductions, None while it has none
    row_counts: frozenset[int] | None  # row counts every op's output splits into (None: any)
    whole: int | None = None  # elements its reductions to a single value reduce, if any
    split_counts: frozenset[int] | None = None  # those when a dim may be split, as row_counts
    regrouped: frozenset[int] = frozenset()  # row counts its reshapes split an input dim at
    parts: tuple[int, ...] = ()  # bit sets of the unconnected parts remote stitching merged
    joined: int = 0  # bit set of the element-wise parts among them

    @property
    def splits_a_dim(self) -> bool:
        """Whether its rows split a dim of its ops' outputs (a group normalisation's (B, G)
        of (B, C, H, W)) or of what a reshape of it reads (the same normalisation as an
        instance normalisation of (B, G, C / G x H x W)): only then may ops join whose
        outputs split so as well."""
        return self.rows is not None and (self.rows in self.regrouped or (
            self.row_counts is not None and self.rows not in self.row_counts))

    @property
    def first(self) -> int:
        """Index of its first node (topological order)."""
        return (self.members & -self.members).bit_length() - 1


class _Quotient:
    """The graph of clusters: every node in its own unit until clusters merge. Merging two
    units is legal when no path leads from one to the other through a third unit (that path
    would become a cycle between kernels)."""

    def __init__(self, graph: DataflowGraph) -> None:
        self.graph = graph
        self.owner = list(range(len(graph.nodes)))
        self.members = {i: 1 << i for i in range(len(graph.nodes))}

    def find(self, i: int) -> int:
        """The unit node ``i`` belongs to."""
        while self.owner[i] != i:
            self.owner[i] = self.owner[self.owner[i]]
            i = self.owner[i]
        return i

    def union(self, a: int, b: int) -> None:
        """Merge unit ``b`` into unit ``a``."""
        self.owner[b] = a
        self.members[a] |= self.members.pop(b)

    def successors(self, unit: int) -> set[int]:
        """Units that read a result of ``unit``."""
        out = set()
        mask = self.members[unit]
        while mask:
            low = mask & -mask
            i = low.bit_length() - 1
            mask ^= low
            out.update(self.find(c) for c in self.graph.nodes[i].consumers)
        out.discard(unit)
        return out

    def detour(self, a: int, b: int) -> int | None:
        """The first node of a path from unit ``a`` to unit ``b`` through a third unit, or
        None when there is no such path."""
        last = self.members[b].bit_length() - 1
        for start in sorted(self.successors(a) - {b}, key=self.first):
            if self._reaches(start, b, last):
                return self.first(start)
        return None

    def first(self, unit: int) -> int:
        """Index of the first node of ``unit`` (topological order)."""
        mask = self.members[unit]
        return (mask & -mask).bit_length() - 1

    def _reaches(self, start: int, b: int, last: int) -> bool:
        seen, stack = {start}, [start]
        while stack:
            u = stack.pop()
            if self.first(u) > last:
                continue  # topologically after all of b: cannot lead to b
            succ = self.successors(u)
            if b in succ:
                return True
            for v in succ - seen:
                seen.add(v)
                stack.append(v)
        return False


@dataclass
class OpGroup:
    """A group of ops of one dataflow block that will become one kernel.

    ``columns`` are the members in column space: column reductions and the ops that only
    combine their results (one value per column); what they produce reaches the other
    members across thread blocks (Global stitching).
    """

    graph: DataflowGraph
    members: tuple[int, ...]
    rows: int | None
    columns: frozenset[int] = frozenset()
    parts: tuple[tuple[int, ...], ...] = ()
    """The unconnected parts remote stitching merged into the group (none if it did not)."""
    joined: frozenset[int] = frozenset()
    """The members of its element-wise parts: they fit any row space their outputs split
    into, so remote stitching gives them to a group they may slow down or that cannot map
    them; where the group cannot be stitched, or is estimated slower than TVM's kernels for
    its ops, they are grouped again on their own before anything falls back."""

    @property
    def nodes(self) -> list[Node]:
        """The member nodes in topological order."""
        return [self.graph.nodes[i] for i in self.members]

    @property
    def permuted_sinks(self) -> tuple[str, ...]:
        """Labels of the transposes that joined the group's rows as permuted writes
        (``_permuted_sink``): they read a member and no member reads them."""
        inside = set(self.members)
        return tuple(n.label for n in self.nodes
                     if self.rows is not None and n.info.copy is Copy.PERMUTED
                     and set(n.producers) & inside and not set(n.consumers) & inside)


@dataclass
class Grouping:
    """The outcome of grouping one dataflow block."""

    groups: list[OpGroup] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    compute: list[ComputeOp] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    operands: list[tuple[OpGroup, ComputeOp]] = field(default_factory=list)
    """Compute kernels that absorb copies: all their nodes, and their plan entry."""


def group_ops(graph: DataflowGraph, excluded: dict[str, str] | None = None,
              tvm_groups: list[frozenset[int]] | None = None,
              absorb: Limits | None = None, apart: frozenset[str] = frozenset(),
              cuts: frozenset[tuple[str, str]] = frozenset()) -> Grouping:
    """Group the memory-intensive ops of ``graph``.

    ``excluded`` maps op names to a reason they must fall back (e.g. the scheduler could not
    map their group); such ops are treated like unsupported ones. ``tvm_groups`` are the
    node indices TVM's FuseOps fuses together (``tvm_fusion.resolve``): what FuseOps fuses
    with a compute op or an op that falls back stays with it on TVM's path. ``absorb``, when
    given, lets compute kernels absorb copies (``graph.operands``) within its limits. Ops
    named in ``apart`` join no unconnected cluster (remote stitching).
    """
    excluded = excluded or {}
    tvm_groups = tvm_groups or []
    result = Grouping()
    candidates: set[int] = set()
    reasons: dict[int, str] = {}
    kernels: dict[int, frozenset[int]] = {}
    for node in graph.nodes:
        info = node.info
        if info is None:
            continue
        reason = excluded.get(node.name) or info.unsupported
        if reason:
            reasons[node.index] = reason
        elif info.kind.memory_intensive:
            candidates.add(node.index)
    for node in graph.nodes:
        kept = node.index in reasons or (node.info is not None
                                         and not node.info.kind.memory_intensive)
        if not kept:
            continue
        region = next((g for g in tvm_groups if node.index in g), frozenset())
        partners = sorted(i for i in region if i in candidates and i != node.index)
        candidates.difference_update(partners)
        labels = tuple(graph.nodes[i].label for i in partners)
        if node.index in reasons:
            result.fallbacks.append(Fallback((node.label, *labels), reasons[node.index]))
        else:
            detail = node.info.detail or node.info.kind.value
            result.compute.append(ComputeOp(node.label, detail, labels))
            if absorb is not None and node.label not in absorb.alone \
                    and not any(node.index in k for k in kernels.values()):
                kernels[node.index] = region | {node.index}
    if kernels:
        read_only = frozenset(i for i in kernels if graph.nodes[i].label in absorb.read_only)
        _absorb_copies(result, graph, candidates, kernels, read_only)
    columns = column_space(graph, candidates)
    clusters = {i: _singleton(graph.nodes[i], i in columns) for i in sorted(candidates)}
    quotient = _Quotient(graph)
    _merge_permuted_reads(graph, quotient, clusters)
    result.refusals.extend(_merge_along_edges(graph, quotient, clusters, cuts))
    result.refusals.extend(_merge_remote(graph, quotient, clusters, apart))
    for key in sorted(clusters, key=lambda k: clusters[k].first):
        c = clusters[key]
        members = tuple(i for i in range(len(graph.nodes)) if c.members >> i & 1)
        if len(members) > 1:
            members, views = _without_duplicate_views(graph, members)
            result.fallbacks.extend(Fallback((graph.nodes[v].label,), DUPLICATE_VIEW)
                                    for v in views)
        nodes = [graph.nodes[i] for i in members]
        if not nodes:
            continue
        if len(nodes) == 1 and nodes[0].info.kind not in (OpKind.ROW_REDUCE,
                                                          OpKind.COLUMN_REDUCE):
            result.fallbacks.append(Fallback((nodes[0].label,), SINGLE_OP))
            continue
        if all(n.info.copy is Copy.VIEW for n in nodes):
            result.fallbacks.append(Fallback(tuple(n.label for n in nodes), VIEWS_ONLY))
            continue
        if c.rows is None and c.whole is not None:  # reductions to one value, on their own
            result.groups.append(OpGroup(graph, members, 1))
            continue
        parts = tuple(tuple(i for i in members if part >> i & 1) for part in c.parts)
        result.groups.append(OpGroup(graph, members, c.rows,
                                     frozenset(i for i in members if i in columns), parts,
                                     frozenset(i for i in members if c.joined >> i & 1)))
    return result


SINGLE_OP = "a single injective op: nothing to stitch"
VIEWS_ONLY = "reshapes only: TVM makes them views, nothing to stitch"
DUPLICATE_VIEW = ("a reshape of a group's input or other output: a view of it, nothing to "
                  "stitch")
FUSED_VIEW = ("copies that TVM's fusion makes one view of their input (transposes that "
              "cancel): nothing to stitch")
NOTHING_TO_STITCH = (SINGLE_OP, VIEWS_ONLY, DUPLICATE_VIEW, FUSED_VIEW)
"""Reasons that leave ops to TVM because stitching them would save nothing."""


def _without_duplicate_views(graph: DataflowGraph, members: tuple[int, ...]
                             ) -> tuple[tuple[int, ...], list[int]]:
    """``members`` without the reshapes that pass out of the group a view of a value that is
    in global memory anyway: of a group input, or of a value the group passes out itself or
    through another such reshape. Written by the group, the reshape's result would be a
    second copy of it, where TVM makes it a view (no kernel, no bytes). A reshape of a group
    input may have readers inside the group (they read the view); one of a value the group
    computes may not (they would read what the kernel writes). Returns the rest and those."""
    inside = set(members)

    def leaves(node: Node) -> bool:
        """Whether the result leaves the group, itself or through views of it that do."""
        return node.escapes or any(c not in inside or (graph.nodes[c].info.copy is Copy.VIEW
                                                       and leaves(graph.nodes[c]))
                                   for c in node.consumers)

    def leaving_view(i: int) -> bool:
        node = graph.nodes[i]
        return node.info.copy is Copy.VIEW and len(set(node.producers)) <= 1 and leaves(node) \
            and not (set(node.producers) & inside and any(c in inside for c in node.consumers))

    dropped = []
    for i in members:  # in topological order: a view dropped makes its source's views leave
        if not leaving_view(i):
            continue
        sources = set(graph.nodes[i].producers) & inside
        if sources:
            producer = graph.nodes[sources.pop()]
            views = [c for c in producer.consumers if c in inside and leaving_view(c)]
            if not (producer.escapes or len(views) > 1
                    or any(c not in inside and c != i for c in producer.consumers)):
                continue
        inside.discard(i)
        dropped.append(i)
    return tuple(i for i in members if i in inside), dropped


def _absorb_copies(result: Grouping, graph: DataflowGraph, candidates: set[int],
                   kernels: dict[int, frozenset[int]], read_only: frozenset[int]) -> None:
    """Move the copies compute kernels absorb from ``candidates`` into their kernels."""
    entries = {c.op: i for i, c in enumerate(result.compute)}
    for op, copies in absorbed_copies(graph, candidates, kernels, read_only).items():
        moved = set(copies.reads) | set(copies.writes)
        candidates.difference_update(moved)
        at = entries[graph.nodes[op].label]
        entry = replace(result.compute[at],
                        reads_through=tuple(graph.nodes[i].label for i in copies.reads),
                        writes_through=tuple(graph.nodes[i].label for i in copies.writes))
        result.compute[at] = entry
        result.operands.append((OpGroup(graph, tuple(sorted(kernels[op] | moved)), None),
                                entry))


def _reduces_to_one(node: Node) -> bool:
    """A reduction of all its input to a single value (a row reduction of one row)."""
    return node.info.kind is OpKind.ROW_REDUCE and node.info.rows == 1


def column_space(graph: DataflowGraph, candidates: set[int]) -> set[int]:
    """Candidates whose results have one value per column: column reductions, reductions to
    a single value (a column reduction of one column, when they join a group with rows), and
    ops that read only such results (and constants or inputs no larger) and keep their size."""
    found: set[int] = set()
    for node in graph.nodes:
        if node.index not in candidates:
            continue
        if node.info.kind is OpKind.COLUMN_REDUCE or _reduces_to_one(node):
            found.add(node.index)
            continue
        producers = [graph.nodes[p] for p in node.producers]
        if producers and all(p.index in found for p in producers) \
                and node.info.out_size == max(p.info.out_size for p in producers):
            found.add(node.index)
    return found


def _singleton(node: Node, column: bool) -> _Cluster:
    info = node.info
    counts = None if column else info.row_counts
    split = None if column else info.split_row_counts
    if _reduces_to_one(node):
        return _Cluster(1 << node.index, None, counts, whole=info.row_length, split_counts=split)
    reduces = info.kind in (OpKind.ROW_REDUCE, OpKind.COLUMN_REDUCE)
    return _Cluster(1 << node.index, info.rows if reduces else None, counts, split_counts=split,
                    regrouped=frozenset() if column else info.regrouped_counts)


def _common_counts(a: frozenset[int] | None, b: frozenset[int] | None) -> frozenset[int] | None:
    if a is None or b is None:
        return b if a is None else a
    return a & b


def output_sizes(graph: DataflowGraph, members: int) -> set[int]:
    """Sizes of the results that members of the bit set ``members`` pass out of it."""
    sizes = set()
    for node in graph.nodes:
        if members >> node.index & 1 and (
                node.escapes or any(not members >> c & 1 for c in node.consumers)):
            sizes.add(node.info.out_size)
    return sizes


CANNOT_SPLIT = "an op cannot be split into"
"""Why a merge is refused when an op's output does not split into the cluster's rows."""


def _merge(quotient: _Quotient, a: _Cluster, b: _Cluster, ua: int, ub: int,
           sink: bool = False) -> tuple[_Cluster | None, str]:
    """Clusters ``a`` (unit ``ua``) and ``b`` (unit ``ub``) merged, or None and why not.
    A ``sink`` (``b``, a transpose that writes ``a``'s rows across its output, read by no
    cluster) need not split into ``a``'s rows."""
    rows = a.rows if a.rows is not None else b.rows
    if a.rows is not None and b.rows is not None and a.rows != b.rows:
        return None, f"different row counts ({a.rows} and {b.rows})"
    wholes = {w for w in (a.whole, b.whole) if w is not None}
    if len(wholes) > 1 or (rows is not None and wholes and wholes != {rows}):
        return None, "a reduction to one value over other rows"
    counts = a.row_counts if sink else _common_counts(a.row_counts, b.row_counts)
    split = _common_counts(a.split_counts, b.split_counts)
    if rows is None:
        if len(output_sizes(quotient.graph, a.members | b.members)) != 1:
            return None, "element-wise outputs of different sizes"
    elif counts is not None and rows not in counts and not (
            (a.splits_a_dim or b.splits_a_dim) and (split is None or rows in split)):
        return None, f"{CANNOT_SPLIT} {rows} rows"
    for x, y in ((ua, ub), (ub, ua)):
        through = quotient.detour(x, y)
        if through is not None:
            return None, f"cycle through {quotient.graph.nodes[through].label}"
    return _Cluster(a.members | b.members, rows, counts, a.whole or b.whole, split,
                    a.regrouped | b.regrouped), ""


def _try_merge(quotient: _Quotient, clusters: dict[int, _Cluster], a: int, b: int,
               sink: bool = False) -> str:
    """Merge unit ``b`` into unit ``a`` when legal; empty string if merged, else why not."""
    merged, why = _merge(quotient, clusters[a], clusters[b], a, b, sink)
    if merged is None:
        return why
    quotient.union(a, b)
    clusters[a] = merged
    del clusters[b]
    return ""


def _merge_permuted_reads(graph: DataflowGraph, quotient: _Quotient,
                          clusters: dict[int, _Cluster]) -> None:
    """Merge each transpose that only a reduction reads, directly or through element-wise
    ops that only it reads, into that reduction first, with those ops: the reduction then
    reads the transpose's input through it (``mixed_reductions`` makes such transposes), where
    merging along edges in order would give the transpose to its producer's cluster and write
    the transposed tensor out for the reduction to read back."""
    for node in graph.nodes:
        if node.index not in clusters or node.info.kind not in (OpKind.ROW_REDUCE,
                                                                OpKind.COLUMN_REDUCE):
            continue
        cone = _exclusive_cone(graph, clusters, node.index)
        if any(graph.nodes[i].info.copy in (Copy.ROWS, Copy.PERMUTED) for i in cone):
            for i in cone:
                _try_merge(quotient, clusters, quotient.find(node.index), i)


def _exclusive_cone(graph: DataflowGraph, clusters: dict[int, _Cluster], sink: int
                    ) -> list[int]:
    """The ops that only ``sink`` reads, directly or through each other, that are copies or
    element-wise ops and do not leave the block, in topological order from ``sink``: a
    transpose and what it feeds into a reduction."""
    cone: list[int] = []
    inside = {sink}
    frontier = [sink]
    while frontier:
        for p in sorted(set(graph.nodes[frontier.pop()].producers), reverse=True):
            node = graph.nodes[p]
            if p in inside or p not in clusters or node.escapes \
                    or not set(node.consumers) <= inside:
                continue
            if node.info.copy not in (Copy.ROWS, Copy.PERMUTED) \
                    and node.info.kind is not OpKind.ELEMWISE:
                continue
            inside.add(p)
            cone.append(p)
            frontier.append(p)
    return cone


def _merge_along_edges(graph: DataflowGraph, quotient: _Quotient,
                       clusters: dict[int, _Cluster], cuts: frozenset[tuple[str, str]]
                       ) -> list[Refusal]:
    """Merge clusters along the dataflow edges between their members but ``cuts``, until
    nothing changes: a merge refused because a path ran through a third cluster may become
    legal once that cluster has joined one of the two. Returns the merges still refused for
    a cycle."""
    while True:
        refusals: list[Refusal] = []
        changed = False
        for node in graph.nodes:
            for p in node.producers:
                a, b = quotient.find(p), quotient.find(node.index)
                if a == b or a not in clusters or b not in clusters \
                        or (graph.nodes[p].name, node.name) in cuts:
                    continue
                sink = False
                if node.info.copy is Copy.PERMUTED and clusters[a].rows is not None:
                    # a transpose of the innermost axis writes across the rows: only as the
                    # last op of the kernel, a permuted write (``row_permutation``)
                    if not _permuted_sink(quotient, clusters, node):
                        continue
                    sink = True
                why = _try_merge(quotient, clusters, a, b, sink)
                if why.startswith(CANNOT_SPLIT) and node.info.copy is Copy.ROWS \
                        and _permuted_sink(quotient, clusters, node):
                    # so does one that moves runs shorter than the rows (the channels of
                    # (C, N, H, W) back to (N, C, H, W))
                    why = _try_merge(quotient, clusters, a, b, True)
                if not why:
                    changed = True
                elif why.startswith("cycle"):
                    refusals.append(_refusal(graph, clusters[a], clusters[b], why))
        if not changed:
            return refusals


def _permuted_sink(quotient: _Quotient, clusters: dict[int, _Cluster], node) -> bool:
    """Whether the transpose ``node`` may join the row cluster of what it reads as a permuted
    write: no memory-intensive op reads its result (it is an output, or a matmul's
    operand), so no block of the kernel reads what it writes across the rows. A softmax over
    the middle axis of (B, T, E), rewritten as one over the rows (b, e) of a transposed view
    (``mixed_reductions``), is then one kernel writing its result back in place; so is a batch
    norm over the channels of a (C, N, H, W) view of its (N, C, H, W) input, its result
    transposed back."""
    return not node.consumers or all(quotient.find(c) not in clusters for c in node.consumers)


def _merge_remote(graph: DataflowGraph, quotient: _Quotient, clusters: dict[int, _Cluster],
                  apart: frozenset[str]) -> list[Refusal]:
    """Remote stitching: merge unconnected clusters of one row space when no cycle forms
    (an element-wise cluster fits any row space its outputs split into), but none with an
    op in ``apart``. Clusters an edge connects are left apart: ``_merge_along_edges``
    refused that edge (a transpose read across the rows of what it reads, a cut; fuzz graph
    12011:136 merged a log-softmax with the softmax of its transpose, which then fell back
    whole). Returns the merges refused for a cycle, one per cluster."""

    def joined(c: _Cluster) -> int:
        return c.joined | (c.members if c.rows is None and c.whole is None else 0)

    held = {n.index for n in graph.nodes if n.name in apart}
    keys = sorted((k for k in clusters
                   if not any(clusters[k].members >> i & 1 for i in held)),
                  key=lambda k: clusters[k].first)
    refusals: dict[int, Refusal] = {}
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if a not in clusters or b not in clusters or b in quotient.successors(a) \
                    or a in quotient.successors(b):
                continue  # connected: merging along the edges between them was refused
            parts = (clusters[a].parts or (clusters[a].members,)) + (
                clusters[b].parts or (clusters[b].members,))
            both = joined(clusters[a]) | joined(clusters[b])
            why = _try_merge(quotient, clusters, a, b)
            if not why:
                clusters[a] = replace(clusters[a], parts=parts, joined=both)
            elif why.startswith("cycle") and b not in refusals:
                refusals[b] = _refusal(graph, clusters[a], clusters[b], why)
    return list(refusals.values())


def broadcast_cuts(og: OpGroup) -> frozenset[tuple[str, str]]:
    """The edges (producer name, consumer name) between members of ``og`` where a result is
    broadcast to a larger one: BERT's attention mask per batch, gathered from the int64 mask
    (cast, gather), read by every query row (and, where). One kernel recomputes the gather at
    every element, reading its indices and the mask each time (75776 B where TVM's three
    kernels move 30400 B); cut there, a kernel computes it once and the next reads it."""
    inside = set(og.members)
    return frozenset((og.graph.nodes[p].name, n.name) for n in og.nodes for p in n.producers
                     if p in inside and n.info.out_size > og.graph.nodes[p].info.out_size)


def pieces(og: OpGroup, cuts: frozenset[tuple[str, str]]) -> list[tuple[int, ...]]:
    """The members of ``og`` connected by its dataflow edges but ``cuts``, each piece in
    topological order, the pieces in the order of their first members."""
    root = {i: i for i in og.members}

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i

    for n in og.nodes:
        for p in n.producers:
            if p in root and (og.graph.nodes[p].name, n.name) not in cuts:
                root[find(n.index)] = find(p)
    found: dict[int, list[int]] = {}
    for i in og.members:
        found.setdefault(find(i), []).append(i)
    return [tuple(members) for members in found.values()]


def _refusal(graph: DataflowGraph, a: _Cluster, b: _Cluster, why: str) -> Refusal:
    return Refusal(_describe(graph, a), _describe(graph, b), why)


def _describe(graph: DataflowGraph, c: _Cluster) -> str:
    return "{" + ", ".join(n.label for n in graph.nodes if c.members >> n.index & 1) + "}"
