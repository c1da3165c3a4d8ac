"""Outline each group of bindings into a private Relax function marked ``Primitive``.

FuseTIR then merges every such function into one PrimFunc. The main function keeps one call
per group; bindings are re-emitted in a topological order of groups and single bindings
(grouping only makes convex groups, so that order exists), preferring the original order.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import tvm
from tvm import relax
from tvm.ir import IRModule

from ..graph.dataflow import DataflowGraph, Node
from ..graph.dominants import group_outputs, passed_views
from ..graph.grouping import OpGroup
from ..symbolic import shape_vars


@relax.expr_functor.mutator
class _Outliner(relax.PyExprMutator):
    """Rewrites the dataflow blocks of one function, replacing each group by a call."""

    def __init__(self, mod: IRModule, graphs: Sequence[DataflowGraph],
                 groups: Sequence[tuple[OpGroup, str]]) -> None:
        super().__init__(mod)
        self.graphs = list(graphs)
        self.groups = list(groups)
        self.functions: dict[str, str] = {}  # requested name -> name in the module

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        """Re-emit ``block`` with one call per group of it, in a valid order."""
        graph = next((g for g in self.graphs if g.block.same_as(block)), None)
        mine = [(og, name) for og, name in self.groups if graph is not None and og.graph is graph]
        if not mine:
            return super().visit_dataflow_block_(block)
        self.builder_._begin_dataflow_block()
        for unit in _schedule_units(graph, [og for og, _ in mine]):
            if isinstance(unit, Node):
                self.visit_binding(unit.binding)
            else:
                name = next(n for og, n in mine if og is unit)
                self._emit_group(unit, name)
        return self.builder_._end_block()

    def _emit_group(self, group: OpGroup, name: str) -> None:
        inputs = _external_inputs(group)
        # shape values (``past``, which an op over ``past + 1`` takes besides its tensors)
        # stay themselves; a Shape parameter defines them in the function
        shape_values = [x for x in inputs if tvm.ir.is_prim_expr(x)]
        inputs = [x for x in inputs if not tvm.ir.is_prim_expr(x)]
        shape_values += _undefined_shape_vars(group, inputs, shape_values)
        outputs = group_outputs(group)
        params = [relax.Var(_param_name(x, i), x.ty) for i, x in enumerate(inputs)]
        remap = list(zip(inputs, params, strict=True))
        if shape_values:
            params.append(relax.Var("tir_vars", relax.ShapeType(shape_values)))
        bb = relax.BlockBuilder()
        with bb.function(name, params, attrs={"Primitive": True}, private=True):
            with bb.dataflow():
                for node in group.nodes:
                    call = node.binding.value
                    args = [_lookup(remap, a) for a in node.inputs]
                    new_call = relax.Call(call.op, [call.args[0], relax.Tuple(args)],
                                          call.attrs, call.ty_args)
                    remap.append((node.var, bb.emit(new_call, name_hint=node.var.name)))
                results = [bb.emit_output(_lookup(remap, n.var)) for n in outputs]
            bb.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
        gv = self.builder_.add_func(bb.get()[name], name)
        self.functions[name] = gv.name_hint
        call = relax.Call(gv, [self.visit_expr(x) for x in inputs]
                          + ([relax.ShapeExpr(shape_values)] if shape_values else []))
        if len(outputs) == 1:
            self._rebind(outputs[0], call)
        else:
            packed = self.builder_.emit(call, name_hint=f"{name}_out")
            for i, node in enumerate(outputs):
                self._rebind(node, relax.TupleGetItem(packed, i))
        for node in passed_views(group):  # views of outputs, made of what the call returns
            self.visit_binding(node.binding)

    def _rebind(self, node: Node, value: relax.Expr) -> None:
        if isinstance(node.var, relax.DataflowVar):
            new = self.builder_.emit(value, name_hint=node.var.name)
        else:
            new = self.builder_.emit_output(value, name_hint=node.var.name)
        self.set_var_remap(node.var, new)


def _param_name(expr: relax.Expr, index: int) -> str:
    return expr.name if isinstance(expr, relax.Var) else f"const{index}"


def _lookup(remap: list[tuple[relax.Expr, relax.Expr]], expr: relax.Expr) -> relax.Expr:
    for old, new in remap:
        if old.same_as(expr):
            return new
    return expr


def _undefined_shape_vars(group: OpGroup, inputs: list[relax.Expr],
                          shape_values: list[tvm.ir.PrimExpr]) -> list[tvm.ir.Var]:
    """Shape variables that the results of ``group`` use but that neither its tensor inputs'
    shapes nor ``shape_values`` define: a broadcast to ``(batch, seq, 32)`` of a
    ``(batch, 1, 32)`` tensor, whose ``seq`` TVM binds from the output it is given, which a
    group's intermediate is not. The group's function takes them as shape values."""
    defined = {str(d.name) for x in inputs if isinstance(x.ty, relax.TensorType)
               and x.ty.shape is not None for d in x.ty.shape if isinstance(d, tvm.ir.Var)}
    defined |= {str(v.name) for v in shape_values if isinstance(v, tvm.ir.Var)}
    missing: dict[str, tvm.ir.Var] = {}
    for node in group.nodes:
        ty = node.var.ty
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            for v in shape_vars(ty.shape):
                if str(v.name) not in defined:
                    missing.setdefault(str(v.name), v)
    return list(missing.values())


def _external_inputs(group: OpGroup) -> list[relax.Expr]:
    defined = {n.var for n in group.nodes}
    inputs: list[relax.Expr] = []
    for node in group.nodes:
        for arg in node.inputs:
            if isinstance(arg, relax.Var) and arg in defined:
                continue
            if not any(arg.same_as(x) for x in inputs):
                inputs.append(arg)
    return inputs


def _schedule_units(graph: DataflowGraph, groups: list[OpGroup]) -> list[Node | OpGroup]:
    """Groups and remaining single bindings in a topological order, original order first."""
    unit_of: dict[int, int] = {}
    units: list[Node | OpGroup] = []
    for g in groups:
        for i in g.members:
            unit_of[i] = len(units)
        units.append(g)
    for node in graph.nodes:
        if node.index not in unit_of:
            unit_of[node.index] = len(units)
            units.append(node)
    deps: list[set[int]] = [set() for _ in units]
    users: list[set[int]] = [set() for _ in units]
    for node in graph.nodes:
        u = unit_of[node.index]
        for p in node.producers:
            v = unit_of[p]
            if v != u:
                deps[u].add(v)
                users[v].add(u)
    first = [min(u.members) if isinstance(u, OpGroup) else u.index for u in units]
    ready = [(first[u], u) for u in range(len(units)) if not deps[u]]
    heapq.heapify(ready)
    order: list[Node | OpGroup] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(units[u])
        for w in users[u]:
            deps[w].discard(u)
            if not deps[w]:
                heapq.heappush(ready, (first[w], w))
    if len(order) != len(units):
        raise RuntimeError("grouping formed a cycle between kernels")
    return order


def outline(mod: IRModule, graphs: Sequence[DataflowGraph],
            groups: Sequence[tuple[OpGroup, str]], func_name: str = "main"
            ) -> tuple[IRModule, dict[str, str]]:
    """``mod`` with every group of ``groups`` (group, requested function name) outlined.

    Returns the new module and the map from requested to actual function names.
    """
    outliner = _Outliner(mod, graphs, groups)
    func = outliner.visit_expr(mod[func_name])
    new = outliner.builder_.get()
    new[func_name] = func
    return new, outliner.functions


__all__ = ["outline"]
