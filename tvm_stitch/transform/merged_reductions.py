"""What the one-pass rewrites of reduction pairs share (``online_softmax``,
``online_variance``): finding a fused PrimFunc's reduction blocks and their updates, and
replacing a pair of blocks by one block that writes both results."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import tvm
import tvm_ffi
from tvm import s_tir, tirx

FLOATS = ("float16", "float32", "float64")


def register_reducer(name: str, size: int, combine: Callable, identity: Callable) -> None:
    """Register a combination of ``size`` values with TVM's reduction analysis:
    ``s_tir.schedule.RegisterReducer``, which its rfactor and cross-thread reduction consult
    after their built-in reducers. Done when a rewrite's module is imported (``import
    tvm_stitch`` does), so that every process that lowers a stitched kernel (MetaSchedule's
    builders, the SIMT runner's workers) knows it. The two callbacks are also global
    functions (``tvm_stitch.NAME.combine``, ``.identity``): TVM never frees its global
    registry, so they outlive the interpreter, which the reducer registry, destroyed at exit
    after it, needs (freeing a Python callback then aborts the process)."""
    combine = tvm_ffi.convert(combine)
    identity = tvm_ffi.convert(identity)
    tvm_ffi.register_global_func(f"tvm_stitch.{name}.combine", combine)
    tvm_ffi.register_global_func(f"tvm_stitch.{name}.identity", identity)
    tvm_ffi.get_global_func("s_tir.schedule.RegisterReducer")(size, combine, identity)


def sblocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    """The blocks of ``func`` but its root, in program order."""
    found: list[s_tir.SBlock] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, found.append)])
    return [b for b in found if b.name_hint != "root"]


def update_of(block: s_tir.SBlock) -> tirx.BufferStore | None:
    """The update of a reduction block that writes one buffer: its body's store."""
    body = block.body
    if isinstance(body, tirx.BufferStore) and block.init is not None \
            and len(block.writes) == 1 and len(block.iter_vars) >= 2:
        return body
    return None


def operand_of(store: tirx.BufferStore, op: type) -> tvm.ir.PrimExpr | None:
    """The other operand of ``store``'s value ``op(store's own element, other)``."""
    value = store.value
    if not isinstance(value, op):
        return None
    own = tirx.BufferLoad(store.buffer, store.indices)
    for mine, other in ((value.a, value.b), (value.b, value.a)):
        if tvm_ffi.structural_equal(mine, own):
            return other
    return None


def iter_map(src: s_tir.SBlock, dst: s_tir.SBlock) -> dict[tvm.ir.Var, tvm.ir.PrimExpr]:
    """``src``'s block iterators to ``dst``'s, position by position."""
    return {a.var: b.var for a, b in zip(src.iter_vars, dst.iter_vars, strict=True)}


def same_domain(a: s_tir.SBlock, b: s_tir.SBlock) -> bool:
    """Whether two blocks iterate over the same domain, iterator kinds alike."""
    return len(a.iter_vars) == len(b.iter_vars) and all(
        x.iter_type == y.iter_type and tvm_ffi.structural_equal(x.dom, y.dom)
        for x, y in zip(a.iter_vars, b.iter_vars, strict=True))


def initial_is(block: s_tir.SBlock, value: tvm.ir.PrimExpr) -> bool:
    """Whether ``block``'s init stores ``value``."""
    return isinstance(block.init, tirx.BufferStore) \
        and tvm_ffi.structural_equal(block.init.value, value)


def replaced(func: tirx.PrimFunc, old: s_tir.SBlock, new: s_tir.SBlock, drop: set[str],
             added: Iterable[tirx.Buffer] = (), zeroed: Iterable[tirx.Buffer] = ()
             ) -> tirx.PrimFunc:
    """``func`` with the block ``old`` replaced by ``new``, the loop nests of the blocks
    named in ``drop`` removed, the buffers only those wrote no longer allocated, the
    buffers ``added`` allocated, and each load of a buffer in ``zeroed`` (one of those no
    longer written) replaced by 0."""
    kept = {w.source.name for w in new.writes}
    gone = {w.source.name for b in sblocks(func) if b.name_hint in drop or b.same_as(old)
            for w in b.writes} - kept
    zeros = {b.name for b in zeroed}
    added = list(added)

    def names(stmt: tirx.Stmt) -> set[str]:
        found: list[s_tir.SBlock] = []
        tvm_ffi.structural_walk(stmt, [(s_tir.SBlock, found.append)])
        return {b.name_hint for b in found}

    def on_seq(seq: tirx.SeqStmt) -> tirx.Stmt:
        kept = [stmt for stmt in seq.seq if not names(stmt) & drop]
        assert all(not names(stmt) - drop for stmt in seq.seq if names(stmt) & drop)
        return seq if len(kept) == len(seq.seq) else tirx.SeqStmt(kept)

    def on_load(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        if load.source.name in zeros:
            return tirx.const(0, load.source.dtype)
        return load

    def on_block(block: s_tir.SBlock) -> s_tir.SBlock:
        if block.same_as(old):
            return new
        if block.name_hint == "root":
            allocs = [b for b in block.alloc_buffers if b.name not in gone] + added
            if len(allocs) == len(block.alloc_buffers) and not added:
                return block
            return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                                block.body, block.init, allocs, block.match_buffers,
                                block.annotations)
        if not any(r.source.name in zeros for r in block.reads):
            return block
        body = tvm_ffi.structural_map(block.body, [(tvm.ir.TensorLoad, on_load)])
        return s_tir.SBlock(block.iter_vars,
                            [r for r in block.reads if r.source.name not in zeros],
                            block.writes, block.name_hint, body, block.init,
                            block.alloc_buffers, block.match_buffers, block.annotations)

    return tvm_ffi.structural_map(func, [(tirx.SeqStmt, on_seq), (s_tir.SBlock, on_block)])
