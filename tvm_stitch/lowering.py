"""Lower one GPU-scheduled PrimFunc to its device kernels and the host's launch sequence.

TVM's TIR pipeline splits a scheduled PrimFunc into a host function, which computes launch
extents and calls each kernel (``tirx.call_ffi_kernel``), and one device PrimFunc per kernel.
We stop the host side just before ``MakePackedAPI`` so its calls are still readable, and keep
the device side fully finalised so its code is exactly what TVM would generate. The SIMT
runner, the traffic analysis and the CUDA compile checks all read this one structure.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import tvm
from tvm import tirx
from tvm.ir import IRModule
from tvm.sym import Analyzer
from tvm.target import Target
from tvm.tirx.build import split_host_device_mods

from .transform.expressions import substituted_all


class LoweringError(RuntimeError):
    """A PrimFunc whose host side does something the launch interpreter cannot follow."""


@dataclass(frozen=True)
class BufferArg:
    """A kernel argument that is the data pointer of buffer parameter number ``index``."""

    index: int


@dataclass(frozen=True)
class WorkspaceArg:
    """A kernel argument that is the data pointer of host-allocated workspace ``index``: a
    global-memory intermediate that TVM passes between the kernels of one PrimFunc."""

    index: int


@dataclass(frozen=True)
class Workspace:
    """A global buffer the host allocates for the duration of the call."""

    dtype: str
    shape: tuple[tvm.ir.PrimExpr, ...]


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel call made by the host function, with symbolic arguments and extents.

    ``launch`` pairs each thread tag (``blockIdx.x``, ``threadIdx.y``, ...) with its extent;
    ``dynamic_shared_bytes`` is the dynamic shared memory the host gives each block (TVM's
    launch parameter ``tirx.use_dyn_shared_memory``), None for a kernel without any;
    ``cooperative`` says the kernel is launched cooperatively (``COOPERATIVE_TAG``).
    ``loops`` are the host loops around the call, outermost first (a loop variable and its
    extent, from 0): TVM's cumsum launches one kernel per round of a scan; the arguments and
    extents are expressions of those variables (``LoweredFunc.launch_sequence`` expands them).
    """

    kernel: str
    args: tuple[BufferArg | WorkspaceArg | tvm.ir.PrimExpr, ...]
    launch: tuple[tuple[str, tvm.ir.PrimExpr], ...]
    dynamic_shared_bytes: tvm.ir.PrimExpr | None = None
    cooperative: bool = False
    loops: tuple[tuple[tvm.ir.Var, tvm.ir.PrimExpr], ...] = ()

    def at(self, values: dict[tvm.ir.Var, int]) -> KernelLaunch:
        """This launch at one iteration of its host loops (``values`` of their variables)."""
        consts = _constants(values)
        return replace(
            self, args=tuple(a if isinstance(a, BufferArg | WorkspaceArg)
                             else substituted_all(a, consts) for a in self.args),
            launch=tuple((t, substituted_all(e, consts)) for t, e in self.launch),
            dynamic_shared_bytes=None if self.dynamic_shared_bytes is None
            else substituted_all(self.dynamic_shared_bytes, consts), loops=())

    def geometry(self, ana: Analyzer) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Blocks per grid and threads per block, (x, y, z) each, under ``ana``'s bindings."""
        grid, block = [1, 1, 1], [1, 1, 1]
        for tag, extent in self.launch:
            scope, _, axis = tag.partition(".")
            value = evaluate_int(ana, extent, f"{self.kernel} extent of {tag}")
            (grid if scope == "blockIdx" else block)["xyz".index(axis)] = value
        return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])


