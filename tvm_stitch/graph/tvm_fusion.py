"""What TVM's own FuseOps would fuse: the regions that keep TVM's path.

Compute-intensive ops keep TVM's default path *with* the epilogue FuseOps fuses into them,
and an op we cannot stitch falls back with the producers and consumers FuseOps fuses with it:
taking those away from TVM would add kernels and DRAM round trips compared with TVM. Rather
than re-implement FuseOps' post-dominator rules, we run it on the module and read its groups.

FuseOps gives identical groups (the same layer repeated) ONE outlined function called from
many sites, with the function's bindings named after the first site only. So groups are read
per call site: each site's arguments are followed into the function, and every binding there
is matched to the binding of the unfused function that computes the same value from the same
operands (its *value key*), never by name.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.ir import IRModule
from tvm.s_tir.dlight.analysis import get_root_block

from ..analysis.report import static_bytes
from .dataflow import DataflowGraph, is_call_tir

# A value key: an unfused binding's (or parameter's) Var, or a tuple describing how a value is
# computed from keys. Vars hash and compare by identity.
Key = Hashable


@dataclass(frozen=True)
class _TupleKey:
    """The key of a tuple value whose fields have keys of their own."""

    fields: tuple[Key, ...]


@dataclass(frozen=True)
class FusedGroup:
    """The ops of one kernel of TVM's fusion: a call of a function FuseOps outlined, or of a
    PrimFunc it fused with nothing (``function``, shared by identical groups), ``members``
    (binding variables of the unfused function) and its compulsory bytes, inputs read once
    and outputs written once (None when a shape is symbolic): no kernel of TVM's for these
    ops moves fewer."""

    function: str
    members: frozenset[relax.Var]
    compulsory_bytes: int | None


@dataclass
class TVMFusion:
    """TVM's FuseOps applied to a module: ``fused`` (the outlined module) and its groups."""

    fused: IRModule
    groups: list[FusedGroup]


def tvm_fusion_groups(mod: IRModule, func_name: str = "main") -> TVMFusion:
    """The call_tir bindings of ``mod[func_name]`` that FuseOps fuses together, one group per
    call of an outlined function (identical layers give one group each).

    ``mod`` must have its op patterns annotated (after AnnotateTIROpPattern).
    """
    fused = relax.transform.FuseOps()(mod)
    func = mod[func_name]
    if not isinstance(func, relax.Function):
        return TVMFusion(fused, [])
    index = _ValueIndex(func)
    env: dict[relax.Var, Key] = dict(zip(fused[func_name].params, func.params, strict=True))
    groups: list[FusedGroup] = []
    for binding in _bindings(fused[func_name].body):
        callee = _primitive_callee(fused, binding.value)
        if callee is None:
            env[binding.var] = index.take(_key(binding.value, env))
            if is_call_tir(binding.value) and isinstance(env[binding.var], relax.Var):
                groups.append(_single(fused, binding, env[binding.var]))
            continue
        inner: dict[relax.Var, Key] = {
            p: _key(a, env) for p, a in zip(callee.params, binding.value.args, strict=True)}
        members = set()
        for b in _bindings(callee.body):
            inner[b.var] = index.take(_key(b.value, inner))
            if is_call_tir(b.value) and isinstance(inner[b.var], relax.Var):
                members.add(inner[b.var])
        env[binding.var] = _key(callee.body.body, inner)
        if members:
            sizes = [static_bytes(p.ty) for p in callee.params] + [static_bytes(callee.ret_ty)]
            compulsory = None if None in sizes else sum(sizes)
            groups.append(FusedGroup(binding.value.op.name_hint, frozenset(members), compulsory))
    copies = [i for i, g in enumerate(groups) if len(g.members) > 1
              and _may_be_view(fused, fused[g.function])]
    if copies:
        fused_tir = relax.transform.FuseTIR()(fused)
        for i in copies:
            if _inlined_view(fused_tir[groups[i].function]):
                groups[i] = replace(groups[i], compulsory_bytes=0)
    return TVMFusion(fused, groups)


_INJECTIVE = 2
"""``OpPatternKind::kInjective``: AnnotateTIROpPattern's ``op_pattern`` of a copy."""


def _may_be_view(fused: IRModule, callee: relax.Function) -> bool:
    """Whether FuseOps' function ``callee`` may be a view: one tensor in, one out, and only
    injective PrimFuncs called."""
    calls = [b.value for b in _bindings(callee.body) if is_call_tir(b.value)]
    return len(callee.params) == 1 and isinstance(callee.ret_ty, relax.TensorType) \
        and all(int(fused[c.args[0]].attrs["op_pattern"]) <= _INJECTIVE for c in calls)


