"""Kernels with grid barriers (Global stitching) on the SIMT runner.

PoCL runs the work-groups of a launch on a pool of host threads, one work-group per thread
at a time: a grid barrier can only be met when every work-group of the grid has a thread.
The runner starts PoCL with ``SIMT_CONCURRENT_BLOCKS`` threads (``POCL_MAX_PTHREAD_COUNT``,
read once when PoCL initialises; an explicit setting in the environment wins), and a kernel
with grid barriers then runs:

- as it is, with the real barrier (its OpenCL definition prepended to the source), when its
  grid fits the work-groups PoCL runs at once (the device's compute units);
- else split at its grid barriers into phase kernels launched one after another, when that
  is exact: the barriers sit at the top level of the kernel (not in a loop or a branch) and
  nothing but global memory carries data across them, as in the kernels Global stitching
  emits (``tvm_stitch.schedule.persistent``); a kernel boundary orders global memory at
  least as strongly as a grid barrier does. A shared buffer that does carry data across
  (an input a split row keeps on chip for its later phases) is made a work-group's slice
  of a global buffer first (``spilled``): what a work-group keeps in its local memory across
  a barrier, it keeps there, at an address of its own, across kernel boundaries;
- else not at all: ``GridTooLarge`` says why, instead of a deadlock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import IRModule

from ..lowering import LoweredFunc, LoweringError
from ..schedule.grid_barrier import OPENCL_DEFINITION, count_grid_barriers, is_grid_sync
from ..target import SIMT_CONCURRENT_BLOCKS

os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", str(SIMT_CONCURRENT_BLOCKS))


@dataclass(frozen=True)
class Spill:
    """A shared buffer carried across grid barriers, spilled to global memory for the phase
    kernels: ``nbytes`` for the whole grid, passed as the kernel's trailing argument."""

    name: str
    nbytes: int


def spilled(kernel: tirx.PrimFunc, names: list[str]) -> tuple[tirx.PrimFunc, list[Spill]]:
    """``kernel`` with each shared buffer of ``names`` made work-group ``g``'s slice of a
    global buffer (elements ``[g * n, (g + 1) * n)`` of a trailing parameter) instead, and
    so is every buffer TVM declares in its memory once it is dead (fuzz graph 3120:56); raises
    LoweringError for a buffer it cannot move (not one dimension of constant size, or used
    other than by loads and stores)."""
    extents: list[tuple[tvm.ir.Var, int]] = []

    def on_attr(attr: tirx.AttrStmt) -> None:
        if attr.attr_key == "thread_extent" and attr.node.thread_tag == "blockIdx.x":
            extents.append((attr.node.var, int(attr.value)))

    tvm_ffi.structural_walk(kernel.body, [(tirx.AttrStmt, on_attr)])
    (bx, blocks), = set(extents)
    allocs: list[tirx.AllocBuffer] = []
    tvm_ffi.structural_walk(kernel.body, [(tirx.AllocBuffer, allocs.append)])
    moved: list[tuple[tvm.ir.Var, tvm.ir.Var, tvm.ir.Var, int]] = []  # old, new, data, size
    for alloc in allocs:
        old = alloc.buffer
        if old.name not in names:
            continue
        ty = old.ty
        if len(ty.shape) != 1 or not isinstance(ty.shape[0], tirx.IntImm):
            raise LoweringError(f"{old.name}: a shared buffer of shape {list(ty.shape)} "
                                "cannot be spilled")
        size = int(ty.shape[0])
        data = tvm.ir.Var(f"{old.name}_spill_ptr",
                          tvm.ir.PointerType(tvm.ir.PrimType(str(ty.dtype)), "global"))
        new = tvm.ir.Var(f"{old.name}_spill", tirx.BufferType(
            ty.dtype, "global", [tirx.IntImm("int32", blocks * size)], (), ty.elem_offset,
            ty.data_alignment, ty.offset_factor, None, ()))
        moved.append((old, new, data, size))
    spilled_buffers = len(moved)
    decls: list[tirx.DeclBuffer] = []
    tvm_ffi.structural_walk(kernel.body, [(tirx.DeclBuffer, decls.append)])
    for decl in decls:  # TVM's storage rewrite reuses a dead buffer's memory for another
        of = aliased(decl, moved[:spilled_buffers])
        if of is None:
            continue
        alias, (old, new, data, size) = decl.buffer, of
        if not tvm_ffi.structural_equal(alias.ty.shape, old.ty.shape) \
                or str(alias.ty.dtype) != str(old.ty.dtype):
            raise LoweringError(f"{alias.name} reuses the memory of {old.name} in another "
                                "shape or type, and cannot be spilled with it")
        moved.append((alias, tvm.ir.Var(f"{alias.name}_spill", new.ty), data, size))

    def find(var: tvm.ir.Var) -> tuple | None:  # by identity: a Var's == builds an expression
        return next((m for m in moved if m[0].same_as(var)), None)

    def index(size: int, indices) -> list[tvm.ir.PrimExpr]:
        (i,) = indices
        dtype = str(i.ty.dtype)
        block = bx if str(bx.ty.dtype) == dtype else tirx.Cast(dtype, bx)
        return [block * tirx.IntImm(dtype, size) + i]

    def on_load(load: tvm.ir.TensorLoad) -> tvm.ir.PrimExpr:
        found = find(load.source)
        return load if found is None else tirx.BufferLoad(found[1],
                                                          index(found[3], load.indices))

    def on_store(store: tirx.BufferStore) -> tirx.Stmt:
        found = find(store.buffer)
        return store if found is None else tirx.BufferStore(
            found[1], store.value, index(found[3], store.indices))

    def on_alloc(alloc: tirx.AllocBuffer | tirx.DeclBuffer) -> tirx.Stmt:
        found = find(alloc.buffer)
        return alloc if found is None else tirx.DeclBuffer(found[1], data=found[2])

    body = tvm_ffi.structural_map(kernel.body, [(tvm.ir.TensorLoad, on_load),
                                                (tirx.BufferStore, on_store),
                                                (tirx.AllocBuffer, on_alloc),
                                                (tirx.DeclBuffer, on_alloc)])
    left: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(body, [(tvm.ir.Var, lambda v: left.append(v) if find(v) else None)])
    if left or spilled_buffers != len(names):
        raise LoweringError(f"cannot spill {sorted(names)}: not all are one-dimensional "
                            "shared buffers used by loads and stores alone")
    params = [*kernel.params, *(data for _, _, data, _ in moved[:spilled_buffers])]
    spills = [Spill(old.name, blocks * size * np.dtype(str(old.ty.dtype)).itemsize)
              for old, _, _, size in moved[:spilled_buffers]]
    return tirx.PrimFunc(params, body, kernel.ret_type, kernel.attrs), spills


