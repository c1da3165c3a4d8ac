"""What TVM's own FuseOps would fuse: the regions that keep TVM's path.

Compute-intensive ops keep TVM's default path *with* the epilogue FuseOps fuses into them,
and an op we cannot stitch falls back with the producers and consumers FuseOps fuses with it:
taking those away from TVM would add kernels and DRAM round trips compared with TVM. Rather
than re-implement FuseOps' post-dominator rules, we run it on the module and read its groups.

Inside the functions FuseOps outlines, bindings keep their names except the function's
results, which it renames; a result is found again as the op with the same callee that reads
the same bindings of the function.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.ir import IRModule

from .dataflow import DataflowGraph

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass(frozen=True)
class FusedCall:
    """One call_tir binding inside a function FuseOps outlined."""

    name: str
    callee: str
    reads: tuple[str, ...]  # names of the bindings of the same function it reads
    renamed: bool  # a result of the function: FuseOps gave it a new name


def tvm_fusion_groups(mod: IRModule) -> list[list[FusedCall]]:
    """The call_tir bindings of each function TVM's FuseOps outlines from ``mod``.

    ``mod`` must have its op patterns annotated (after AnnotateTIROpPattern).
    """
    fused = relax.transform.FuseOps()(mod)
    groups = []
    for _, func in fused.functions_items():
        if not isinstance(func, relax.Function) or func.attrs is None \
                or "Primitive" not in func.attrs:
            continue
        calls: list[FusedCall] = []
        inner: set[relax.Var] = set()
        for block in func.body.blocks:
            for b in block.bindings:
                value = b.value
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                        and value.op.same_as(_CALL_TIR):
                    reads = tuple(v.name for v in relax.analysis.free_vars(value) if v in inner)
                    renamed = not isinstance(b.var, relax.DataflowVar)
                    calls.append(FusedCall(b.var.name, value.args[0].name_hint, reads, renamed))
                inner.add(b.var)
        groups.append(calls)
    return groups


def resolve(graph: DataflowGraph, groups: list[list[FusedCall]]) -> list[frozenset[int]]:
    """The node indices of ``graph`` in each FuseOps group (calls not found are left out)."""
    by_name = {n.name: n for n in graph.nodes}
    out = []
    for calls in groups:
        names: dict[str, int] = {}
        for call in calls:
            node = None if call.renamed else by_name.get(call.name)
            if node is None or node.callee != call.callee:
                node = _find_result(graph, call, names)
            if node is not None:
                names[call.name] = node.index
        if names:
            out.append(frozenset(names.values()))
    return out


def _find_result(graph: DataflowGraph, call: FusedCall, names: dict[str, int]):
    if not call.reads or not all(r in names for r in call.reads):
        return None
    wanted = {names[r] for r in call.reads}
    matches = [n for n in graph.nodes
               if n.callee == call.callee and wanted <= set(n.producers)]
    return matches[0] if len(matches) == 1 else None