def _inlined_view(func: tirx.PrimFunc) -> bool:
    """Whether TVM makes the fused copy ``func`` a view: once dlight's rules inline all but
    its last block, RewriteDataflowReshape finds a reshape in it (two transposes that cancel,
    fuzz graph 12031:139). The unfused blocks alone do not show it."""
    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(get_root_block(sch)))
    try:
        for block in blocks[:-1]:
            sch.compute_inline(block)
    except s_tir.ScheduleError:
        return False
    return bool(relax.analysis.has_reshape_pattern(sch.mod["main"]))


def _single(mod: IRModule, binding: relax.Binding, var: relax.Var) -> FusedGroup:
    """A call_tir FuseOps fused with nothing: a kernel of its own, or none at all for a
    reshape (TVM's RewriteDataflowReshape makes it a view: 0 bytes)."""
    callee = binding.value.args[0]
    args = binding.value.args[1]
    sizes = [static_bytes(a.ty) for a in (args.fields if isinstance(args, relax.Tuple)
                                          else [args])] + [static_bytes(binding.var.ty)]
    func = mod[callee]
    if isinstance(func, tirx.PrimFunc) and relax.analysis.has_reshape_pattern(func):
        sizes = [0]
    return FusedGroup(callee.name_hint, frozenset({var}), None if None in sizes else sum(sizes))


def resolve(graph: DataflowGraph, groups: list[FusedGroup]) -> list[frozenset[int]]:
    """The node indices of ``graph`` in each FuseOps group (variables of other blocks are
    left out)."""
    out = []
    for group in groups:
        nodes = frozenset(n.index for n in map(graph.node_of, group.members) if n is not None)
        if nodes:
            out.append(nodes)
    return out


class _ValueIndex:
    """The bindings of an unfused function by value key; identical values are handed out in
    binding order, one per request."""

    def __init__(self, func: relax.Function) -> None:
        env: dict[relax.Var, Key] = {p: p for p in func.params}
        self._vars: dict[Key, list[relax.Var]] = {}
        for b in _bindings(func.body):
            self._vars.setdefault(_key(b.value, env), []).append(b.var)
            env[b.var] = b.var
        self._taken: dict[Key, int] = {}

    def take(self, key: Key) -> Key:
        """The next unfused binding computing ``key``; ``key`` itself when none does (a value
        FuseOps made up, such as a tuple of a function's results)."""
        candidates = self._vars.get(key, ())
        used = self._taken.get(key, 0)
        if used >= len(candidates):
            return key
        self._taken[key] = used + 1
        return candidates[used]


def _key(expr: relax.Expr, env: dict[relax.Var, Key]) -> Key:
    if isinstance(expr, relax.Var) and expr in env:
        return env[expr]
    if tvm.ir.is_prim_expr(expr) or isinstance(expr, relax.ShapeExpr):
        # FuseOps gives a fused function shape variables of its own: compare them by name
        return ("symbolic", str(expr))
    if isinstance(expr, relax.Var):
        return ("unknown", expr)
    if isinstance(expr, relax.Tuple):
        return _TupleKey(tuple(_key(f, env) for f in expr.fields))
    if isinstance(expr, relax.TupleGetItem):
        base = _key(expr.tuple_value, env)
        if isinstance(base, _TupleKey):
            return base.fields[expr.index]
        return ("item", base, expr.index)
    if isinstance(expr, relax.Call):
        # the result types tell apart calls without tensor arguments (two aranges, of the
        # batch and of the sequence, call one PrimFunc)
        return ("call", _key(expr.op, env), tuple(_key(a, env) for a in expr.args),
                None if expr.attrs is None else tvm_ffi.structural_hash(expr.attrs),
                tuple(map(str, expr.ty_args)))
    if isinstance(expr, tvm.ir.GlobalVar):
        return ("global", expr.name_hint)
    if isinstance(expr, tvm.ir.Op):
        return ("op", expr.name)
    return ("leaf", tvm_ffi.structural_hash(expr))


def _bindings(body: relax.Expr) -> list[relax.Binding]:
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for block in body.blocks for b in block.bindings]


def _primitive_callee(mod: IRModule, value: relax.Expr) -> relax.Function | None:
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
        return None
    func = mod[value.op]
    if isinstance(func, relax.Function) and func.attrs is not None \
            and "Primitive" in func.attrs:
        return func
    return None
