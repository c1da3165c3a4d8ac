"""The Relax-level half of a StitchPlan: groups with their dominants and edges, fallbacks,
compute ops. The kernel-level half (mapping, staging, budget) is added by
``tvm_stitch.schedule.decide`` once each group is fused into one PrimFunc."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import relax
from tvm.ir import IRModule

from ..plan import ComputeOp, Fallback, Group, Refusal
from .dataflow import DataflowGraph, dataflow_graphs
from .dominants import analyse, group_outputs
from .grouping import FUSED_VIEW, OpGroup, group_ops
from .operands import Limits
from .tvm_fusion import FusedGroup, resolve, tvm_fusion_groups


@dataclass
class Draft:
    """Groups of a module (each an OpGroup and its plan entry so far) and what is left out."""

    graphs: list[DataflowGraph]
    groups: list[tuple[OpGroup, Group]] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    compute: list[ComputeOp] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    operands: list[tuple[OpGroup, ComputeOp]] = field(default_factory=list)


def draft_plan(mod: IRModule, excluded: dict[str, str] | None = None,
               tvm_groups: list[FusedGroup] | None = None, func_name: str = "main",
               absorb: Limits | None = None, apart: frozenset[str] = frozenset(),
               cuts: frozenset[tuple[str, str]] = frozenset()) -> Draft:
    """Group the memory-intensive ops of ``mod[func_name]``; ``excluded`` maps op names that
    must fall back to the reason; ``tvm_groups`` are TVM's FuseOps groups of ``mod``
    (computed when not given): a group of nothing but copies that TVM fuses into views
    falls back; ``absorb``, ``apart`` and ``cuts`` as for ``group_ops``."""
    if tvm_groups is None:
        tvm_groups = tvm_fusion_groups(mod).groups
    views = frozenset(v for g in tvm_groups if len(g.members) > 1 and g.compulsory_bytes == 0
                      for v in g.members)
    draft = Draft(dataflow_graphs(mod, func_name))
    for graph in draft.graphs:
        grouping = group_ops(graph, excluded, resolve(graph, tvm_groups), absorb, apart, cuts)
        draft.fallbacks.extend(grouping.fallbacks)
        draft.compute.extend(grouping.compute)
        draft.refusals.extend(grouping.refusals)
        draft.operands.extend(grouping.operands)
        for og in grouping.groups:
            if all(n.var in views for n in og.nodes):
                draft.fallbacks.append(Fallback(tuple(n.label for n in og.nodes), FUSED_VIEW))
                continue
            dominants, edges = analyse(og)
            entry = Group(
                id=len(draft.groups),
                ops=tuple(n.label for n in og.nodes),
                inputs=tuple(_input_names(og)),
                outputs=tuple(n.label for n in group_outputs(og)),
                dominants=dominants,
                edges=edges,
            )
            draft.groups.append((og, entry))
    return draft


def _input_names(group: OpGroup) -> list[str]:
    defined = {n.var for n in group.nodes}
    seen: list[relax.Expr] = []
    names: list[str] = []
    for node in group.nodes:
        for arg in node.inputs:
            if (isinstance(arg, relax.Var) and arg in defined) or any(arg.same_as(s)
                                                                       for s in seen):
                continue
            seen.append(arg)
            if isinstance(arg, relax.Var):
                names.append(arg.name)
            else:
                names.append(f"const{len(seen) - 1}{list(arg.value.shape)}")
    return names