def aliased(decl: tirx.DeclBuffer, moved: list[tuple]) -> tuple | None:
    """The entry of ``moved`` (whose first item is a buffer) whose memory ``decl`` declares
    a buffer in
    (``T.decl_buffer(..., data=old.data)``), or None."""
    data = decl.data
    if not isinstance(data, tvm.ir.Call) or len(data.args) != 1:
        return None
    return next((m for m in moved if m[0].same_as(data.args[0])), None)


class GridTooLarge(RuntimeError):
    """A grid-barrier kernel whose grid PoCL cannot hold at once and that cannot be split."""


_DECLARATIONS = (tirx.DeclBuffer, tirx.AllocBuffer, tirx.Bind)


def split_phases(kernel: tirx.PrimFunc) -> tuple[list[tirx.Stmt], str, list[str]]:
    """The bodies of ``kernel``'s phases (what lies between its grid barriers, each with the
    kernel's launch attributes and declarations around it), or ``[]`` and why the kernel
    cannot be split exactly, with the on-chip buffers that carry data across its barriers
    when that is why (``spilled`` moves them)."""
    wrappers: list[Callable[[tirx.Stmt], tirx.Stmt]] = []
    stmt = kernel.body
    while True:
        if isinstance(stmt, tirx.AttrStmt):
            wrappers.append(lambda body, s=stmt: tirx.AttrStmt(s.node, s.attr_key, s.value,
                                                               body))
            stmt = stmt.body
            continue
        if not isinstance(stmt, tirx.SeqStmt):
            return [], "its grid barriers are not at the top level of the kernel", []
        if any(is_grid_sync(s) for s in stmt.seq):
            break
        inner = [s for s in stmt.seq if not isinstance(s, _DECLARATIONS)]
        if len(inner) != 1:
            return [], "its grid barriers are not at the top level of the kernel", []
        position = list(stmt.seq).index(inner[0])
        wrappers.append(lambda body, s=stmt, p=position: tirx.SeqStmt(
            [*s.seq[:p], body, *s.seq[p + 1:]]))
        stmt = inner[0]
    segments: list[list[tirx.Stmt]] = [[]]
    declarations: list[tirx.Stmt] = []
    loaded: list[tuple[tvm.ir.Var, int]] = []  # values loaded in a phase: its own
    for s in stmt.seq:
        if is_grid_sync(s):
            segments.append(list(declarations))
        elif isinstance(s, tirx.Bind) and _loads(s.value):
            loaded.append((s.var, len(segments) - 1))
            segments[-1].append(s)
        elif isinstance(s, _DECLARATIONS):
            declarations.append(s)
            segments[-1].append(s)
        else:
            segments[-1].append(s)
    for var, phase in loaded:
        if any(_uses(segment, var) for segment in segments[phase + 1:]):
            return [], f"the value of {var.name} is loaded before a grid barrier", []
    if count_grid_barriers(kernel) != len(segments) - 1:
        return [], "some of its grid barriers are inside a loop or a branch", []
    crossing = _on_chip_crossing(segments)
    if crossing:
        return [], (f"{crossing[0]} (on chip) is written before a grid barrier and read "
                    "after it"), crossing
    bodies = []
    for segment in segments:
        body: tirx.Stmt = tirx.SeqStmt(segment) if len(segment) > 1 else segment[0]
        for wrap in reversed(wrappers):
            body = wrap(body)
        bodies.append(body)
    return bodies, "", []


