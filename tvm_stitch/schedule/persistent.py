"""TIR rewrites of a scheduled stitched kernel: launch bounds, and the persistent grid of
Global stitching.

A Global group is scheduled as a sequence of launch nests, one per phase (each a loop bound to
``blockIdx.x`` over the phase's tasks, as if it were a kernel of its own). ``persistent``
turns them into ONE kernel on a grid of ``grid`` blocks: every block loops over the tasks
``bx, bx + grid, bx + 2 grid, ...`` of each phase (vertical packing), and a grid barrier
separates consecutive phases. Since separate kernels could only communicate through global
memory, so do the phases; a grid barrier orders them as a kernel boundary did. The
intermediates that crossed kernel boundaries (the partial sums of column reductions) were
workspaces TVM allocated on the host between the kernels; inside one kernel TVM cannot
allocate them, so ``lift_workspaces`` makes them output parameters of the PrimFunc, and the
stitch flow adds them (and the barrier state) to the kernel's Relax call.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .rows import Unstitchable

KERNEL_LAUNCH_PARAMS = "tirx.kernel_launch_params"
"""TVM's PrimFunc attribute listing launch flags its kernels ask for (a cooperative launch)."""

LAUNCH_BOUNDS_ATTR = "tirx.launch_bounds_min_blocks_per_sm"
"""TVM's attribute for ``__launch_bounds__(threads, min blocks per SM)`` of a CUDA kernel."""


def _root(func: tirx.PrimFunc) -> s_tir.stmt.SBlock:
    return func.body.block


def with_root(func: tirx.PrimFunc, body: tirx.Stmt | None = None,
              alloc_buffers: list | None = None, params: list | None = None
              ) -> tirx.PrimFunc:
    """``func`` with its root block's body, allocations or the function's parameters
    replaced."""
    realize = func.body
    root = realize.block
    block = s_tir.stmt.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                              root.body if body is None else body, root.init,
                              list(root.alloc_buffers) if alloc_buffers is None
                              else alloc_buffers, root.match_buffers, root.annotations)
    realize = s_tir.stmt.SBlockRealize(realize.iter_values, realize.predicate, block)
    return tirx.PrimFunc(list(func.params) if params is None else params, realize,
                         func.ret_type, func.attrs)


def root_statements(func: tirx.PrimFunc) -> list[tirx.Stmt]:
    """The statements directly under the root block."""
    body = _root(func).body
    return list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def blocks_in(stmt: tirx.Stmt) -> list[str]:
    """Names of the blocks inside ``stmt``, in order."""
    found: list[s_tir.stmt.SBlock] = []
    tvm_ffi.structural_walk(stmt, [(s_tir.stmt.SBlock, found.append)])
    return [b.name_hint for b in found]


