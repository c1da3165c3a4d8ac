"""Global-memory bytes one finalised device kernel reads and writes, counted from its TIR.

Every load and store of a buffer in global scope counts once per point of the kernel's
iteration space that executes it: blocks x threads (every statement of a CUDA kernel runs in
every thread) x the trip counts of the enclosing loops. A vector access (``Ramp`` index,
vector dtype) counts all its lanes. Identical loads inside one statement (the same buffer and
index, as in ``(x[i] - m) * (x[i] - m)``, or ``x[i]`` in both the condition and a branch of
``if_then_else(0 < x[i], x[i], ...)``) count once, where the first is executed: nvcc keeps
the loaded value in a register. So do identical loads of consecutive bindings, which write
no memory (the two values an online softmax combines each element into).

Guards: with ``exact_guards=True`` (the default) an access under ``if`` / ``if_then_else``
counts only at the points where the conditions hold, evaluated exactly when they are integer
arithmetic on thread indices, loop variables and shape parameters (see ``guards``). A
condition that reads memory counts as always true (the access's other guards still count),
guards whose axes span more than 2**27 points count as always true, and so does every guard
with ``exact_guards=False``: upper bounds, flagged by ``KernelTraffic.exact = False`` with a
caveat saying which guard. Measured on dlight kernels, the bound is badly off for
reductions, which store their result under ``threadIdx.x == 0``: writes overcount by the
block size (32x for a 750000x32 row sum, 1024x for 64x30000, 16x for an 8192x1024 column
sum). Tail guards cost 2.4% of reads for 1000-wide softmax, log-softmax and RMSNorm rows
(4 x 256 threads per row) and a 64x30000 row sum; tile-aligned element-wise, softmax and
LayerNorm kernels have no guarded global access, so both counts agree.

Counts are of accesses issued to the memory system (L1/L2), not DRAM transactions: a buffer
re-read by many blocks (a LayerNorm's gamma) counts each time. ``BufferTraffic.size_bytes``
gives the footprint so the re-read factor shows in the per-buffer breakdown, and
``dram_bytes`` tells a real re-read from an L2 hit: a buffer of at most
``L2_RESIDENT_BYTES`` read more than once (a broadcast operand: gamma and beta, a bias, a
mask row) reaches DRAM once and is then served by the L2 cache, so its re-reads count as
``l2_bytes``; every other byte counts as DRAM traffic.

Sectors: a warp's access moves whole 32-byte sectors between the L2 cache and the SM.
``sector_bytes`` counts them: for each access, the sectors its first warp touches (the lanes
laid over threadIdx.x, then y and z; every other loop and block index at its first value;
lanes its guards turn off left out) per byte that warp asks for, times the access's bytes.
Consecutive threads on consecutive elements move what they ask for (a ratio of 1); threads
a row apart each touch a sector of their own (8x for float32, 16x for float16): the L2 and
L1 traffic, and the latency, of an uncoalesced access, which the byte counts cannot show. An
index the evaluator cannot follow counts as what it asks for.

Steps: a serial loop whose body synchronises threads (a barrier, or the warp shuffles of a
cross-thread reduction) runs its iterations one after the other: a thread cannot issue the
next iteration's loads before the reduction of this one is done (nvcc does not move loads
across a rolled loop's synchronisation). ``step_accesses`` counts each access once per step,
divided by the trip counts of such loops around it: what the grid can have in flight at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer

from ..lowering import LoweringError, evaluate_int
from ..schedule.grid_barrier import is_grid_sync
from ..target import WARP_SIZE
from .guards import IF_THEN_ELSE, Axis, Evaluator, Unsupported, count_points, reads_memory

_ADDRESS_OF = "tirx.address_of"
# Intrinsics that synchronise threads (a barrier, a warp shuffle): a loop around one runs
# its iterations in sequence; so does a loop around a grid barrier (``is_grid_sync``).
_SYNC_OPS = ("tirx.tvm_storage_sync", "tirx.cuda.__shfl")
# Intrinsics that move global memory without a TIR load or store; we cannot size them.
_OPAQUE_MEMORY_OPS = ("cp_async", "cp_reduce", "atomic", "ldg", "bulk", "multimem")


class AnalysisError(RuntimeError):
    """A kernel or module whose traffic or launches this analysis cannot account for."""


SECTOR_BYTES = 32
"""The unit in which the L2 cache and the SMs move global memory."""


L2_RESIDENT_BYTES = 1 << 20
"""A buffer this small that a kernel reads more than once stays in the L2 cache after its
first read: every GPU of the roofline table has at least 6 MB of L2, and a kernel's large
buffers stream through it once (a few concurrently resident blocks' rows at a time)."""


@dataclass
class BufferTraffic:
    """Bytes one kernel moves to and from one global buffer."""

    name: str
    size_bytes: int
    read_bytes: int = 0
    write_bytes: int = 0

    @property
    def l2_bytes(self) -> int:
        """Re-reads the L2 cache serves: all reads past the first of a buffer of at most
        ``L2_RESIDENT_BYTES``."""
        if 0 < self.size_bytes <= L2_RESIDENT_BYTES and self.read_bytes > self.size_bytes:
            return self.read_bytes - self.size_bytes
        return 0


@dataclass
class KernelTraffic:
    """Global-memory traffic of one kernel launch.

    ``accesses`` counts memory instructions executed over the whole grid (a 4-lane vector
    load is one); ``step_accesses`` those of one step of the serial loops that synchronise
    threads (see the module docstring; equal to ``accesses`` where there are none);
    ``exact`` is False when some guard was counted as always true.
    """

    read_bytes: int = 0
    write_bytes: int = 0
    accesses: int = 0
    step_accesses: float = 0.0
    sector_bytes: float = 0.0
    exact: bool = True
    buffers: dict[str, BufferTraffic] = field(default_factory=dict)
    caveats: list[str] = field(default_factory=list)

    @property
    def global_bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.read_bytes + self.write_bytes

    @property
    def sector_ratio(self) -> float:
        """Sector bytes per byte accessed (1.0 for coalesced accesses; see the module
        docstring)."""
        return self.sector_bytes / self.global_bytes if self.global_bytes else 1.0

    @property
    def l2_bytes(self) -> int:
        """Re-reads of small buffers that the L2 cache serves (``BufferTraffic.l2_bytes``)."""
        return sum(b.l2_bytes for b in self.buffers.values())

    @property
    def dram_bytes(self) -> int:
        """Bytes that reach DRAM: every access but the L2 cache's re-reads."""
        return self.global_bytes - self.l2_bytes


def is_global(buffer: tvm.ir.Var) -> bool:
    """True when ``buffer`` (a buffer-typed TIR variable) lives in global memory."""
    return str(buffer.ty.storage_scope) in ("global", "")


def bytes_per_access(dtype: str) -> int:
    """Bytes moved by one access of ``dtype``, all lanes; sub-byte types round up per lane."""
    dt = tvm.DataType(dtype)
    return dt.lanes * max(1, -(-dt.bits // 8))


@dataclass
class _Frame:
    """The iteration space and guard conditions that reach a statement."""

    axes: tuple[Axis, ...]
    guards: tuple[tvm.ir.PrimExpr, ...]
    steps: int = 1  # iterations of the enclosing serial loops that synchronise
    count: int | None = None

    def nested(self, axis: Axis | None = None, guard: tvm.ir.PrimExpr | None = None,
               steps: int = 1) -> _Frame:
        return _Frame(self.axes + ((axis,) if axis else ()),
                      self.guards + ((guard,) if guard is not None else ()), self.steps * steps)


class _Counter:
    """Walks one device PrimFunc, adding up its global accesses into a KernelTraffic."""

    def __init__(self, name: str, ana: Analyzer, exact_guards: bool) -> None:
        self.ana = ana
        self.exact_guards = exact_guards
        self.lets: dict[tvm.ir.Var, tvm.ir.PrimExpr] = {}
        self.result = KernelTraffic()
        # Loads counted in the current statement (or run of bindings), keyed by (buffer,
        # index hash), with the guards they were counted under.
        self.seen: dict[tuple[tvm.ir.Var, int], list[tuple[tvm.ir.PrimExpr, ...]]] = {}
        self.binding = False  # the statement before was a Bind: its loads are still counted
        self.name = name
        self.lanes: dict[tvm.ir.Var, np.ndarray] = {}  # thread index -> its first warp's values

    def constant(self, var: tvm.ir.Var) -> int | None:
        value = self.ana.simplify(var)
        return int(value) if isinstance(value, tirx.IntImm) else None

    def integer(self, expr: tvm.ir.PrimExpr, what: str) -> int:
        try:
            return evaluate_int(self.ana, expr, f"{self.name}: {what}")
        except LoweringError as err:
            raise AnalysisError(str(err)) from None

    def thread_axes(self, body: tirx.Stmt) -> tuple[Axis, ...]:
        """One axis per thread tag; every statement of the kernel runs on all of them."""
        axes: dict[str, Axis] = {}
        attrs: list[tirx.AttrStmt] = []
        tvm_ffi.structural_walk(body, [(tirx.AttrStmt, attrs.append)])
        for stmt in attrs:
            if stmt.attr_key != "thread_extent":
                continue
            tag = str(stmt.node.thread_tag)
            extent = self.integer(stmt.value, f"extent of {tag}")
            if tag in axes:
                if axes[tag].extent != extent:
                    raise AnalysisError(f"{self.name}: {tag} launched with two extents")
                self.lets[stmt.node.var] = axes[tag].var  # same hardware index, another name
            else:
                axes[tag] = Axis(stmt.node.var, 0, extent)
        self.lanes = _first_warp(axes)
        return tuple(axes.values())

    def caveat(self, text: str) -> None:
        """Note why the count is not exact."""
        self.result.exact = False
        if text not in self.result.caveats:
            self.result.caveats.append(text)

    def points(self, frame: _Frame) -> int:
        if frame.count is None:
            guards = list(frame.guards) if self.exact_guards else []
            if not self.exact_guards and frame.guards:
                self.result.exact = False
            for guard in [g for g in guards if reads_memory(g, self.lets)]:
                guards.remove(guard)
                self.caveat(f"data-dependent guard counted as always true: {guard}")
            count = count_points(frame.axes, guards, self.lets, self.constant)
            if count is None:
                count = math.prod(a.trips for a in frame.axes)
                self.caveat("guard counted as always true: " + " and ".join(map(str, guards)))
            frame.count = count
        return frame.count

    def access(self, buffer: tvm.ir.Var, dtype: str, index: tvm.ir.PrimExpr | None,
               frame: _Frame, write: bool) -> None:
        if not is_global(buffer):
            return
        count = self.points(frame)
        nbytes = count * bytes_per_access(dtype)
        self.result.sector_bytes += nbytes * self.sector_ratio(buffer, dtype, index, frame)
        name = str(buffer.name)
        entry = self.result.buffers.get(name)
        if entry is None:
            entry = BufferTraffic(name, self.footprint(buffer))
            self.result.buffers[name] = entry
        if write:
            entry.write_bytes += nbytes
            self.result.write_bytes += nbytes
        else:
            entry.read_bytes += nbytes
            self.result.read_bytes += nbytes
        self.result.accesses += count
        self.result.step_accesses += count / frame.steps

    def sector_ratio(self, buffer: tvm.ir.Var, dtype: str, index: tvm.ir.PrimExpr | None,
                     frame: _Frame) -> float:
        """Sector bytes per byte asked for by the first warp's lanes at this access (1.0 when
        its index or guards cannot be evaluated, or no lane of that warp runs it)."""
        if index is None or not self.lanes:
            return 1.0
        lanes = 1
        if isinstance(index, tirx.Ramp):
            lanes = int(index.lanes) if isinstance(index.lanes, int | tirx.IntImm) else 1
            index = index.base
        env = {a.var: np.asarray(a.min) for a in frame.axes}
        env.update(self.lanes)
        evaluate = Evaluator(env, self.lets, self.constant)
        warp = len(next(iter(self.lanes.values())))
        try:
            first = np.broadcast_to(evaluate(index), (warp,))
            active = np.ones(warp, dtype=bool)
            for guard in frame.guards:
                active &= np.broadcast_to(evaluate(guard), (warp,)).astype(bool)
        except (Unsupported, ValueError, TypeError):
            return 1.0
        if not active.any():
            return 1.0
        size = bytes_per_access(dtype)
        element = size // lanes
        starts = first[active].astype(np.int64) * element
        sectors = np.unique(np.concatenate([
            (starts + offset) // SECTOR_BYTES for offset in range(0, size, min(size, SECTOR_BYTES))]
            + [(starts + size - 1) // SECTOR_BYTES]))
        return len(sectors) * SECTOR_BYTES / (int(active.sum()) * size)

    def footprint(self, buffer: tvm.ir.Var) -> int:
        shape = buffer.ty.shape
        elems = math.prod(self.integer(d, f"shape of {buffer.name}") for d in shape)
        return elems * bytes_per_access(str(buffer.ty.dtype))

    # Statements -----------------------------------------------------------------------

    def stmt(self, stmt: tirx.Stmt, frame: _Frame) -> None:
        if not (isinstance(stmt, tirx.Bind) and self.binding):
            self.seen.clear()
        self.binding = isinstance(stmt, tirx.Bind)
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.stmt(s, frame)
        elif isinstance(stmt, tirx.BufferStore):
            self.access(stmt.buffer, str(stmt.value.ty.dtype), _flat(stmt.indices), frame,
                        write=True)
            for index in stmt.indices:
                self.expr(index, frame)
            self.expr(stmt.value, frame)
        elif isinstance(stmt, tirx.Evaluate):
            self.expr(stmt.value, frame)
        elif isinstance(stmt, tirx.Bind):
            self.lets[stmt.var] = stmt.value
            self.expr(stmt.value, frame)
        elif isinstance(stmt, tirx.LetStmt):
            self.lets[stmt.var] = stmt.value
            self.expr(stmt.value, frame)
            self.stmt(stmt.body, frame)
        elif isinstance(stmt, tirx.IfThenElse):
            self.expr(stmt.condition, frame)
            self.stmt(stmt.then_case, frame.nested(guard=stmt.condition))
            if stmt.else_case is not None:
                self.stmt(stmt.else_case, frame.nested(guard=tirx.Not(stmt.condition)))
        elif isinstance(stmt, tirx.For):
            axis = self.loop_axis(stmt)
            steps = axis.trips if stmt.kind == tirx.ForKind.SERIAL and _synchronises(stmt.body) \
                else 1
            self.stmt(stmt.body, frame.nested(axis=axis, steps=steps))
        elif isinstance(stmt, tirx.AttrStmt):
            self.stmt(stmt.body, frame)
        elif isinstance(stmt, tirx.DeclBuffer | tirx.AllocBuffer | tirx.AssertStmt):
            pass
        else:
            raise AnalysisError(f"{self.name}: cannot count accesses of a {type(stmt).__name__}")

    def loop_axis(self, loop: tirx.For) -> Axis:
        what = f"loop {loop.loop_var.name}"
        step = 1 if loop.step is None else self.integer(loop.step, f"step of {what}")
        return Axis(loop.loop_var, self.integer(loop.min, f"start of {what}"),
                    self.integer(loop.extent, f"trip count of {what}"), step)

    # Expressions ----------------------------------------------------------------------

    def expr(self, expr: tvm.ir.PrimExpr, frame: _Frame) -> None:
        # The walk only collects: an exception raised inside an FFI callback loses its type.
        loads: list[tvm.ir.TensorLoad] = []
        branches: list[tuple[tvm.ir.PrimExpr, _Frame]] = []

        def call(node: tvm.ir.Call) -> tvm_ffi.WalkResult:
            op = node.op.name if isinstance(node.op, tvm.ir.Op) else ""
            if op == IF_THEN_ELSE:
                cond, then, other = node.args
                branches.extend([(cond, frame), (then, frame.nested(guard=cond)),
                                 (other, frame.nested(guard=tirx.Not(cond)))])
                return tvm_ffi.WalkResult.SKIP
            if op == _ADDRESS_OF:
                return tvm_ffi.WalkResult.SKIP
            if any(word in op for word in _OPAQUE_MEMORY_OPS):
                self.caveat(f"global memory moved by {op} is not counted")
            return tvm_ffi.WalkResult.ADVANCE

        tvm_ffi.structural_walk(expr, [(tvm.ir.TensorLoad, loads.append), (tvm.ir.Call, call)],
                                order="pre")
        for load in loads:
            # A value loaded under the same or fewer guards is already in a register.
            counted = self.seen.setdefault((load.source, tvm_ffi.structural_hash(load.indices)),
                                           [])
            if not any(_is_prefix(g, frame.guards) for g in counted):
                counted.append(frame.guards)
                self.access(load.source, str(load.ty.dtype), _flat(load.indices), frame,
                            write=False)
        for sub, sub_frame in branches:
            self.expr(sub, sub_frame)


def _flat(indices) -> tvm.ir.PrimExpr | None:
    """The one index of an access to a flattened buffer (None for any other)."""
    return indices[0] if len(indices) == 1 else None


_THREAD_ORDER = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


def _first_warp(axes: dict[str, Axis]) -> dict[tvm.ir.Var, np.ndarray]:
    """The values each thread index takes over the lanes of a block's first warp (lanes
    run over threadIdx.x first, then y, then z)."""
    threads = [(axes[t].var, axes[t].extent) for t in _THREAD_ORDER if t in axes]
    size = min(WARP_SIZE, math.prod(e for _, e in threads)) if threads else 0
    lane = np.arange(size, dtype=np.int64)
    values, stride = {}, 1
    for var, extent in threads:
        values[var] = lane // stride % extent
        stride *= extent
    return values


def _synchronises(body: tirx.Stmt) -> bool:
    """Whether ``body`` synchronises threads: a barrier (of the block or the grid) or a
    cross-thread reduction."""
    found: list[object] = []

    def call(node: tvm.ir.Call) -> None:
        if isinstance(node.op, tvm.ir.Op) and node.op.name.startswith(_SYNC_OPS):
            found.append(node)

    def evaluate(node: tirx.Evaluate) -> None:
        if is_grid_sync(node):
            found.append(node)

    tvm_ffi.structural_walk(body, [(tvm.ir.Call, call), (tirx.Evaluate, evaluate)])
    return bool(found)


def _is_prefix(short: tuple[tvm.ir.PrimExpr, ...], long: tuple[tvm.ir.PrimExpr, ...]) -> bool:
    return len(short) <= len(long) and all(
        a.same_as(b) for a, b in zip(short, long[: len(short)], strict=True))


def count_traffic(kernel: tirx.PrimFunc, ana: Analyzer, exact_guards: bool = True,
                  name: str = "kernel") -> KernelTraffic:
    """Global bytes read and written by one launch of the device PrimFunc ``kernel``.

    ``ana`` binds the kernel's scalar parameters (shape variables) to their values; see
    ``kernel_analyzer``. Raises AnalysisError if a loop trip count is not a constant.
    """
    counter = _Counter(name, ana, exact_guards)
    counter.stmt(kernel.body, _Frame(counter.thread_axes(kernel.body), ()))
    return counter.result
