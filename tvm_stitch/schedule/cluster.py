"""Thread-block clusters (sm_90): a split row combines its partials through distributed shared
memory instead of global memory and a grid barrier (issue 13 part 2, ``docs/clusters.md``).

Task splitting (``task_split``) cuts each row into ``parts`` sub-rows, one block each; every
block reduces its sub-row to a partial and, after a grid barrier, combines the partials of
its row. When the ``parts`` blocks of a row (or of several whole rows) form one cluster of
``C`` blocks, the partials never leave the chip: each block keeps its partial in its own
shared memory, a cluster barrier replaces the grid barrier, and the combination reads the
other blocks' partials through distributed shared memory. Clusters are scheduled as a
whole, so the grid need not be resident at once.

The kernel is the Global kernel ``persistent`` builds, one task per block, rewritten by
``clustered``:

- every partial (a global buffer of ``rows x parts``, written by the block of each sub-row,
  read by combine blocks) becomes a one-element shared buffer: the block of sub-row ``s``
  holds element ``s`` of it, so a combination reads element ``s`` from the block of rank
  ``s % C`` (a 1-D cluster is ``C`` consecutive blocks), through ``CLUSTER_LOAD``; checked
  for every block of the grid first (``_check_locality``);
- ``CLUSTER_SYNC(C)`` (arrive with release, wait with acquire, at cluster scope) replaces
  each grid barrier, and one more ends the kernel: a block must not exit while another
  may still read its shared memory.

The size is compiled into the kernel: the CUDA post-processing hook (``grid_barrier``)
gives a kernel that calls ``CLUSTER_SYNC(C)`` the attribute ``__cluster_dims__(C, 1, 1)``
(``with_cluster_dims``) and defines both device functions. TVM 0.27 would launch a kernel
that binds the ``clusterCtaIdx.x`` tag with the cluster as a launch attribute, but its
``LowerThreadAllreduce`` refuses every cross-thread reduction under that binding, which it
hoists to the top of the kernel. The device functions are ours because TVM's own are
statements writing a register (``T.ptx.mapa``, ``T.ptx.ld``) where a block's body needs an
expression, and its ``T.cuda.cluster_sync`` has no memory clobber. The SIMT runner runs a
cluster as one work-group (``simt.clusters``). Only targets with clusters
(``has_clusters``) get them: nvcc rejects ``__cluster_dims__`` before sm_90.
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..transform.expressions import substituted_all, uses
from .persistent import persistent, with_root
from .rows import Unstitchable
from .task_split import COMBINE_ATTR

CLUSTER_SYNC = "tvm_stitch_cluster_sync"
"""Name of the device function every thread of a cluster calls at a cluster barrier."""

CLUSTER_LOAD = "tvm_stitch_cluster_load"
"""Name of the device function reading a shared element of another block of the cluster:
``tvm_stitch_cluster_load(&local_element, rank)``."""

MAX_CLUSTER = 8
"""Most blocks per cluster: CUDA's portable cluster size. sm_90 takes up to 16, but only for a
kernel whose launch opts in to a non-portable size, and TVM opts in only for clusters it
launches with a cluster attribute, not for a size compiled into the kernel."""

CUDA_DEFINITION = r"""
// tvm-stitch thread-block clusters (task splitting on sm_90): tvm_stitch/schedule/cluster.py
__device__ __forceinline__ void tvm_stitch_cluster_sync(int size) {
  asm volatile("barrier.cluster.arrive.release.aligned;" : : : "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" : : : "memory");
}
template <typename T>
__device__ __forceinline__ T tvm_stitch_cluster_load(T* local, unsigned int rank) {
  unsigned long long remote;
  asm("mapa.u64 %0, %1, %2;" : "=l"(remote) : "l"(local), "r"(rank));
  return *reinterpret_cast<T*>(remote);
}
"""

OPENCL_DEFINITION = r"""
// tvm-stitch cluster barrier on the SIMT runner, where a cluster is one work-group
void tvm_stitch_cluster_sync(int size) {
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
}
"""


_KERNEL = re.compile(r'extern "C" __global__ void ((?:__launch_bounds__\([^)]*\) )?)(\w+)\(')
_SYNC = re.compile(CLUSTER_SYNC + r"\((\d+)\)")


def with_cluster_dims(source: str) -> str:
    """CUDA ``source`` with ``__cluster_dims__(C, 1, 1)`` on every kernel that meets at
    barriers of clusters of ``C`` blocks (its ``CLUSTER_SYNC`` calls say ``C``), and the
    device functions defined where called."""
    if CLUSTER_SYNC + "(" not in source:
        return source
    starts = [(m.start(), m.group(2)) for m in _KERNEL.finditer(source)]
    sizes: dict[str, int] = {}
    for (start, name), (end, _) in zip(starts, [*starts[1:], (len(source), "")], strict=True):
        found = {int(n) for n in _SYNC.findall(source, start, end)}
        if found:
            assert len(found) == 1, f"{name}: barriers of clusters of {sorted(found)} blocks"
            sizes[name] = found.pop()

    def declared(m: re.Match) -> str:
        size = sizes.get(m.group(2))
        if size is None:
            return m.group(0)
        return (f'extern "C" __global__ void __cluster_dims__({size}, 1, 1) '
                f"{m.group(1)}{m.group(2)}(")

    source = _KERNEL.sub(declared, source)
    return source if CUDA_DEFINITION.strip() in source else CUDA_DEFINITION + source


def has_clusters(arch: str) -> bool:
    """Whether CUDA architecture ``arch`` (``sm_90``) launches thread-block clusters."""
    return arch.startswith("sm_") and int("".join(c for c in arch[3:] if c.isdigit())) >= 90


def cluster_sync(size: int) -> tirx.Stmt:
    """The TIR statement of one barrier of a cluster of ``size`` blocks."""
    return tirx.Evaluate(tirx.call_extern("void", CLUSTER_SYNC, tirx.IntImm("int32", size)))


def is_extern_call(expr: object, name: str) -> bool:
    """Whether ``expr`` calls the device function ``name`` (``T.call_extern``)."""
    return (isinstance(expr, tvm.ir.Call) and getattr(expr.op, "name", "") == "tirx.call_extern"
            and len(expr.args) > 0 and isinstance(expr.args[0], tvm.ir.StringImm)
            and expr.args[0].value == name)


def clustered(func: tirx.PrimFunc, grid: int, size: int) -> tirx.PrimFunc:
    """The launch nests under ``func``'s root block (a split row group's phases, one task per
    block on ``grid`` blocks) as one kernel of clusters of ``size`` blocks; raises
    Unstitchable for a kernel whose blocks would share other data than partials, or whose
    grid is not whole clusters."""
    if grid % size or not 1 < size <= MAX_CLUSTER:
        raise Unstitchable(f"{grid} blocks are not whole clusters of {size}")
    out = persistent(func, grid, cluster_sync(size))
    root = out.body.block
    partials = [b for b in root.alloc_buffers if b.scope() == "global"]
    _check_locality(root.body, partials, size)
    local = {b: tirx.decl_buffer((1,), b.dtype, f"{b.name}_cluster", scope="shared",
                                 layout=None) for b in partials}
    loop = _with_cluster_accesses(root.body, local, size)
    stmts = list(loop.body.seq) if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
    wrapped = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                       tirx.SeqStmt([*stmts, cluster_sync(size)]), loop.thread_binding,
                       loop.annotations)
    kept = [b for b in root.alloc_buffers if b.scope() != "global"]
    return with_root(out, body=wrapped, alloc_buffers=kept + list(local.values()))


def _realizes(stmt: tirx.Stmt, loops: tuple[tirx.For, ...] = ()
              ) -> list[tuple[s_tir.stmt.SBlockRealize, tuple[tirx.For, ...]]]:
    """Every block realize under ``stmt`` with the loops around it, outermost first."""
    if isinstance(stmt, tirx.For):
        return _realizes(stmt.body, (*loops, stmt))
    if isinstance(stmt, tirx.SeqStmt):
        return [r for s in stmt.seq for r in _realizes(s, loops)]
    if isinstance(stmt, s_tir.stmt.SBlockRealize):
        return [(stmt, loops), *_realizes(stmt.block.body, loops)]
    body = getattr(stmt, "body", None)
    return _realizes(body, loops) if isinstance(body, tirx.Stmt) else []


def _check_locality(loop: tirx.For, partials: list[tirx.Buffer], size: int) -> None:
    """Raise Unstitchable unless the block of sub-row ``s`` (``loop`` binds the block index)
    writes element ``s`` of each partial and nothing else, and every combination reads only
    elements of its own cluster's blocks: ``s // size`` of each element ``s`` it reads is the
    reader's own. Checked for every block of the grid, with a block's spatial iterators at
    their values there and its reduction iterators over their domains."""
    for realize, loops in _realizes(loop.body):
        block = realize.block
        combine = block.annotations is not None and COMBINE_ATTR in block.annotations
        regions = [(r, "reads") for r in block.reads] if combine else \
            [(w, "writes") for w in block.writes]
        regions = [(r, how) for r, how in regions if any(r.source.same_as(p) for p in partials)]
        if not regions:
            if any(r.source.same_as(p) for r in block.reads for p in partials) \
                    and not any(w.source.same_as(p) for w in block.writes for p in partials):
                raise Unstitchable(f"{block.name_hint} reads a partial and does not combine")
            continue
        if combine and any(w.source.same_as(p) for w in block.writes for p in partials):
            raise Unstitchable(f"{block.name_hint} combines partials into a partial")
        varying = [lp.loop_var for lp in loops if int(lp.extent) > 1]  # not bx: outside
        spatial: list[tuple[tvm.ir.Var, tvm.ir.PrimExpr]] = []
        for iv, value in zip(block.iter_vars, realize.iter_values, strict=True):
            if int(iv.iter_type) == tirx.IterVar.DataPar:
                if any(uses(value, var) for var in varying):
                    raise Unstitchable(f"{block.name_hint} spans several rows in a block")
                spatial.append((iv.var, value))
        for b in range(int(loop.extent)):
            at_block = {lp.loop_var: tirx.IntImm(str(lp.loop_var.ty.dtype),
                                                 b if lp.loop_var.same_as(loop.loop_var) else 0)
                        for lp in (loop, *loops)}
            values = {var: substituted_all(value, at_block) for var, value in spatial}
            ana = Analyzer()
            for iv in block.iter_vars:
                if int(iv.iter_type) != tirx.IterVar.DataPar:
                    ana.bind(iv.var, iv.dom)
            for region, how in regions:
                first = ana.const_int_bound(substituted_all(_flat(
                    region.source, [r.min for r in region.region]), values))
                last = ana.const_int_bound(substituted_all(_flat(
                    region.source, [r.min + r.extent - 1 for r in region.region]), values))
                own = (first.min_value, last.max_value) == (b, b) if how == "writes" else \
                    first.min_value // size == last.max_value // size == b // size
                if not own:
                    raise Unstitchable(
                        f"block {b}: {block.name_hint} {how} {region.source.name} "
                        f"[{first.min_value}, {last.max_value}], not its cluster's")


def _flat(buffer: tirx.Buffer, indices) -> tvm.ir.PrimExpr:
    """The row-major position of ``indices`` in ``buffer``."""
    flat = indices[0]
    for i, n in zip(indices[1:], buffer.shape[1:], strict=True):
        flat = flat * n + i
    return flat


def _with_cluster_accesses(stmt: tirx.Stmt, local: dict[tirx.Buffer, tirx.Buffer],
                           size: int) -> tirx.Stmt:
    """``stmt`` with every access to a partial of ``local`` made to its one-element shared
    buffer: the writer's own element, or in a combine block another block's, by rank."""
    def find(buffer: tirx.Buffer) -> tirx.Buffer | None:
        return next((new for old, new in local.items() if old.same_as(buffer)), None)

    def zero(buffer: tirx.Buffer) -> list[tvm.ir.PrimExpr]:
        return [tirx.IntImm("int32", 0)]

    def region(r: tvm.ir.TensorRegion) -> tvm.ir.TensorRegion:
        new = find(r.source)
        return r if new is None else tirx.BufferRegion(
            new, [tvm.ir.Range.from_min_extent(0, 1)])

    def remote(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        new = find(load.source)
        if new is None:
            return load
        rank = tirx.Cast("uint32", tirx.floormod(_flat(load.source, list(load.indices)),
                                                 size))
        return tirx.call_extern(str(new.dtype), CLUSTER_LOAD,
                                tirx.address_of(tirx.BufferLoad(new, zero(new))), rank)

    def own(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        new = find(load.source)
        return load if new is None else tirx.BufferLoad(new, zero(new))

    def store(st: tirx.BufferStore) -> tirx.Stmt:
        new = find(st.buffer)
        return st if new is None else tirx.BufferStore(new, st.value, zero(new))

    def on_block(block: s_tir.stmt.SBlock) -> s_tir.stmt.SBlock:
        combine = block.annotations is not None and COMBINE_ATTR in block.annotations
        rules = [(tvm.ir.TensorLoad, remote if combine else own), (tirx.BufferStore, store)]
        body = tvm_ffi.structural_map(block.body, rules)
        init = None if block.init is None else tvm_ffi.structural_map(block.init, rules)
        return s_tir.stmt.SBlock(block.iter_vars, [region(r) for r in block.reads],
                                 [region(w) for w in block.writes], block.name_hint, body,
                                 init, block.alloc_buffers, block.match_buffers,
                                 block.annotations)

    return tvm_ffi.structural_map(stmt, [(s_tir.stmt.SBlock, on_block)])


__all__ = ["CLUSTER_SYNC", "CLUSTER_LOAD", "MAX_CLUSTER", "CUDA_DEFINITION",
           "OPENCL_DEFINITION", "with_cluster_dims", "has_clusters", "cluster_sync",
           "is_extern_call", "clustered"]
