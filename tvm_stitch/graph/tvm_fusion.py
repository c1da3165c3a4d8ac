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
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import IRModule

from .dataflow import DataflowGraph, is_call_tir

# A value key: an unfused binding's (or parameter's) Var, or a tuple describing how a value is
# computed from keys. Vars hash and compare by identity.
Key = Hashable


@dataclass(frozen=True)
class _TupleKey:
    """The key of a tuple value whose fields have keys of their own."""

    fields: tuple[Key, ...]


def tvm_fusion_groups(mod: IRModule, func_name: str = "main") -> list[frozenset[relax.Var]]:
    """The call_tir bindings of ``mod[func_name]`` that FuseOps fuses together, one set of
    binding variables per call of an outlined function (identical layers give one set each).

    ``mod`` must have its op patterns annotated (after AnnotateTIROpPattern).
    """
    func = mod[func_name]
    if not isinstance(func, relax.Function):
        return []
    fused = relax.transform.FuseOps()(mod)
    index = _ValueIndex(func)
    env: dict[relax.Var, Key] = dict(zip(fused[func_name].params, func.params, strict=True))
    groups: list[frozenset[relax.Var]] = []
    for binding in _bindings(fused[func_name].body):
        callee = _primitive_callee(fused, binding.value)
        if callee is None:
            env[binding.var] = index.take(_key(binding.value, env))
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
            groups.append(frozenset(members))
    return groups


def resolve(graph: DataflowGraph, groups: list[frozenset[relax.Var]]) -> list[frozenset[int]]:
    """The node indices of ``graph`` in each FuseOps group (variables of other blocks are
    left out)."""
    out = []
    for group in groups:
        nodes = frozenset(n.index for n in map(graph.node_of, group) if n is not None)
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
    if isinstance(expr, relax.Var):
        return env.get(expr, ("unknown", expr))
    if isinstance(expr, relax.Tuple):
        return _TupleKey(tuple(_key(f, env) for f in expr.fields))
    if isinstance(expr, relax.TupleGetItem):
        base = _key(expr.tuple_value, env)
        if isinstance(base, _TupleKey):
            return base.fields[expr.index]
        return ("item", base, expr.index)
    if isinstance(expr, relax.Call):
        return ("call", _key(expr.op, env), tuple(_key(a, env) for a in expr.args),
                None if expr.attrs is None else tvm_ffi.structural_hash(expr.attrs))
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