@dataclass
class LoweredFunc:
    """A PrimFunc split into device kernels and the host launch sequence that drives them."""

    name: str
    params: list[tvm.ir.Var]
    binds: list[tuple[tvm.ir.Var, tvm.ir.PrimExpr]]
    launches: list[KernelLaunch]
    workspaces: list[Workspace]
    device: IRModule
    target: Target
    _source: str | None = field(default=None, repr=False)

    def kernel(self, name: str) -> tirx.PrimFunc:
        """The finalised device PrimFunc of kernel ``name``."""
        return self.device[name]

    def launch_sequence(self, ana: Analyzer) -> list[KernelLaunch]:
        """Every kernel call of one run, in order, under ``ana``'s shape bindings: the calls
        inside host loops once per iteration, their loop variables substituted."""
        out: list[KernelLaunch] = []

        def expand(launch: KernelLaunch, depth: int, values: dict[tvm.ir.Var, int]) -> None:
            if depth == len(launch.loops):
                out.append(launch.at(values))
                return
            var, extent = launch.loops[depth]
            count = evaluate_int(ana, substituted_all(extent, _constants(values)),
                                 f"{self.name} host loop over {var.name}")
            for i in range(count):
                expand(launch, depth + 1, {**values, var: i})

        for launch in self.launches:
            if launch.loops:
                expand(launch, 0, {})
            else:
                out.append(launch)
        return out

    def source(self) -> str:
        """Device source code (OpenCL C or CUDA C) of every kernel, as TVM emits it."""
        if self._source is None:
            build = tvm.get_global_func("target.build." + self.target.kind.name)
            self._source = build(self.device, self.target).inspect_source()
        return self._source

    def bind_shapes(self, shapes: list[tuple[int, ...]], scalars: dict[str, int] | None = None
                    ) -> Analyzer:
        """An analyzer with every shape variable bound from the concrete argument shapes.

        ``shapes`` holds one entry per buffer parameter, in parameter order; scalar parameters
        are bound from ``scalars`` by name.
        """
        ana = Analyzer()
        scalars = scalars or {}
        shapes_iter = iter(shapes)
        derived: list[tuple[tirx.Buffer, tvm.ir.PrimExpr, int]] = []
        for p in self.params:
            if _is_buffer_param(p):
                shape = next(shapes_iter)
                if len(shape) != len(p.shape):
                    raise ValueError(
                        f"{self.name}: parameter {p.name} has rank {len(p.shape)}, "
                        f"got shape {tuple(shape)}"
                    )
                for dim, size in zip(p.shape, shape, strict=True):
                    if isinstance(dim, tvm.ir.Var):
                        ana.bind(dim, tirx.IntImm(scalar_dtype(dim), int(size)))
                    else:  # a number, or an expression of variables (``past + 1``)
                        derived.append((p, dim, int(size)))
            else:
                if p.name not in scalars:
                    raise ValueError(f"{self.name}: scalar parameter {p.name} needs a value")
                ana.bind(p, tirx.IntImm(scalar_dtype(p), int(scalars[p.name])))
        for p, dim, size in derived:  # once every variable of a plain dimension is bound
            value = ana.simplify(dim)
            if not isinstance(value, tirx.IntImm):
                raise LoweringError(f"{self.name}: shape expression {dim} of {p.name} has "
                                    "variables no argument's shape gives")
            if int(value) != size:
                raise ValueError(f"{self.name}: parameter {p.name} expects {list(p.shape)}, "
                                 f"its dimension {dim} = {int(value)}, got {size}")
        for var, value in self.binds:
            ana.bind(var, ana.simplify(value))
        return ana


def _is_buffer_param(p: tvm.ir.Var) -> bool:
    return isinstance(p.ty, tirx.BufferType)


def scalar_dtype(var: tvm.ir.Var) -> str:
    """The dtype of a scalar TIR variable (a kernel's integer parameter, a shape variable)."""
    return str(var.ty.dtype)


def evaluate_int(ana: Analyzer, expr: tvm.ir.PrimExpr, what: str) -> int:
    """Evaluate ``expr`` to an integer under the bindings of ``ana``, or raise LoweringError."""
    value = ana.simplify(expr)
    if not isinstance(value, tirx.IntImm):
        raise LoweringError(f"{what}: {expr} does not reduce to a constant (got {value})")
    return int(value)


