"""Thread-block cluster kernels (``schedule.cluster``) on the SIMT runner: a cluster of ``C``
blocks of ``T`` threads runs as one work-group of ``C x T`` work-items.

OpenCL has no clusters and no distributed shared memory, and TVM's OpenCL code generator
would not know our device functions, so the finalised kernel is rewritten:

- work-item ``t`` of work-group ``g`` plays thread ``t % T`` of block ``g * C + t // T``
  (the block of rank ``t // T`` in cluster ``g``; a 1-D cluster is consecutive blocks);
- every shared buffer of ``S`` elements becomes one of ``C x S``, block ``r``'s elements at
  ``r * S``; a read of another block's element through ``CLUSTER_LOAD`` reads its slice;
- the cluster barrier is a work-group barrier (its OpenCL definition, prepended), and so is
  every block barrier: all blocks of a cluster pass the same barriers in the same order,
  as the kernels ``schedule.cluster`` emits do (one task per block, barriers outside any
  branch), so a barrier of all ``C x T`` work-items only waits longer.

PoCL holds at most ``SIMT_MAX_WORK_ITEMS`` work-items in a work-group: the stitcher builds no
larger clusters.
"""

from __future__ import annotations

import dataclasses

import tvm
import tvm_ffi
from tvm import tirx

from ..lowering import KernelLaunch, LoweredFunc, LoweringError
from ..schedule.cluster import CLUSTER_LOAD, CLUSTER_SYNC, OPENCL_DEFINITION, is_extern_call
from ..target import SIMT_MAX_WORK_ITEMS
from .grid import aliased


def cluster_size(kernel: tirx.PrimFunc) -> int:
    """Blocks per cluster of ``kernel`` (its cluster barriers say), 1 for none."""
    calls: list[tvm.ir.Call] = []
    tvm_ffi.structural_walk(kernel.body, [(tvm.ir.Call, calls.append)])
    sizes = {int(c.args[1]) for c in calls if is_extern_call(c, CLUSTER_SYNC)}
    if len(sizes) > 1:
        raise LoweringError(f"barriers of clusters of {sorted(sizes)} blocks in one kernel")
    return sizes.pop() if sizes else 1


def as_work_groups(lowered: LoweredFunc) -> LoweredFunc:
    """``lowered`` with each cluster kernel rewritten to run a cluster per work-group, and
    its launches resized to match; ``lowered`` itself when it has none."""
    sizes = {gv.name_hint: cluster_size(f) for gv, f in lowered.device.functions_items()}
    if all(size == 1 for size in sizes.values()):
        return lowered
    device = tvm.IRModule({gv.name_hint: f if sizes[gv.name_hint] == 1
                           else _one_work_group(f, sizes[gv.name_hint])
                           for gv, f in lowered.device.functions_items()})
    launches = [_resized(k, sizes[k.kernel]) for k in lowered.launches]
    return dataclasses.replace(lowered, device=device, launches=launches, _source=None)


def with_definition(source: str) -> str:
    """OpenCL ``source`` with the cluster barrier defined where it is called."""
    if CLUSTER_SYNC + "(" not in source or OPENCL_DEFINITION.strip() in source:
        return source
    return OPENCL_DEFINITION + source


