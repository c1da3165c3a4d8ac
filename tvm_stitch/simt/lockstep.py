"""Warp-synchronous updates of shared memory, run on the SIMT runner as a warp runs them.

Some of TVM's own GPU kernels update a shared buffer in place from another thread's element
of it with no barrier in between: the scan of ``gpu_2d_continuous_cumsum`` (every
``CumSum``) adds ``if tx >= 2**i: s[t] = s[t] + s[t - 2**i]`` step by step. A warp executes
that statement in lockstep, every lane loading before any lane stores, so each reads its
partner's value from before the step. PoCL runs the work-items of a work-group one after the
other between barriers: the partner has already stored its new value, and RoBERTa's
position ids (a cumulative sum of its attention mask) came out wrong in both flows.

:func:`in_lockstep` rewrites each such update as lockstep runs it: every thread computes the
value into a register, a work-group barrier, the store, a barrier. Only where a barrier is
legal: no enclosing branch or loop depends on the thread. An update that reads only its own
element (an accumulator, ``s[t] = s[t] + v``) is left as it is: nothing races.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import IRModule
from tvm.sym import Analyzer

_STORAGE_SYNC = tvm.ir.Op.get("tirx.tvm_storage_sync")


def in_lockstep(device: IRModule) -> IRModule:
    """``device`` with every warp-synchronous update of shared memory in its kernels
    rewritten as the module docstring says."""
    return IRModule({gv: _kernel(func) if isinstance(func, tirx.PrimFunc) else func
                     for gv, func in device.functions_items()})


def _kernel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    body = _Rewriter().stmt(func.body, uniform=True)
    return func if body.same_as(func.body) else tirx.PrimFunc(
        func.params, body, func.ret_type, func.attrs)


def _uses(node: object, variables: set[tvm.ir.Var]) -> bool:
    found: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(node, [(tvm.ir.Var, lambda v: found.append(v)
                                    if any(v.same_as(u) for u in variables) else None)])
    return bool(found)


def _loads(node: object) -> bool:
    found: list[object] = []
    tvm_ffi.structural_walk(node, [(tvm.ir.TensorLoad, found.append)])
    return bool(found)


def _races(store: tirx.BufferStore, ana: Analyzer,
           condition: tvm.ir.PrimExpr | None = None) -> bool:
    """Whether a scalar store to shared memory (by the threads where ``condition`` holds)
    reads the same buffer at another index that such a thread may store to in the same
    statement. A tree reduction's step (``if t < k: s[t] = s[t] + s[t + k]``) reads only
    what no thread of it writes (``ana`` knows the thread indices' and loops' ranges)."""
    if store.buffer.scope() != "shared" or store.value.ty.dtype.lanes != 1 \
            or len(store.indices) != 1:
        return False
    others: list[tvm.ir.TensorLoad] = []

    def on_load(load: tvm.ir.TensorLoad) -> None:
        if load.source.same_as(store.buffer) and not tvm_ffi.structural_equal(
                list(load.indices), list(store.indices)):
            others.append(load)

    tvm_ffi.structural_walk(store.value, [(tvm.ir.TensorLoad, on_load)])
    if not others:
        return False
    with ana.constraint_scope(tirx.const(True) if condition is None else condition):
        written = ana.const_int_bound(store.indices[0])
        read = [ana.const_int_bound(load.indices[0]) for load in others
                if len(load.indices) == 1]
    return len(read) < len(others) or any(
        r.min_value <= written.max_value and written.min_value <= r.max_value for r in read)


def _sync() -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_intrin("int32", _STORAGE_SYNC, "shared"))


class _Rewriter:
    """Walks a kernel knowing which variables depend on the thread (its thread indices and
    what is bound from them or from memory) and whether a barrier is legal where it is."""

    def __init__(self) -> None:
        self.varying: set[tvm.ir.Var] = set()
        self.ana = Analyzer()  # the ranges of thread indices and loop variables, the bindings

    def _varies(self, expr: object) -> bool:
        return _uses(expr, self.varying) or _loads(expr)

    def stmt(self, s: tirx.Stmt, uniform: bool) -> tirx.Stmt:
        if isinstance(s, tirx.SeqStmt):
            seq = [self.stmt(c, uniform) for c in s.seq]
            return s if all(a.same_as(b) for a, b in zip(seq, s.seq, strict=True)) \
                else tirx.SeqStmt(seq)
        if isinstance(s, tirx.AttrStmt):
            if s.attr_key == "thread_extent" and s.node.thread_tag.startswith("threadIdx"):
                self.varying.add(s.node.var)
                self.ana.bind(s.node.var, tvm.ir.Range.from_min_extent(
                    tirx.const(0, s.node.var.ty.dtype), s.value))
            body = self.stmt(s.body, uniform)
            return s if body.same_as(s.body) else tirx.AttrStmt(s.node, s.attr_key, s.value,
                                                                 body)
        if isinstance(s, tirx.Bind):
            if self._varies(s.value):
                self.varying.add(s.var)
            if not _loads(s.value):
                self.ana.bind(s.var, s.value)
            return s
        if isinstance(s, tirx.For):
            inner = uniform and not self._varies([s.min, s.extent])
            self.ana.bind(s.loop_var, tvm.ir.Range.from_min_extent(s.min, s.extent))
            body = self.stmt(s.body, inner)
            return s if body.same_as(s.body) else tirx.For(
                s.loop_var, s.min, s.extent, s.kind, body, s.thread_binding, s.annotations)
        if isinstance(s, tirx.IfThenElse):
            if uniform and s.else_case is None \
                    and (update := _update(s.then_case, self.ana, s.condition)):
                return _lockstep(s.condition, *update)
            inner = uniform and not self._varies(s.condition)
            then = self.stmt(s.then_case, inner)
            other = None if s.else_case is None else self.stmt(s.else_case, inner)
            if then.same_as(s.then_case) and (other is None or other.same_as(s.else_case)):
                return s
            return tirx.IfThenElse(s.condition, then, other)
        if isinstance(s, tirx.BufferStore) and uniform and _races(s, self.ana):
            return _lockstep(None, [], s)
        return s  # nothing inside a While, whose trip count may differ by thread


def _update(s: tirx.Stmt, ana: Analyzer, condition: tvm.ir.PrimExpr
            ) -> tuple[list[tirx.Bind], tirx.BufferStore] | None:
    """The bindings of pure arithmetic and the racing store a branch taken where
    ``condition`` holds consists of, if so."""
    stmts = list(s.seq) if isinstance(s, tirx.SeqStmt) else [s]
    *binds, store = stmts
    if not isinstance(store, tirx.BufferStore) \
            or not all(isinstance(b, tirx.Bind) and not _loads(b.value) for b in binds):
        return None
    for b in binds:
        ana.bind(b.var, b.value)
    return (binds, store) if _races(store, ana, condition) else None


def _lockstep(condition: tvm.ir.PrimExpr | None, binds: list[tirx.Bind],
              store: tirx.BufferStore) -> tirx.Stmt:
    """``if condition: binds; store`` as a warp runs it: the value first, then the store."""
    dtype = store.value.ty.dtype
    value = tvm.ir.Var("lockstep_value", dtype)
    stmts: list[tirx.Stmt] = list(binds)
    if condition is None:
        stmts += [tirx.Bind(value, store.value), _sync(),
                  tirx.BufferStore(store.buffer, value, store.indices)]
    else:
        taken = tvm.ir.Var("lockstep_taken", "bool")
        stmts += [tirx.Bind(taken, condition),
                  tirx.Bind(value, tirx.if_then_else(taken, store.value,
                                                     tirx.const(0, dtype))),
                  _sync(),
                  tirx.IfThenElse(taken, tirx.BufferStore(store.buffer, value, store.indices),
                                  None)]
    return tirx.SeqStmt([*stmts, _sync()])
