"""Which kernel of the stitch flow each ONNX node went into.

TVM's ONNX importer keeps no node names, and it does not emit one binding per node: a
converter returns an expression that the block builder binds later, and many converters emit
several bindings (a Gather's index wrapping, a LayerNormalization's statistics). So the
mapping is made from what the importer itself records: ``ONNXGraphImporter._nodes`` maps
every ONNX tensor name to the Relax value the importer made for it. Importing the model with
``frontend.onnx.import_model`` while that table is captured gives, for each ONNX node, the
bindings of its outputs (the binding whose value *is* that expression object); the node's
own bindings are those its outputs depend on back to the outputs of other nodes (its
inputs). Each binding is then looked up in the stitch plan by its variable name (the plan's
ops are ``var:callee``; the compile keeps the importer's variable names).

Nothing is guessed: a node whose outputs the importer's table does not hold (a node that
``frontend.outputs`` or ``frontend.repairs`` rewrote away), or whose value is bound nowhere,
is ``NOT_MAPPED``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

import onnx
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

from ..frontend.onnx import import_model, load
from ..plan import StitchPlan


class NodePlace(StrEnum):
    """Where an ONNX node's computation went in the stitch flow."""

    STITCHED = "stitched"  # into a stitched group's kernel
    COMPUTE = "compute"  # into a matmul or convolution kernel of TVM's path (epilogue, copies)
    FALLBACK = "fallback"  # left to TVM's fusion, with the plan's reason
    NO_KERNEL = "no kernel"  # none of its bindings is among the plan's ops
    NOT_MAPPED = "not mapped"  # the importer's table does not tell its bindings


@dataclass(frozen=True)
class Place:
    """One entry of the stitch plan an op belongs to: a group, a compute op or a fallback."""

    kind: NodePlace
    index: int  # the group's id, or the position among the plan's compute ops or fallbacks
    reason: str = ""  # a fallback's reason

    @property
    def label(self) -> str:
        """How the page names it: ``group 3``, ``compute 2``, ``fallback 0``."""
        word = "group" if self.kind is NodePlace.STITCHED else self.kind.value
        return f"{word} {self.index}"


@dataclass(frozen=True)
class NodeMapping:
    """One ONNX node: its bindings (``var:place`` order of the import), and where it went."""

    index: int
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    place: NodePlace
    main: Place | None  # the plan entry that computes its (last) output
    places: tuple[Place, ...]  # every plan entry any of its bindings is in
    bindings: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Mapping:
    """Every node of the model mapped, and the plan ops no node's bindings account for."""

    nodes: tuple[NodeMapping, ...]
    unmatched_ops: tuple[str, ...]

    @property
    def mapped_fraction(self) -> float:
        """The share of the nodes whose bindings are known (everything but NOT_MAPPED)."""
        if not self.nodes:
            return 1.0
        return sum(n.place is not NodePlace.NOT_MAPPED for n in self.nodes) / len(self.nodes)


@contextlib.contextmanager
def _importer_values() -> Iterator[dict[str, relax.Expr]]:
    """While active, every import fills the yielded dict with the importer's tensor table."""
    values: dict[str, relax.Expr] = {}
    construct = ONNXGraphImporter._construct_nodes

    def recording(self: ONNXGraphImporter, graph: onnx.GraphProto) -> None:
        construct(self, graph)
        values.update(self._nodes)

    ONNXGraphImporter._construct_nodes = recording
    try:
        yield values
    finally:
        ONNXGraphImporter._construct_nodes = construct


def plan_places(plan: StitchPlan) -> dict[str, Place]:
    """Each plan op's variable name (``lv3`` of ``lv3:add``) and the plan entry it is in."""
    places: dict[str, Place] = {}
    for group in plan.groups:
        places.update({_var(op): Place(NodePlace.STITCHED, group.id) for op in group.ops})
    for i, comp in enumerate(plan.compute):
        ops = (comp.op, *comp.epilogue, *comp.absorbed)
        places.update({_var(op): Place(NodePlace.COMPUTE, i) for op in ops})
    for i, fallback in enumerate(plan.fallbacks):
        places.update({_var(op): Place(NodePlace.FALLBACK, i, fallback.reason)
                       for op in fallback.ops})
    return places


def _var(op: str) -> str:
    return op.split(":", 1)[0]


def map_nodes(model: str | os.PathLike | onnx.ModelProto, plan: StitchPlan) -> Mapping:
    """Map every node of ``model`` to the entries of ``plan`` (the stitch flow's plan of the
    same model) that its bindings are in. See the module's docstring for how."""
    proto = load(model)
    with _importer_values() as values:
        mod = import_model(proto)
    bindings = [b for block in mod["main"].body.blocks for b in block.bindings]
    order = {b.var: i for i, b in enumerate(bindings)}
    bound = {b.value: b.var for b in bindings}
    counts: dict[str, int] = {}
    for b in bindings:
        counts[b.var.name] = counts.get(b.var.name, 0) + 1
    places = plan_places(plan)

    owner: dict[relax.Var, int] = {}  # each output binding, and the first node it is output of
    outputs_of: list[list[relax.Var] | None] = []
    for i, node in enumerate(proto.graph.node):
        outs: list[relax.Var] | None = []
        for name in (o for o in node.output if o):
            value = values.get(name)
            var = value if isinstance(value, relax.Var) else bound.get(value)
            if value is None or (var is None and not isinstance(value, relax.Constant)):
                outs = None
                break
            if var is not None and var in order:
                outs.append(var)
                owner.setdefault(var, i)
        outputs_of.append(outs)

    nodes = []
    seen_ops: set[str] = set()
    for i, node in enumerate(proto.graph.node):
        common = (i, node.name or f"#{i}", node.op_type, tuple(node.input), tuple(node.output))
        outs = outputs_of[i]
        if outs is None:
            nodes.append(NodeMapping(*common, NodePlace.NOT_MAPPED, None, (), (),
                                     "the importer's table does not hold its outputs"))
            continue
        own = [v for v in outs if owner[v] == i]
        cone = _cone(own, bindings, order, owner, i)
        names = tuple(bindings[k].var.name for k in cone)
        seen_ops.update(names)
        found = [places[n] for n in names if counts[n] == 1 and n in places]
        last = next((places[v.name] for v in reversed(own)
                     if counts[v.name] == 1 and v.name in places), None)
        main = last if last is not None else (found[-1] if found else None)
        note = ("a constant at import" if not outs else
                "" if own else "the importer passes another node's value through")
        nodes.append(NodeMapping(*common, NodePlace.NO_KERNEL if main is None else main.kind,
                                 main, tuple(dict.fromkeys(found)), names, note))
    unmatched = tuple(sorted(op for op in places if op not in seen_ops))
    return Mapping(tuple(nodes), unmatched)


def _cone(outputs: list[relax.Var], bindings: list[relax.Binding],
          order: dict[relax.Var, int], owner: dict[relax.Var, int], node: int) -> list[int]:
    """The binding positions ``outputs`` depend on, back to other nodes' outputs, in order."""
    found: set[int] = set()
    stack = list(outputs)
    while stack:
        var = stack.pop()
        k = order[var]
        if k in found:
            continue
        found.add(k)
        stack += [u for u in relax.analysis.free_vars(bindings[k].value)
                  if u in order and owner.get(u, node) == node]
    return sorted(found)


__all__ = ["Mapping", "NodeMapping", "NodePlace", "Place", "map_nodes", "plan_places"]
