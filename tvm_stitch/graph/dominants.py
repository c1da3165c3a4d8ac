"""Dominants and stitching schemes of a group (AStitch section 4.2).

An edge producer -> consumer inside a group is Local when the consumer reads the producer's
result once, element by element (the same thread can compute both); it is Regional when the
consumer reads it several times or at other positions (a reduction reading its input row in
several phases, a reduction result broadcast back over the row): the producer's result is then
kept in shared memory for the thread block. A column reduction's result (and what is computed
from it alone) is needed by every thread block: the edge from it back to row space is Global.
Unconnected parts of a group are Independent.

Dominant candidates are reductions, expensive element-wise ops that feed a Regional edge (a
broadcast), and ops whose result leaves the group. Candidates connected through Local edges
merge into one dominant (a reduction preferred); the others become its sub-dominants.
"""

from __future__ import annotations

from ..plan import Dominant, DominantKind, Edge, Scheme
from .copies import Copy
from .dataflow import DataflowGraph, Node
from .grouping import OpGroup
from .ops import OpKind


def edge_scheme(producer: Node, consumer: Node, columns: frozenset[int] = frozenset()
                ) -> Scheme:
    """The scheme of the dependence ``producer`` -> ``consumer`` (both call_tir ops).

    ``columns`` are the nodes in column space (``OpGroup.columns``): a column result read
    back in row space is needed by every thread block, across blocks (Global); a column
    reduction accumulates each element it reads in the thread that computed it (Local, when
    it reads the producer once).
    """
    info = consumer.info
    positions = [i for i, arg in enumerate(consumer.inputs) if arg.same_as(producer.var)]
    reads = sum(info.input_reads[i] for i in positions)
    if producer.index in columns and consumer.index not in columns:
        return Scheme.GLOBAL
    if producer.index in columns or consumer.index in columns:
        return Scheme.LOCAL if reads == 1 else Scheme.REGIONAL
    aligned = all(info.input_aligned[i] for i in positions)
    return Scheme.LOCAL if reads == 1 and aligned else Scheme.REGIONAL


def _leaving(group: OpGroup) -> list[Node]:
    """Members whose result is used outside the group."""
    members = set(group.members)
    return [n for n in group.nodes
            if n.escapes or any(c not in members for c in n.consumers)]


def passed_views(group: OpGroup) -> list[Node]:
    """Members whose result leaves the group as a view (a reshape) of another result that
    leaves it. The kernel writes that result once and the caller makes the view, as TVM
    makes it of any kernel's result; written too, it would be a second copy (fuzz graph
    4242:205: an add passed out with a reshape of it that a tanh reads inside)."""
    passed: list[Node] = []
    out: set[int] = set()
    for node in _leaving(group):
        producers = set(node.producers)
        if node.info.copy is Copy.VIEW and len(producers) == 1 and producers <= out:
            passed.append(node)
        out.add(node.index)
    return passed


def group_outputs(group: OpGroup) -> list[Node]:
    """Members whose result the group's kernel passes out: those used outside the group,
    but for the views of another of them (``passed_views``)."""
    views = {n.index for n in passed_views(group)}
    return [n for n in _leaving(group) if n.index not in views]


def analyse(group: OpGroup) -> tuple[tuple[Dominant, ...], tuple[Edge, ...]]:
    """Dominants and edges (with schemes) of ``group``."""
    graph = group.graph
    members = set(group.members)
    edges: list[Edge] = []
    local: dict[int, set[int]] = {i: set() for i in members}
    regional_out: set[int] = set()
    for node in group.nodes:
        for p in node.producers:
            if p not in members:
                continue
            scheme = edge_scheme(graph.nodes[p], node, group.columns)
            edges.append(Edge(graph.nodes[p].label, node.label, scheme))
            if scheme is Scheme.LOCAL:
                local[p].add(node.index)
                local[node.index].add(p)
            else:
                regional_out.add(p)
    outputs = {n.index for n in group_outputs(group)}
    kinds: dict[int, DominantKind] = {}
    for node in group.nodes:
        if node.info.kind in (OpKind.ROW_REDUCE, OpKind.COLUMN_REDUCE):
            kinds[node.index] = DominantKind.REDUCTION
        elif node.info.expensive and node.index in regional_out:
            kinds[node.index] = DominantKind.EXPENSIVE
        elif node.index in outputs:
            kinds[node.index] = DominantKind.OUTPUT
    components = _components(group.members, local)
    dominants: list[Dominant] = []
    orphans: list[set[int]] = []
    for comp in components:
        cands = [i for i in sorted(comp) if i in kinds]
        if not cands:
            orphans.append(comp)
            continue
        reductions = [i for i in cands if kinds[i] is DominantKind.REDUCTION]
        lead = reductions[-1] if reductions else cands[-1]
        dominants.append(Dominant(
            graph.nodes[lead].label, kinds[lead],
            tuple(graph.nodes[i].label for i in sorted(comp)),
            tuple(graph.nodes[i].label for i in cands if i != lead)))
    dominants = _adopt_orphans(graph, dominants, orphans)
    edges.extend(_independent_edges(graph, group, dominants))
    return tuple(dominants), tuple(edges)


def _components(members: tuple[int, ...], links: dict[int, set[int]]) -> list[set[int]]:
    seen: set[int] = set()
    comps = []
    for start in members:
        if start in seen:
            continue
        comp, stack = set(), [start]
        while stack:
            i = stack.pop()
            if i in comp:
                continue
            comp.add(i)
            stack.extend(links[i] - comp)
        seen |= comp
        comps.append(comp)
    return comps


def _adopt_orphans(graph: DataflowGraph, dominants: list[Dominant], orphans: list[set[int]]
                   ) -> list[Dominant]:
    """Ops reached by no dominant through Local edges (a light producer whose consumers read
    it Regionally) are computed in the mapping of the dominant they feed."""
    by_label = {label: d for d in dominants for label in d.members}
    pending = list(orphans)
    while pending:
        progress = False
        for comp in list(pending):
            target = next((by_label[graph.nodes[c].label] for i in sorted(comp)
                           for c in graph.nodes[i].consumers
                           if graph.nodes[c].label in by_label), None)
            if target is None:
                continue
            extra = tuple(graph.nodes[i].label for i in sorted(comp))
            merged = Dominant(target.op, target.kind, extra + target.members,
                              target.sub_dominants)
            dominants[dominants.index(target)] = merged
            for label in merged.members:
                by_label[label] = merged
            pending.remove(comp)
            progress = True
        if not progress:
            break
    return dominants


def _independent_edges(graph: DataflowGraph, group: OpGroup, dominants: list[Dominant]
                       ) -> list[Edge]:
    """One Independent edge between consecutive unconnected parts of the group."""
    members = set(group.members)
    links = {i: {j for j in graph.nodes[i].producers + graph.nodes[i].consumers
                 if j in members} for i in members}
    parts = _components(group.members, links)
    if len(parts) < 2:
        return []
    leads = []
    for part in parts:
        labels = {graph.nodes[i].label for i in part}
        lead = next((d.op for d in dominants if d.op in labels), None)
        if lead is not None:
            leads.append(lead)
    return [Edge(a, b, Scheme.INDEPENDENT) for a, b in zip(leads, leads[1:], strict=False)]
