"""The guards of a Global group's run-time row tiles, in the forms TVM schedules and lowers,
and of the stores of its column sums (``stores_within_columns``).

A Global group of a run-time row count splits each column reduction's rows into a wave of
row tiles of ``max(ceil(rows / tiles), min_steps)`` rows, the rows past the end guarded by
the blocks' predicates (``tile * steps + step < rows``), the tiles past them idle
(``tiles_with_rows``). Two TVM constraints decide where those guards may stand:

- TVM proves a predicated block affine in the schedule that split it, but a schedule built
  afresh from the function (the phases are reordered that way) tries to fit the predicate
  into an iterator map, which a symbolic step count defeats: a reduction block is then
  neither complete nor a reduction, and no loop above it can be bound to the grid. Its
  predicate becomes part of its update, ``acc = p ? acc + x : acc`` (``guards_in_updates``).
- TVM lowers a predicate to an ``if`` around the block and cannot put a barrier inside one,
  so a block that stages a guarded row on chip stores ``p ? value : 0`` instead
  (``on_chip_writes_unconditional``).

TVM's ``if_then_else`` evaluates only the branch taken: no row past the end is read.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer


def guards_in_updates(func: tirx.PrimFunc, names: set[str]) -> tirx.PrimFunc:
    """``func`` with the predicate of each reduction block named in ``names`` moved into its
    update (see the module docstring); blocks without a predicate stay as they are."""

    def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
        block = realize.block
        predicate = realize.predicate
        if block.name_hint not in names or block.init is None or _always(predicate):
            return realize
        loop_to_iter = {}
        for iv, value in zip(block.iter_vars, realize.iter_values, strict=True):
            assert isinstance(value, tvm.ir.Var), (block.name_hint, value)
            loop_to_iter[value] = iv.var
        condition = tvm_ffi.structural_map(predicate, [(
            tvm.ir.Var, lambda v: next((i for loop, i in loop_to_iter.items()
                                        if loop.same_as(v)), v))])
        return s_tir.stmt.SBlockRealize(realize.iter_values, tirx.const(True, "bool"),
                                        _with_body(block, _guarded(block.body, condition,
                                                                   block.name_hint)))

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlockRealize, on_realize)])


def _guarded(body: tirx.Stmt, condition: tvm.ir.PrimExpr, name: str) -> tirx.Stmt:
    """A reduction's update ``body`` that changes nothing where ``condition`` fails: each
    store keeps the value it had, and each value a pair's update binds first (an online
    softmax's rescaled sum and new maximum) is 0 there, its loads (of rows past the end)
    never evaluated."""
    if isinstance(body, tirx.BufferStore):
        kept = tirx.BufferLoad(body.buffer, body.indices)
        return tirx.BufferStore(body.buffer, tirx.if_then_else(condition, body.value, kept),
                                body.indices)
    if isinstance(body, tirx.Bind):
        zero = tirx.const(0, str(body.value.ty.dtype))
        return tirx.Bind(body.var, tirx.if_then_else(condition, body.value, zero))
    assert isinstance(body, tirx.SeqStmt), (name, type(body))
    return tirx.SeqStmt([_guarded(s, condition, name) for s in body])


def _always(predicate: tvm.ir.PrimExpr) -> bool:
    return isinstance(predicate, tirx.IntImm) and int(predicate) == 1


def _with_body(block: s_tir.stmt.SBlock, body: tirx.Stmt) -> s_tir.stmt.SBlock:
    return s_tir.stmt.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                             block.init, block.alloc_buffers, block.match_buffers,
                             block.annotations)


def tiles_with_rows(func: tirx.PrimFunc, write_outs: set[str], combines: set[str],
                    per_tile: set[str], rows: tvm.ir.PrimExpr, tiles: int,
                    min_steps: int) -> tirx.PrimFunc:
    """``func`` whose ``tiles`` row tiles walk ``steps = max(ceil(rows / tiles), min_steps)``
    rows each (``rows`` known at run time; the split made them ``ceil(rows / tiles)``, and
    every place spells that alike), and whose tiles past the rows read and write nothing:
    their staging and zero partial sums would cost reads and writes (all but one of a wave
    of them for one row). A block of ``write_outs`` stores tile ``t`` (the first index of
    what it writes) only when ``t * steps < rows``; a block of ``combines`` adds tile ``t``
    (its reduction iterator) only then; a block of ``per_tile`` (an input staged once per
    tile) runs only when its thread block's tile has rows."""
    dtype = str(rows.ty.dtype)
    even = tirx.floordiv(rows + tirx.IntImm(dtype, tiles - 1), tirx.IntImm(dtype, tiles))
    # every split of the rows into the tiles spells its steps so: each becomes the longer walk
    steps = tirx.Max(even, tirx.IntImm(dtype, min_steps))
    func = tvm_ffi.structural_map(func, [(tirx.FloorDiv, lambda d: steps if
                                          tvm_ffi.structural_equal(d, even) else d)])

    def has_rows(tile: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
        if str(tile.ty.dtype) != str(rows.ty.dtype):
            tile = tirx.Cast(str(rows.ty.dtype), tile)
        return tile * steps < rows

    def on_block(block: s_tir.stmt.SBlock) -> s_tir.stmt.SBlock:
        if block.name_hint in write_outs:
            (written,) = block.writes
            return _with_body(block, tirx.IfThenElse(has_rows(written.region[0].min),
                                                     block.body, None))
        if block.name_hint in combines:
            (tile,) = [iv.var for iv in block.iter_vars
                       if iv.iter_type == tirx.IterVar.CommReduce]
            return _with_body(block, _guarded(block.body, has_rows(tile), block.name_hint))
        return block

    def on_loop(loop: tirx.For) -> tirx.For:
        if loop.kind != tirx.ForKind.THREAD_BINDING \
                or loop.thread_binding.thread_tag != "blockIdx.x":
            return loop
        guard = has_rows(loop.loop_var)

        def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
            if realize.block.name_hint not in per_tile:
                return realize
            return s_tir.stmt.SBlockRealize(realize.iter_values,
                                            tirx.And(realize.predicate, guard), realize.block)

        body = tvm_ffi.structural_map(loop.body, [(s_tir.stmt.SBlockRealize, on_realize)])
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                        loop.thread_binding, loop.annotations)

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlock, on_block), (tirx.For, on_loop)])


