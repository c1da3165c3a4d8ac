"""The dataflow graph of a Relax function after LegalizeOps: one node per binding.

Grouping works inside one dataflow block at a time; bindings are already in topological
order there, so a node's index is its topological position.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule

from .ops import OpInfo, classify

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass
class Node:
    """One binding of a dataflow block.

    ``info`` is set for ``call_tir`` bindings of a PrimFunc of the module; ``inputs`` are the
    tensor arguments of such a call (variables or constants), in order.
    """

    index: int
    name: str
    binding: relax.Binding
    callee: str = ""
    info: OpInfo | None = None
    inputs: tuple[relax.Expr, ...] = ()
    producers: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    escapes: bool = False  # its value is used after the dataflow block

    @property
    def var(self) -> relax.Var:
        """The variable this binding defines."""
        return self.binding.var

    @property
    def label(self) -> str:
        """``name:callee`` for call_tir bindings, else the name."""
        return f"{self.name}:{self.callee}" if self.callee else self.name


@dataclass
class DataflowGraph:
    """The bindings of one dataflow block with their dependences."""

    block: relax.DataflowBlock
    nodes: list[Node]

    def node_of(self, var: relax.Var) -> Node | None:
        """The node that defines ``var`` in this block, or None."""
        index = self._defs.get(var)
        return None if index is None else self.nodes[index]

    def __post_init__(self) -> None:
        self._defs = {n.var: n.index for n in self.nodes}


def dataflow_graphs(mod: IRModule, func_name: str = "main") -> list[DataflowGraph]:
    """One graph per dataflow block of ``mod[func_name]``."""
    func = mod[func_name]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    blocks = list(func.body.blocks)
    graphs = []
    for i, block in enumerate(blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        later_uses = _used_vars([*blocks[i + 1:]], func.body.body)
        graphs.append(_build(mod, block, later_uses))
    return graphs


def _used_vars(blocks: list[relax.BindingBlock], result: relax.Expr) -> set[relax.Var]:
    used = set(relax.analysis.free_vars(result))
    for block in blocks:
        for b in block.bindings:
            used.update(relax.analysis.free_vars(b.value))
    return used


def _build(mod: IRModule, block: relax.DataflowBlock, later_uses: set[relax.Var]
           ) -> DataflowGraph:
    nodes: list[Node] = []
    defs: dict[relax.Var, int] = {}
    names: dict[str, int] = {}
    for i, binding in enumerate(block.bindings):
        base = binding.var.name
        names[base] = names.get(base, 0) + 1
        name = base if names[base] == 1 else f"{base}#{names[base]}"
        node = Node(i, name, binding)
        value = binding.value
        if isinstance(binding, relax.VarBinding) and is_call_tir(value):
            node.callee, node.info, node.inputs = _call_tir_facts(mod, value)
        for var in relax.analysis.free_vars(value):
            producer = defs.get(var)
            if producer is not None and producer not in node.producers:
                node.producers.append(producer)
                nodes[producer].consumers.append(i)
        defs[binding.var] = i
        node.escapes = (binding.var in later_uses
                        or not isinstance(binding.var, relax.DataflowVar))
        nodes.append(node)
    return DataflowGraph(block, nodes)


def is_call_tir(value: relax.Expr) -> bool:
    """Whether ``value`` is a ``relax.call_tir`` call."""
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.same_as(_CALL_TIR))


def _call_tir_facts(mod: IRModule, call: relax.Call
                    ) -> tuple[str, OpInfo | None, tuple[relax.Expr, ...]]:
    gv = call.args[0]
    callee = gv.name_hint
    known = {g.name_hint for g in mod.get_global_vars()}
    func = mod[callee] if callee in known else None
    if not isinstance(func, tirx.PrimFunc):
        return callee, None, ()
    args = call.args[1]
    inputs = tuple(args.fields) if isinstance(args, relax.Tuple) else (args,)
    num_outputs = sum(_tensor_count(t) for t in call.ty_args)
    info = classify(func, num_outputs)
    if len(call.args) > 2:
        info = _mark_unsupported(info, "passes symbolic shape arguments (tir_vars)")
    elif not all(isinstance(a, relax.Var | tvm.ir.GenericConst) for a in inputs):
        info = _mark_unsupported(info, "has arguments that are neither tensors nor constants")
    return callee, info, inputs


def _tensor_count(ty: relax.Type) -> int:
    if isinstance(ty, relax.TupleType):
        return sum(_tensor_count(f) for f in ty.fields)
    return 1


def _mark_unsupported(info: OpInfo, reason: str) -> OpInfo:
    return replace(info, unsupported=info.unsupported or reason)