def _resized(launch: KernelLaunch, size: int) -> KernelLaunch:
    if size == 1:
        return launch
    extents = dict(launch.launch)
    if set(extents) != {"blockIdx.x", "threadIdx.x"}:
        raise LoweringError(f"{launch.kernel}: a cluster kernel launched over {sorted(extents)}")
    threads = int(extents["threadIdx.x"]) * size
    if threads > SIMT_MAX_WORK_ITEMS:
        raise LoweringError(f"{launch.kernel}: a cluster of {size} blocks of "
                            f"{int(extents['threadIdx.x'])} threads is {threads} work-items, "
                            f"more than a work-group holds ({SIMT_MAX_WORK_ITEMS})")
    return dataclasses.replace(launch, launch=(
        ("blockIdx.x", tirx.IntImm("int32", int(extents["blockIdx.x"]) // size)),
        ("threadIdx.x", tirx.IntImm("int32", threads))))


def _one_work_group(kernel: tirx.PrimFunc, size: int) -> tirx.PrimFunc:
    """``kernel`` (clusters of ``size`` blocks) as one work-group per cluster."""
    extents: dict[str, tuple[tvm.ir.Var, int]] = {}

    def on_extent(attr: tirx.AttrStmt) -> None:
        if attr.attr_key == "thread_extent":
            extents[attr.node.thread_tag] = (attr.node.var, int(attr.value))

    tvm_ffi.structural_walk(kernel.body, [(tirx.AttrStmt, on_extent)])
    if set(extents) != {"blockIdx.x", "threadIdx.x"}:
        raise LoweringError(f"a cluster kernel over {sorted(extents)}")
    (bx, blocks), (tx, threads) = extents["blockIdx.x"], extents["threadIdx.x"]
    group = tvm.ir.Var("cluster", bx.ty)
    item = tvm.ir.Var("item", tx.ty)
    rank = tirx.truncdiv(item, threads)  # finalised: no floor division left to lower
    new_extents = {"blockIdx.x": (group, blocks // size), "threadIdx.x": (item, threads * size)}

    def on_attr(attr: tirx.AttrStmt) -> tirx.Stmt:
        if attr.attr_key != "thread_extent":
            return attr
        var, extent = new_extents[attr.node.thread_tag]
        node = tirx.IterVar(tvm.ir.Range(0, extent), var, tirx.IterVar.ThreadIndex,
                            attr.node.thread_tag)
        return tirx.AttrStmt(node, attr.attr_key, tirx.IntImm(str(attr.value.ty.dtype), extent),
                             attr.body)

    def on_var(var: tvm.ir.Var) -> tvm.ir.PrimExpr:
        if var.same_as(bx):
            return group * size + rank
        if var.same_as(tx):
            return tirx.truncmod(item, threads)
        return var

    body = tvm_ffi.structural_map(kernel.body, [(tirx.AttrStmt, on_attr)])
    body = tvm_ffi.structural_map(body, [(tvm.ir.Var, on_var)])
    return tirx.PrimFunc(kernel.params, _shared_per_rank(body, size, rank), kernel.ret_type,
                         kernel.attrs)


def _shared_per_rank(body: tirx.Stmt, size: int, rank: tvm.ir.PrimExpr) -> tirx.Stmt:
    """``body`` with each shared buffer ``size`` times as large, the block of rank ``r``
    using its slice ``r``; ``CLUSTER_LOAD`` of ``&buf[i]`` from rank ``q`` reads slice
    ``q``."""
    allocs: list[tirx.AllocBuffer] = []
    tvm_ffi.structural_walk(body, [(tirx.AllocBuffer, allocs.append)])
    grown: list[tuple[tvm.ir.Var, tvm.ir.Var, int]] = []  # old, new, elements per block
    for alloc in allocs:
        old = alloc.buffer
        ty = old.ty
        if ty.storage_scope != "shared":
            continue
        if len(ty.shape) != 1 or not isinstance(ty.shape[0], tirx.IntImm):
            raise LoweringError(f"{old.name}: a shared buffer of shape {list(ty.shape)} in a "
                                "cluster kernel")
        elements = int(ty.shape[0])
        new = tvm.ir.Var(old.name, tirx.BufferType(
            ty.dtype, "shared", [tirx.IntImm("int32", elements * size)], (), ty.elem_offset,
            ty.data_alignment, ty.offset_factor, None, ()))
        grown.append((old, new, elements))

    decls: list[tirx.DeclBuffer] = []
    tvm_ffi.structural_walk(body, [(tirx.DeclBuffer, decls.append)])
    for decl in decls:  # TVM's storage rewrite reuses a dead buffer's memory for another
        of = aliased(decl, grown)
        if of is None:
            continue
        alias, (old, new, elements) = decl.buffer, of
        if not tvm_ffi.structural_equal(alias.ty.shape, old.ty.shape) \
                or str(alias.ty.dtype) != str(old.ty.dtype):
            raise LoweringError(f"{alias.name} reuses the memory of {old.name} in another "
                                "shape or type")
        grown.append((alias, tvm.ir.Var(alias.name, new.ty), elements))

    def find(var: tvm.ir.Var) -> tuple | None:
        return next((g for g in grown if g[0].same_as(var)), None)

    def on_data(var: tvm.ir.Var) -> tvm.ir.Var:
        found = find(var)
        return var if found is None else found[1]

    def at(slot: tvm.ir.PrimExpr, elements: int, indices) -> list[tvm.ir.PrimExpr]:
        (i,) = indices
        dtype = str(i.ty.dtype)
        return [tirx.Cast(dtype, slot) * tirx.IntImm(dtype, elements) + i]

    def on_call(call: tvm.ir.Call) -> tvm.ir.PrimExpr:
        if not is_extern_call(call, CLUSTER_LOAD):
            return call
        address, source = call.args[1], call.args[2]
        (load,) = address.args
        found = find(load.source)
        if found is None:
            raise LoweringError(f"{CLUSTER_LOAD} of {load.source.name}, not a shared buffer")
        return tirx.BufferLoad(found[1], at(source, found[2], load.indices))

    def on_load(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        found = find(load.source)
        return load if found is None else tirx.BufferLoad(found[1],
                                                          at(rank, found[2], load.indices))

    def on_store(store: tirx.BufferStore) -> tirx.Stmt:
        found = find(store.buffer)
        return store if found is None else tirx.BufferStore(
            found[1], store.value, at(rank, found[2], store.indices))

    def on_alloc(alloc: tirx.AllocBuffer) -> tirx.Stmt:
        found = find(alloc.buffer)
        return alloc if found is None else tirx.AllocBuffer(found[1],
                                                            annotations=alloc.annotations)

    def on_decl(decl: tirx.DeclBuffer) -> tirx.Stmt:
        found = find(decl.buffer)
        return decl if found is None else tirx.DeclBuffer(
            found[1], data=tvm_ffi.structural_map(decl.data, [(tvm.ir.Var, on_data)]))

    body = tvm_ffi.structural_map(body, [(tvm.ir.Call, on_call)])
    body = tvm_ffi.structural_map(body, [(tvm.ir.TensorLoad, on_load),
                                         (tirx.BufferStore, on_store),
                                         (tirx.AllocBuffer, on_alloc),
                                         (tirx.DeclBuffer, on_decl)])
    left: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(body, [(tvm.ir.Var, lambda v: left.append(v) if find(v) else None)])
    if left:
        raise LoweringError(f"shared buffers {sorted({v.name for v in left})} of a cluster "
                            "kernel are used other than by loads and stores")
    return body


__all__ = ["cluster_size", "as_work_groups", "with_definition"]
