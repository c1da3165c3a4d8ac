"""Rows of symbolic length staged on chip for a declared bound, checked at run time.

A row whose length is known only at run time has no size to stage: its re-read inputs are
read again from global memory and its Regional intermediates recomputed. When the length's
shape variables have declared upper bounds (``symbolic.declared_bounds``), the plan stages
them on chip sized for the bounds (``ThreadMapping.length_bound``) and keeps the re-reading
plan as the kernel's second body (``Group.beyond_bound``). Emission then gives every on-chip
buffer of the first body its bounded size, and puts both bodies under the kernel's block
loop behind one run-time check: every shape variable of those sizes within its bound runs
the staged body; any beyond runs the re-reading one, with the same threads. No index of an
on-chip buffer can then pass its size, at any length.

TVM sizes an on-chip buffer from the region its block loop touches, and a loop of run-time
extent gives a size of run-time extent, which CUDA cannot declare; each symbolic dimension
of the staged body's buffers is therefore indexed modulo its bound (the identity where the
check holds), which TVM sizes as the bound.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.tirx.op import tvm_thread_invariant

from ..symbolic import declared_bounds, shape_vars, upper_bound
from .blocks import child_blocks
from .persistent import is_block_loop, with_root


def bound_on_chip(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, list[tvm.ir.Var]]:
    """``func`` (a scheduled row kernel) with every on-chip buffer of symbolic element
    dimensions indexed modulo the bounds of those dimensions, and the shape variables whose
    bounds that relies on. The row dimension (the first) is left alone: a block holds its
    own rows of it."""
    bounds = declared_bounds(func.attrs)
    sch = s_tir.Schedule(func)
    relied: list[tvm.ir.Var] = []
    for block in child_blocks(sch):
        for index, region in enumerate(sch.get(block).writes):
            buffer = region.source
            dims = list(buffer.shape)
            if buffer.scope() == "global" or not shape_vars(dims[1:]):
                continue
            limits = [None] + [upper_bound(d, bounds) if shape_vars([d]) else None
                               for d in dims[1:]]
            if any(shape_vars([d]) and limit is None
                   for d, limit in zip(dims[1:], limits[1:], strict=True)):
                raise AssertionError(f"{buffer.name}: a staged dimension of {dims} has no "
                                     f"declared bound in {bounds}")
            relied.extend(v for d in dims[1:] for v in shape_vars([d]))
            sch.transform_layout(block, ("write", index), _modulo(limits),
                                 assume_injective_transform=True)
    unique = list({str(v.name): v for v in relied}.values())
    return sch.mod["main"], unique


def _modulo(limits: list[int | None]) -> Callable[..., tuple]:
    """An index map taking each index modulo its limit (None: as it is)."""
    def index_map(*indices: tvm.ir.PrimExpr) -> tuple:
        return tuple(i if limit is None else tirx.floormod(i, limit)
                     for i, limit in zip(indices, limits, strict=True))

    return index_map


def _renamed(stmt: tirx.Stmt, source: tirx.PrimFunc, target: tirx.PrimFunc,
             var_map: dict[tvm.ir.Var, tvm.ir.Var]) -> tirx.Stmt:
    """``stmt``, a statement of ``source``, over the parameters (and their shape variables)
    of ``target`` instead: two schedules of one PrimFunc have equal parameters, not the
    same objects."""
    buffers: dict[tirx.Buffer, tirx.Buffer] = {}
    var_map = dict(var_map)
    for mine, theirs in zip(source.params, target.params, strict=True):
        if isinstance(mine.ty, tirx.BufferType):
            buffers[mine] = theirs
            var_map.update((a, b) for a, b in zip(mine.shape, theirs.shape, strict=True)
                           if isinstance(a, tvm.ir.Var))
        else:
            var_map[mine] = theirs

    def lookup(pairs: dict, node):  # by identity: a Var's == builds an expression
        return next((new for old, new in pairs.items() if old.same_as(node)), node)

    renamed = tvm_ffi.structural_map(stmt, [(tvm.ir.Var, lambda v: lookup(var_map, v))])
    return tvm_ffi.structural_map(renamed, [(tirx.Buffer, lambda b: lookup(buffers, b))])


def with_length_check(staged: tirx.PrimFunc, beyond: tirx.PrimFunc,
                      relied: list[tvm.ir.Var]) -> tirx.PrimFunc:
    """One kernel of the bodies of ``staged`` and ``beyond`` (both scheduled from one
    PrimFunc with the same block loop): under the block loop, ``staged``'s body when every
    variable of ``relied`` is within its declared bound, else ``beyond``'s. The check is
    marked thread-invariant (it reads shape values only), so that TVM's barriers may be
    inside its bodies."""
    bounds = declared_bounds(staged.attrs)
    first, second = staged.body.block.body, beyond.body.block.body
    assert is_block_loop(first) and is_block_loop(second), (type(first), type(second))
    second = _renamed(second, beyond, staged, {second.loop_var: first.loop_var})
    assert tvm_ffi.structural_equal(first.extent, second.extent), (first.extent, second.extent)
    checks = [v <= tirx.IntImm(v.ty.dtype, bounds[str(v.name)]) for v in relied]
    condition = checks[0]
    for check in checks[1:]:
        condition = tirx.And(condition, check)
    body = tirx.For(first.loop_var, first.min, first.extent, first.kind,
                    tirx.IfThenElse(tvm_thread_invariant(condition), first.body, second.body),
                    first.thread_binding, first.annotations)
    allocs = [*staged.body.block.alloc_buffers, *beyond.body.block.alloc_buffers]
    return with_root(staged, body=body, alloc_buffers=allocs)