def is_block_loop(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` is a loop bound to ``blockIdx.x``."""
    return (isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.THREAD_BINDING
            and stmt.thread_binding.thread_tag == "blockIdx.x")


def _substitute(stmt: tirx.Stmt, var: tvm.ir.Var, value: tvm.ir.PrimExpr) -> tirx.Stmt:
    def on_var(v: tvm.ir.Var) -> tvm.ir.PrimExpr:
        return value if v.same_as(var) else v

    return tvm_ffi.structural_map(stmt, [(tvm.ir.Var, on_var)])


def _guarded(stmt: tirx.Stmt, condition: tvm.ir.PrimExpr) -> tirx.Stmt:
    """``stmt`` with ``condition`` added to the predicate of every block in it. A guard on
    the blocks rather than around the statement: TVM inserts the barriers between blocks
    (shared memory, cross-thread reductions) and cannot insert them inside a condition."""

    def on_realize(realize: s_tir.stmt.SBlockRealize) -> s_tir.stmt.SBlockRealize:
        predicate = condition if (isinstance(realize.predicate, tirx.IntImm)
                                  and int(realize.predicate) == 1) \
            else tirx.And(realize.predicate, condition)
        return s_tir.stmt.SBlockRealize(realize.iter_values, predicate, realize.block)

    return tvm_ffi.structural_map(stmt, [(s_tir.stmt.SBlockRealize, on_realize)])


def _thread_extents(stmt: tirx.Stmt) -> dict[str, int]:
    extents: dict[str, int] = {}

    def visit(loop: tirx.For) -> None:
        if loop.kind == tirx.ForKind.THREAD_BINDING:
            tag = str(loop.thread_binding.thread_tag)
            if tag.startswith("threadIdx"):
                extents[tag] = max(extents.get(tag, 0), int(loop.extent))

    tvm_ffi.structural_walk(stmt, [(tirx.For, visit)])
    return extents


def _block_sync() -> tirx.Stmt:
    """A barrier of the threads of one block (``__syncthreads()``)."""
    return tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))


def _synced_after_loops(body: tirx.Stmt) -> tirx.Stmt:
    """``body`` (of a phase's task) with a block barrier after each of its serial loops that
    other statements follow: after a row phase's walk over its rows, before the partial sums
    are written out. Not needed on a GPU (each thread writes out what it accumulated), but
    PoCL's work-group compiler cannot build a loop that holds barriers when conditional code
    (a partial thread's guard) follows it both inside and after the loop ("Could not find a
    dominating alternative variable"); one barrier per task costs a GPU next to nothing."""
    if not isinstance(body, tirx.SeqStmt):
        return body
    stmts: list[tirx.Stmt] = []
    for i, stmt in enumerate(body.seq):
        stmts.append(stmt)
        if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.SERIAL \
                and i + 1 < len(body.seq):
            stmts.append(_block_sync())
    return tirx.SeqStmt(stmts)


def persistent(func: tirx.PrimFunc, grid: int, barrier: tirx.Stmt) -> tirx.PrimFunc:
    """Merge the launch nests under ``func``'s root block into one kernel of ``grid`` blocks
    that loops over each nest's tasks, with ``barrier`` between nests (a grid barrier, or a
    cluster's when every block shares data only with the blocks of its cluster).

    Inside each task, a block barrier follows every serial loop that other statements follow
    (``_synced_after_loops``). Every nest must launch the same threads per block. Raises
    Unstitchable otherwise, or when something other than a launch nest sits under the root
    block.
    """
    nests = root_statements(func)
    if not all(is_block_loop(n) for n in nests):
        raise Unstitchable("a phase of the kernel is not a launch nest over blockIdx.x")
    threads = {tuple(sorted(_thread_extents(n).items())) for n in nests}
    if len(threads) != 1:
        raise Unstitchable(f"phases launch different threads per block: {sorted(threads)}")
    # the block index keeps the loops' index type: a cast in a block's bindings would make
    # them non-affine to TVM, which then lowers its reductions without cross-thread ones
    dtype = str(nests[0].loop_var.ty.dtype)
    bx = tvm.ir.Var("bx", dtype)
    parts: list[tirx.Stmt] = []
    for k, nest in enumerate(nests):
        tasks = int(nest.extent)
        trips = -(-tasks // grid)
        task = tvm.ir.Var(f"task{k}", dtype)
        index = task * tirx.IntImm(dtype, grid) + bx if trips > 1 else bx
        body = _substitute(_synced_after_loops(nest.body), nest.loop_var,
                           index if str(nest.loop_var.ty.dtype) == dtype
                           else tirx.Cast(str(nest.loop_var.ty.dtype), index))
        if trips * grid != tasks:
            body = _guarded(body, index < tirx.IntImm(dtype, tasks))
        if trips > 1:
            body = tirx.For(task, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, trips),
                            tirx.ForKind.SERIAL, body)
        if parts:
            parts.append(barrier)
        parts.append(body)
    extent = tirx.IntImm(dtype, grid)
    binding = tirx.IterVar(tvm.ir.Range(tirx.IntImm(dtype, 0), extent), bx,
                           tirx.IterVar.ThreadIndex, "blockIdx.x")
    loop = tirx.For(bx, tirx.IntImm(dtype, 0), extent, tirx.ForKind.THREAD_BINDING,
                    tirx.SeqStmt(parts), thread_binding=binding)
    return with_root(func, body=loop)


def lift_workspaces(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, list[tirx.Buffer]]:
    """``func`` with every global buffer its root block allocates turned into a trailing
    (output) parameter, and those buffers."""
    root = _root(func)
    lifted = [b for b in root.alloc_buffers if b.scope() == "global"]
    kept = [b for b in root.alloc_buffers if b.scope() != "global"]
    return with_root(func, alloc_buffers=kept, params=list(func.params) + lifted), lifted


def with_launch_bounds(func: tirx.PrimFunc, blocks_per_sm: int) -> tirx.PrimFunc:
    """``func`` whose kernels declare ``__launch_bounds__(threads, blocks_per_sm)``."""
    value = tirx.IntImm("int32", blocks_per_sm)

    def on_for(loop: tirx.For) -> tirx.For:
        if not is_block_loop(loop):
            return loop
        body = tirx.AttrStmt(tirx.IntImm("int32", 0), LAUNCH_BOUNDS_ATTR, value, loop.body)
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                        loop.thread_binding, loop.annotations)

    return tvm_ffi.structural_map(func, [(tirx.For, on_for)])


__all__ = ["persistent", "lift_workspaces", "with_launch_bounds", "with_root",
           "root_statements", "blocks_in", "is_block_loop"]