def _uses(stmts: list[tirx.Stmt], var: tvm.ir.Var) -> bool:
    found: list[object] = []
    tvm_ffi.structural_walk(stmts, [(tvm.ir.Var, lambda v: found.append(v) if v.same_as(var)
                                     else None)])
    return bool(found)


def _loads(expr: object) -> bool:
    found: list[object] = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.TensorLoad, found.append)])
    return bool(found)


def _first_accesses(segment: list[tirx.Stmt]) -> dict[str, str]:
    """For every buffer the statements access, whether a load or a store comes first."""
    first: dict[str, str] = {}

    def load(node: tvm.ir.TensorLoad) -> None:
        first.setdefault(node.source.name, "load")

    def store(node: tirx.BufferStore) -> None:
        tvm_ffi.structural_walk([node.value, *node.indices], [(tvm.ir.TensorLoad, load)])
        if node.buffer.scope() != "global":
            first.setdefault(node.buffer.name, "store")

    for s in segment:
        tvm_ffi.structural_walk(s, [(tirx.BufferStore, store), (tvm.ir.TensorLoad, load)])
    return first


def _on_chip_crossing(segments: list[list[tirx.Stmt]]) -> list[str]:
    """The shared or local buffers that carry data across a barrier: read by a phase before
    it writes them, and written by an earlier phase. Buffers the compiler reuses across
    phases are fine: each phase writes them before reading."""
    written: set[str] = set()
    crossing: set[str] = set()
    for segment in segments:
        first = _first_accesses(segment)
        crossing |= {n for n, kind in first.items() if kind == "load" and n in written}
        written |= {n for n, kind in first.items() if kind == "store"}
    return sorted(crossing)


class GridBarriers:
    """The grid-barrier kernels of a lowered PrimFunc, their phase kernels (with the buffers
    they spill, ``spills``), and which to launch for a grid."""

    def __init__(self, lowered: LoweredFunc) -> None:
        self.lowered = lowered
        self.phases: dict[str, list[str]] = {}
        self.reasons: dict[str, str] = {}
        self.spills: dict[str, list[Spill]] = {}
        self._extra: dict[str, tirx.PrimFunc] = {}
        for name in dict.fromkeys(k.kernel for k in lowered.launches):
            kernel = lowered.kernel(name)
            if not count_grid_barriers(kernel):
                continue
            bodies, why, crossing = split_phases(kernel)
            if crossing:
                kernel, self.spills[name] = spilled(kernel, crossing)
                bodies, why, _ = split_phases(kernel)
            self.reasons[name] = why
            self.phases[name] = []
            for i, body in enumerate(bodies):
                phase = f"{name}_phase{i}"
                self._extra[phase] = tirx.PrimFunc(kernel.params, body, kernel.ret_type,
                                                   kernel.attrs).with_attr("global_symbol",
                                                                           phase)
                self.phases[name].append(phase)

    def source(self) -> str:
        """OpenCL source of every kernel and phase kernel, with the barrier's definition."""
        if not self._extra:
            source = self.lowered.source()
        else:
            device = IRModule({**{gv.name_hint: f for gv, f in
                                  self.lowered.device.functions_items()}, **self._extra})
            build = tvm.get_global_func("target.build." + self.lowered.target.kind.name)
            source = build(device, self.lowered.target).inspect_source()
        if self.phases:
            source = OPENCL_DEFINITION + source
        return source

    def kernel_names(self) -> list[str]:
        """Every kernel the program defines that a launch may use."""
        names = list(dict.fromkeys(k.kernel for k in self.lowered.launches))
        return names + list(self._extra)

    def launches(self, kernel: str, blocks: int, concurrent: int) -> list[str]:
        """The kernels to launch, in order, for ``kernel`` on ``blocks`` work-groups when
        PoCL runs ``concurrent`` at once; raises GridTooLarge when none will do."""
        if kernel not in self.phases or blocks <= concurrent:
            return [kernel]
        if self.phases[kernel]:
            return self.phases[kernel]
        raise GridTooLarge(
            f"{kernel} has grid barriers and launches {blocks} work-groups, but PoCL runs "
            f"{concurrent} at once (POCL_MAX_PTHREAD_COUNT) and the kernel cannot be split "
            f"at its barriers: {self.reasons[kernel]}")


__all__ = ["GridBarriers", "GridTooLarge", "split_phases", "aliased"]