class _Capture:
    """Pass instrument that keeps the module as it stands before MakePackedAPI."""

    def __init__(self) -> None:
        self.module: IRModule | None = None

    def run_before_pass(self, mod: IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == "tirx.MakePackedAPI":
            self.module = mod


LOWERED_KEPT = 256
"""Lowered PrimFuncs kept (``lower``): the analysis, the SIMT runner and the resource check
each lower the same functions of a compiled module, once per size they run it at."""

_lowered: OrderedDict[tuple[int, str, str, bool], tuple[tirx.PrimFunc, LoweredFunc]] = \
    OrderedDict()


def lower(func: tirx.PrimFunc, name: str, target: Target, vectorize: bool = True
          ) -> LoweredFunc:
    """Run TVM's TIR pipeline on ``func`` for ``target`` and split it into host and kernels.

    ``vectorize=False`` turns vectorised loops into per-lane loops inside each thread (same
    launch geometry, same indices), as TVM's ``tirx.disable_vectorize`` option does. The
    result depends on nothing else (the pipeline runs in a PassContext of its own), so the
    last ``LOWERED_KEPT`` are kept by the identity of ``func``; treat it as read-only.
    """
    key = (hash(func), name, str(target), vectorize)  # a TVM object hashes by its handle
    kept = _lowered.get(key)
    if kept is not None and kept[0].same_as(func):
        _lowered.move_to_end(key)
        return kept[1]
    lowered = _lowered_anew(func, name, target, vectorize)
    _lowered[key] = (func, lowered)  # holding func keeps its handle from being reused
    if len(_lowered) > LOWERED_KEPT:
        _lowered.popitem(last=False)
    return lowered


def _lowered_anew(func: tirx.PrimFunc, name: str, target: Target, vectorize: bool
                  ) -> LoweredFunc:
    capture = tvm.instrument.pass_instrument(_Capture)()
    mod = IRModule({name: func.with_attr("global_symbol", name)})
    mod = tirx.transform.BindTarget(target.with_host("llvm"))(mod)
    pipeline, _, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    config = {"tirx.disable_vectorize": not vectorize}
    with target, tvm.transform.PassContext(instruments=[capture], config=config):
        lowered = pipeline(mod)
    if capture.module is None:
        raise LoweringError(f"{name}: TVM's TIR pipeline did not reach MakePackedAPI")
    _, devices = split_host_device_mods(lowered)
    if len(devices) > 1:
        raise LoweringError(f"{name}: kernels for several device targets")
    device = finalize_device()(next(iter(devices.values()))) if devices else IRModule({})
    host = capture.module[name]
    binds, launches, workspaces = _read_host(host, name, device)
    return LoweredFunc(name, list(host.params), binds, launches, workspaces, device, target)


_DYNAMIC_SHARED_TAG = "tirx.use_dyn_shared_memory"

COOPERATIVE_TAG = "tirx.use_cooperative_launch"
"""TVM's launch parameter of a kernel launched cooperatively (``cuLaunchCooperativeKernel``):
the driver refuses a grid whose blocks cannot all be resident at once. A PrimFunc asks for it
by listing it in its ``tirx.kernel_launch_params`` attribute."""


def _constants(values: Mapping[tvm.ir.Var, int]) -> dict[tvm.ir.Var, tvm.ir.PrimExpr]:
    return {v: tirx.IntImm(scalar_dtype(v), i) for v, i in values.items()}


def _read_host(host: tirx.PrimFunc, name: str, device: IRModule
               ) -> tuple[list[tuple[tvm.ir.Var, tvm.ir.PrimExpr]], list[KernelLaunch],
                          list[Workspace]]:
    """Read the host body: bindings, workspace allocations and kernel calls, in order."""
    binds: list[tuple[tvm.ir.Var, tvm.ir.PrimExpr]] = []
    launches: list[KernelLaunch] = []
    workspaces: list[Workspace] = []
    workspace_vars: list[tvm.ir.Var] = []
    buffer_params = [p for p in host.params if _is_buffer_param(p)]
    aliases: list[tuple[tvm.ir.Var, tvm.ir.PrimExpr]] = []  # declared buffer -> its data
    loops: list[tuple[tvm.ir.Var, tvm.ir.PrimExpr]] = []  # host loops around the statement
    local: dict[tvm.ir.Var, tvm.ir.PrimExpr] = {}  # bindings inside them, substituted

    def argument(expr: tvm.ir.PrimExpr) -> BufferArg | WorkspaceArg | tvm.ir.PrimExpr:
        while isinstance(expr, tvm.ir.Call) and expr.op.name == "tirx.buffer_data":
            buf = expr.args[0]
            for i, p in enumerate(buffer_params):
                if p.same_as(buf):
                    return BufferArg(i)
            for i, w in enumerate(workspace_vars):
                if w.same_as(buf):
                    return WorkspaceArg(i)
            source = next((data for var, data in aliases if var.same_as(buf)), None)
            if source is None:
                raise LoweringError(f"{name}: kernel argument {expr} is not a parameter's data")
            expr = source
        return expr

    def visit(stmt: tirx.Stmt) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, tirx.Bind) and loops:  # may vary with the loop: substituted
            local[stmt.var] = substituted_all(stmt.value, local)
        elif isinstance(stmt, tirx.Bind):
            binds.append((stmt.var, stmt.value))
        elif isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.SERIAL:
            if not (isinstance(stmt.min, tirx.IntImm) and int(stmt.min) == 0):
                raise LoweringError(f"{name}: host loop over {stmt.loop_var} from {stmt.min}")
            loops.append((stmt.loop_var, substituted_all(stmt.extent, local)))
            visit(stmt.body)
            loops.pop()
        elif isinstance(stmt, tirx.DeclBuffer):
            aliases.append((stmt.buffer, stmt.data))
        elif isinstance(stmt, tirx.AllocBuffer) and stmt.buffer.scope() == "global":
            workspace_vars.append(stmt.buffer)
            workspaces.append(Workspace(str(stmt.buffer.dtype), tuple(stmt.buffer.shape)))
        elif isinstance(stmt, tirx.AssertStmt):
            pass  # argument checks; the launcher checks shapes and dtypes itself
        elif isinstance(stmt, tirx.AttrStmt):
            visit(stmt.body)
        elif isinstance(stmt, tirx.Evaluate):
            call = stmt.value
            if isinstance(call, tirx.IntImm):
                return
            if not (isinstance(call, tvm.ir.Call) and call.op.name == "tirx.call_ffi_kernel"):
                raise LoweringError(f"{name}: host code calls {call}, not a kernel")
            kernel = str(call.args[0].value)
            params = device[kernel].params
            tags = [str(t) for t in call.attrs.launch_params]
            values = [substituted_all(v, local) for v in call.args[1:]]
            args, extents = values[: len(params)], values[len(params):]
            dynamic_shared = None
            if _DYNAMIC_SHARED_TAG in tags:
                dynamic_shared = extents.pop(tags.index(_DYNAMIC_SHARED_TAG))
                tags.remove(_DYNAMIC_SHARED_TAG)
            cooperative = COOPERATIVE_TAG in tags  # a flag: no extent of its own
            tags = [t for t in tags if t != COOPERATIVE_TAG]
            launches.append(KernelLaunch(kernel, tuple(argument(a) for a in args),
                                         tuple(zip(tags, extents, strict=True)),
                                         dynamic_shared, cooperative, tuple(loops)))
        else:
            raise LoweringError(
                f"{name}: host code has a {type(stmt).__name__}, which the launcher cannot run"
            )

    visit(host.body)
    return binds, launches, workspaces
