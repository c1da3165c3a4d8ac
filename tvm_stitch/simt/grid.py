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
  least as strongly as a grid barrier does;
- else not at all: ``GridTooLarge`` says why, instead of a deadlock.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import IRModule

from ..lowering import LoweredFunc
from ..schedule.grid_barrier import OPENCL_DEFINITION, count_grid_barriers, is_grid_sync
from ..target import SIMT_CONCURRENT_BLOCKS

os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", str(SIMT_CONCURRENT_BLOCKS))


class GridTooLarge(RuntimeError):
    """A grid-barrier kernel whose grid PoCL cannot hold at once and that cannot be split."""


_DECLARATIONS = (tirx.DeclBuffer, tirx.AllocBuffer, tirx.Bind)


def split_phases(kernel: tirx.PrimFunc) -> tuple[list[tirx.Stmt], str]:
    """The bodies of ``kernel``'s phases (what lies between its grid barriers, each with the
    kernel's launch attributes and declarations around it), or ``[]`` and why the kernel
    cannot be split exactly."""
    wrappers: list[Callable[[tirx.Stmt], tirx.Stmt]] = []
    stmt = kernel.body
    while True:
        if isinstance(stmt, tirx.AttrStmt):
            wrappers.append(lambda body, s=stmt: tirx.AttrStmt(s.node, s.attr_key, s.value,
                                                               body))
            stmt = stmt.body
            continue
        if not isinstance(stmt, tirx.SeqStmt):
            return [], "its grid barriers are not at the top level of the kernel"
        if any(is_grid_sync(s) for s in stmt.seq):
            break
        inner = [s for s in stmt.seq if not isinstance(s, _DECLARATIONS)]
        if len(inner) != 1:
            return [], "its grid barriers are not at the top level of the kernel"
        position = list(stmt.seq).index(inner[0])
        wrappers.append(lambda body, s=stmt, p=position: tirx.SeqStmt(
            [*s.seq[:p], body, *s.seq[p + 1:]]))
        stmt = inner[0]
    segments: list[list[tirx.Stmt]] = [[]]
    declarations: list[tirx.Stmt] = []
    for s in stmt.seq:
        if is_grid_sync(s):
            segments.append(list(declarations))
        elif isinstance(s, _DECLARATIONS):
            if isinstance(s, tirx.Bind) and _loads(s.value):
                return [], f"the value of {s.var.name} is loaded before a grid barrier"
            declarations.append(s)
            segments[-1].append(s)
        else:
            segments[-1].append(s)
    if count_grid_barriers(kernel) != len(segments) - 1:
        return [], "some of its grid barriers are inside a loop or a branch"
    why = _on_chip_crossing(segments)
    if why:
        return [], why
    bodies = []
    for segment in segments:
        body: tirx.Stmt = tirx.SeqStmt(segment) if len(segment) > 1 else segment[0]
        for wrap in reversed(wrappers):
            body = wrap(body)
        bodies.append(body)
    return bodies, ""


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


def _on_chip_crossing(segments: list[list[tirx.Stmt]]) -> str:
    """Why on-chip data would cross a barrier: a shared or local buffer that a phase reads
    before writing it, written by an earlier phase (empty when there is none). Buffers the
    compiler reuses across phases are fine: each phase writes them before reading."""
    written: set[str] = set()
    for segment in segments:
        first = _first_accesses(segment)
        crossing = sorted(n for n, kind in first.items() if kind == "load" and n in written)
        if crossing:
            return (f"{crossing[0]} (on chip) is written before a grid barrier and read after "
                    "it")
        written |= {n for n, kind in first.items() if kind == "store"}
    return ""


class GridBarriers:
    """The grid-barrier kernels of a lowered PrimFunc, their phase kernels, and which to
    launch for a grid."""

    def __init__(self, lowered: LoweredFunc) -> None:
        self.lowered = lowered
        self.phases: dict[str, list[str]] = {}
        self.reasons: dict[str, str] = {}
        self._extra: dict[str, tirx.PrimFunc] = {}
        for name in dict.fromkeys(k.kernel for k in lowered.launches):
            kernel = lowered.kernel(name)
            if not count_grid_barriers(kernel):
                continue
            bodies, why = split_phases(kernel)
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


__all__ = ["GridBarriers", "GridTooLarge", "split_phases"]