def stores_within_columns(func: tirx.PrimFunc, stores: dict[str, str]) -> tirx.PrimFunc:
    """``func`` whose blocks named in ``stores`` (the store of a column phase's sum out of
    its thread's register) run only where their sum's block (``stores[name]``) has a column:
    each spatial binding of that block below its extent. A thread past the last column of a
    partial task sums nothing, and TVM guarded the store that ``reverse_compute_at`` placed
    for one result of a pair and not for the other, which wrote past the end (an online
    softmax's maximum over the 8160 columns of (2, 32, 255) on 8 tasks of 1024 threads)."""
    bounds: dict[str, list[tvm.ir.PrimExpr]] = {}

    def collect(realize: s_tir.stmt.SBlockRealize) -> None:
        block = realize.block
        if block.name_hint in stores.values():
            bounds[block.name_hint] = [
                value < iv.dom.min + iv.dom.extent
                for iv, value in zip(block.iter_vars, realize.iter_values, strict=True)
                if iv.iter_type == tirx.IterVar.DataPar]

    tvm_ffi.structural_walk(func, [(s_tir.stmt.SBlockRealize, collect)])

    def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
        name = realize.block.name_hint
        if name not in stores:
            return realize
        guards = bounds[stores[name]]
        predicate = _all([realize.predicate, *guards]) if not _always(realize.predicate) \
            else _all(guards) if guards else realize.predicate
        return s_tir.stmt.SBlockRealize(realize.iter_values, predicate, realize.block)

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlockRealize, on_realize)])


def on_chip_writes_unconditional(func: tirx.PrimFunc, rows: tvm.ir.PrimExpr
                                 ) -> tirx.PrimFunc:
    """``func`` whose blocks that write only on-chip buffers store rows past ``rows`` (a
    run-time row count) under no predicate: such a block stores ``row < rows ? value : 0``
    instead. The rows of a run-time tile past the end stage values in shared memory that
    other threads read, and a barrier the shared buffers need (TVM may lay two of them over
    one another) fell inside the guard. The on-chip buffers hold one row at a time, so the
    guarded row's store stays in bounds, and what it stores is never read for a global
    write or a partial sum, which keep their guards. Other conditions (a partial thread's)
    stay predicates."""
    ana = Analyzer()  # knows the unit loops, which bindings add and predicates may not

    def bind_unit(loop: tirx.For) -> None:
        if isinstance(loop.extent, tirx.IntImm) and int(loop.extent) == 1:
            ana.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))

    tvm_ffi.structural_walk(func, [(tirx.For, bind_unit)])

    def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
        block, predicate = realize.block, realize.predicate
        if _always(predicate) or block.init is not None \
                or not isinstance(block.body, tirx.BufferStore) \
                or any(w.source.scope() == "global" for w in block.writes):
            return realize
        moved, kept = [], []
        for c in _conjuncts(predicate):
            row = _row_guarded(c, block, list(realize.iter_values), rows, ana)
            (kept if row is None else moved).append(c if row is None else row < rows)
        if not moved:
            return realize
        store = block.body
        zero = tirx.const(0, str(store.value.ty.dtype))
        guarded = tirx.BufferStore(store.buffer, tirx.if_then_else(
            _all(moved), store.value, zero), store.indices)
        return s_tir.stmt.SBlockRealize(realize.iter_values,
                                        _all(kept) if kept else tirx.const(True, "bool"),
                                        _with_body(block, guarded))

    return tvm_ffi.structural_map(func, [(s_tir.stmt.SBlockRealize, on_realize)])


def _conjuncts(e: tvm.ir.PrimExpr) -> list[tvm.ir.PrimExpr]:
    if isinstance(e, tirx.And):
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _all(conditions: list[tvm.ir.PrimExpr]) -> tvm.ir.PrimExpr:
    out = conditions[0]
    for c in conditions[1:]:
        out = tirx.And(out, c)
    return out


def _row_guarded(condition: tvm.ir.PrimExpr, block: s_tir.stmt.SBlock,
                 values: list[tvm.ir.PrimExpr], rows: tvm.ir.PrimExpr, ana: Analyzer
                 ) -> tvm.ir.Var | None:
    """The iterator of ``block`` that ``condition`` keeps below ``rows`` (``a < rows`` with
    ``a`` its binding, up to unit loops), or None."""
    if not isinstance(condition, tirx.LT) or not ana.can_prove_equal(condition.b, rows):
        return None
    return next((iv.var for iv, value in zip(block.iter_vars, values, strict=True)
                 if ana.can_prove_equal(condition.a, value)), None)


__all__ = ["guards_in_updates", "on_chip_writes_unconditional", "stores_within_columns",
           "tiles_with_rows"]
