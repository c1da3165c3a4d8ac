"""Kernels, global traffic and roofline time of one run of a scheduled module.

``analyze`` walks the ``call_tir`` bindings of ``main`` in order, lowers each called PrimFunc
with TVM's TIR pipeline (``tvm_stitch.lowering``), and for each kernel it launches counts
the global bytes from the finalised device TIR (``traffic``), the launch shape, and the
roofline time on each GPU of ``roofline.GPUS``. Compulsory bytes are what any implementation
must move: each input and constant of ``main`` read once, each output written once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import IRModule
from tvm.sym import Analyzer
from tvm.target import Target

from ..lowering import (
    BufferArg,
    LoweredFunc,
    LoweringError,
    WorkspaceArg,
    evaluate_int,
    lower,
    scalar_dtype,
)
from ..schedule.grid_barrier import count_grid_barriers
from ..symbolic import shape_vars
from ..target import parse_target
from .classify import has_contraction
from .ptxas import KernelResources, lowered_resources
from .roofline import GPU, GPUS, KernelWork, kernel_time_us, waves
from .traffic import AnalysisError, KernelTraffic, bytes_per_access, count_traffic

_CALL_TIR = ("relax.call_tir", "relax.call_tir_with_grad", "relax.call_tir_inplace")
_LIBRARY_CALLS = ("relax.call_dps_packed",)
_SYMBOLIC_HINT = "pass the input shapes of symbolic dimensions"

Shapes = Mapping[str, Sequence[int]] | Sequence[Sequence[int]]


@dataclass
class KernelReport:
    """One kernel launch: where it comes from, its launch shape, traffic and resources."""

    name: str
    func: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    traffic: KernelTraffic
    memory_intensive: bool
    resources: KernelResources | None = None
    grid_barriers: int = 0

    @property
    def blocks(self) -> int:
        """Thread blocks in the grid."""
        return math.prod(self.grid)

    @property
    def threads_per_block(self) -> int:
        """Threads in one block."""
        return math.prod(self.block)

    @property
    def work(self) -> KernelWork:
        """What the roofline model needs of this launch."""
        return KernelWork(self.traffic.global_bytes, self.traffic.accesses, self.blocks,
                          self.threads_per_block, self.traffic.step_accesses,
                          self.grid_barriers)

    def waves(self) -> dict[str, float]:
        """Waves of blocks per GPU (thread-limited occupancy)."""
        return {g: waves(gpu, self.blocks, self.threads_per_block) for g, gpu in GPUS.items()}

    def roofline_us(self) -> dict[str, float]:
        """Estimated microseconds per GPU."""
        return {g: kernel_time_us(gpu, self.work) for g, gpu in GPUS.items()}

    def to_dict(self, buffers: bool = False) -> dict[str, object]:
        """Plain-data form; ``buffers`` adds the per-buffer breakdown."""
        out: dict[str, object] = {
            "name": self.name,
            "func": self.func,
            "memory_intensive": self.memory_intensive,
            "grid": list(self.grid),
            "block": list(self.block),
            "blocks": self.blocks,
            "threads_per_block": self.threads_per_block,
            "waves": self.waves(),
            "read_bytes": self.traffic.read_bytes,
            "write_bytes": self.traffic.write_bytes,
            "global_bytes": self.traffic.global_bytes,
            "dram_bytes": self.traffic.dram_bytes,
            "sector_bytes": round(self.traffic.sector_bytes),
            "accesses": self.traffic.accesses,
            "step_accesses": self.traffic.step_accesses,
            "grid_barriers": self.grid_barriers,
            "exact": self.traffic.exact,
            "roofline_us": self.roofline_us(),
        }
        if self.resources is not None:
            out.update(vars(self.resources))
        if buffers:
            out["buffers"] = {name: vars(b) for name, b in self.traffic.buffers.items()}
        return out


@dataclass
class ModuleReport:
    """Every kernel one run of a module launches, in order, and the module's totals."""

    kernels: list[KernelReport]
    input_bytes: int
    constant_bytes: int
    output_bytes: int
    notes: list[str] = field(default_factory=list)

    @property
    def compulsory_bytes(self) -> int:
        """Inputs and constants read once plus outputs written once."""
        return self.input_bytes + self.constant_bytes + self.output_bytes

    @property
    def mem_kernels(self) -> int:
        """Kernels of PrimFuncs without a matmul or convolution."""
        return sum(k.memory_intensive for k in self.kernels)

    @property
    def read_bytes(self) -> int:
        """Global bytes read by all kernels."""
        return sum(k.traffic.read_bytes for k in self.kernels)

    @property
    def write_bytes(self) -> int:
        """Global bytes written by all kernels."""
        return sum(k.traffic.write_bytes for k in self.kernels)

    @property
    def global_bytes(self) -> int:
        """Global bytes read and written by all kernels."""
        return self.read_bytes + self.write_bytes

    @property
    def dram_bytes(self) -> int:
        """Global bytes that reach DRAM: all but the L2 cache's re-reads of small buffers
        (``traffic.L2_RESIDENT_BYTES``)."""
        return sum(k.traffic.dram_bytes for k in self.kernels)

    @property
    def sector_bytes(self) -> int:
        """Bytes of the 32-byte sectors all kernels' warps move (``traffic``): above
        ``global_bytes`` where accesses are not coalesced."""
        return round(sum(k.traffic.sector_bytes for k in self.kernels))

    @property
    def dram_ratio(self) -> float:
        """DRAM bytes over compulsory bytes (1.0 is ideal)."""
        if self.compulsory_bytes == 0:
            return math.inf if self.dram_bytes else 1.0
        return self.dram_bytes / self.compulsory_bytes

    @property
    def traffic_ratio(self) -> float:
        """Global bytes over compulsory bytes (1.0 is ideal; inf if nothing is compulsory)."""
        if self.compulsory_bytes == 0:
            return math.inf if self.global_bytes else 1.0
        return self.global_bytes / self.compulsory_bytes

    def roofline_us(self) -> dict[str, float]:
        """Estimated microseconds per GPU for the whole run."""
        return {g: sum(kernel_time_us(gpu, k.work) for k in self.kernels)
                for g, gpu in GPUS.items()}

    def to_dict(self, buffers: bool = False) -> dict[str, object]:
        """Plain-data form (JSON-ready); ``buffers`` adds per-buffer breakdowns per kernel."""
        return {
            "kernels": len(self.kernels),
            "mem_kernels": self.mem_kernels,
            "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes,
            "global_bytes": self.global_bytes,
            "compulsory_bytes": self.compulsory_bytes,
            "traffic_ratio": self.traffic_ratio,
            "dram_bytes": self.dram_bytes,
            "dram_ratio": self.dram_ratio,
            "sector_bytes": self.sector_bytes,
            "roofline_us": self.roofline_us(),
            "per_kernel": [k.to_dict(buffers) for k in self.kernels],
        }

    def render(self) -> str:
        """A small text table of the report, for the command line."""
        return render(self)


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units: 393216 -> '393.2 KB'."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def render(report: ModuleReport) -> str:
    """The report as text: totals, then one row per kernel (H200 waves and time)."""
    times = report.roofline_us()
    lines = [
        f"kernels {len(report.kernels)} (memory-intensive {report.mem_kernels})",
        f"global {format_bytes(report.global_bytes)} (read {format_bytes(report.read_bytes)},"
        f" written {format_bytes(report.write_bytes)}), compulsory "
        f"{format_bytes(report.compulsory_bytes)}, traffic ratio {report.traffic_ratio:.2f}",
        "roofline " + ", ".join(f"{g} {t:.1f} us" for g, t in times.items()),
        *report.notes,
    ]
    with_resources = any(k.resources is not None for k in report.kernels)
    header = ["#", "kernel", "kind", "grid", "block", "waves", "read", "written", "H200 us"]
    if with_resources:
        header += ["regs", "smem", "spill"]
    rows = [header]
    for i, k in enumerate(report.kernels):
        row = [str(i), k.name + ("" if k.traffic.exact else " *"),
               "mem" if k.memory_intensive else "compute",
               "x".join(map(str, trim_dims(k.grid))), "x".join(map(str, trim_dims(k.block))),
               f"{k.waves()['H200']:.2f}", format_bytes(k.traffic.read_bytes),
               format_bytes(k.traffic.write_bytes),
               f"{k.roofline_us()['H200']:.1f}"]
        if with_resources:
            r = k.resources
            row += ["-", "-", "-"] if r is None else [
                str(r.registers), format_bytes(r.shared_bytes),
                format_bytes(r.spill_store_bytes + r.spill_load_bytes)]
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    left = {1, 2}
    for r in rows:
        lines.append("  ".join(cell.ljust(w) if c in left else cell.rjust(w)
                               for c, (cell, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


def trim_dims(dims: tuple[int, int, int]) -> tuple[int, ...]:
    """(128, 1, 1) -> (128,): the dimensions up to the last one above 1."""
    last = max((i for i, d in enumerate(dims) if d != 1), default=0)
    return dims[: last + 1]


# Lowered functions to kernel reports ---------------------------------------------------------

@dataclass
class _Lowered:
    """A PrimFunc lowered once, with what every call of it shares."""

    func: LoweredFunc
    memory_intensive: bool
    resources: dict[str, KernelResources] | None

    def reports(self, host: Analyzer, exact_guards: bool) -> list[KernelReport]:
        """One report per kernel launch, with shapes bound in ``host``."""
        reports = []
        for launch in self.func.launch_sequence(host):
            what = f"{self.func.name}/{launch.kernel}"
            try:
                grid, block = launch.geometry(host)
            except LoweringError as err:
                raise AnalysisError(f"{err}; {_SYMBOLIC_HINT}") from None
            kernel = self.func.kernel(launch.kernel)
            ana = Analyzer()
            for var, _ in self.func.binds:  # host values a kernel may name (a CSE'd shape)
                value = host.simplify(var)
                if isinstance(value, tirx.IntImm):
                    ana.bind(var, value)
            for param, arg in zip(kernel.params, launch.args, strict=True):
                if not isinstance(arg, BufferArg | WorkspaceArg):
                    value = _integer(host, arg, f"{what} argument {param.name}")
                    ana.bind(param, tirx.IntImm(scalar_dtype(param), value))
            _bind_free_shape_vars(ana, kernel, self.func, host)
            traffic = count_traffic(kernel, ana, exact_guards, name=what)
            res = None if self.resources is None else self.resources.get(launch.kernel)
            reports.append(KernelReport(launch.kernel, self.func.name, grid, block,
                                        traffic, self.memory_intensive, res,
                                        count_grid_barriers(kernel)))
        return reports


def _bind_free_shape_vars(ana: Analyzer, kernel: tirx.PrimFunc, func: LoweredFunc,
                          host: Analyzer) -> None:
    """Bind the shape variables a kernel's buffer declarations name without taking them as
    parameters (TVM's common-subexpression pass passes ``batch * seq`` instead of ``batch``,
    leaving ``batch`` free in the declaration of a ``(batch, 32)`` buffer), by name, to the
    host's values."""
    host_vars = {str(v.name): v for v in _shape_vars_of(func.params)}
    named: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(kernel.body, [(tvm.ir.Var, named.append)])
    params = {str(p.name) for p in kernel.params}
    for var in named:
        name = str(var.name)
        if name in params or name not in host_vars \
                or isinstance(ana.simplify(var), tirx.IntImm):
            continue
        value = host.simplify(host_vars[name])
        if isinstance(value, tirx.IntImm):
            ana.bind(var, value)


def _integer(ana: Analyzer, expr: tvm.ir.PrimExpr | int, what: str) -> int:
    if isinstance(expr, int):
        return expr
    try:
        return evaluate_int(ana, expr, what)
    except LoweringError as err:
        raise AnalysisError(f"{err}; {_SYMBOLIC_HINT}") from None


class _Lowerer:
    """Lowers each PrimFunc once, and compiles it for resources once when asked to."""

    def __init__(self, target: Target, resources: bool) -> None:
        self.target = target
        self.resources = resources
        self.cache: dict[str, _Lowered] = {}

    def __call__(self, func: tirx.PrimFunc, name: str) -> _Lowered:
        if name not in self.cache:
            lowered = lower(func, name, self.target)
            res = lowered_resources(lowered) if self.resources and lowered.launches else None
            self.cache[name] = _Lowered(lowered, not has_contraction(func), res)
        return self.cache[name]


def analyze_primfunc(func: tirx.PrimFunc, shapes: Sequence[Sequence[int]] | None = None, *,
                     name: str = "main", scalars: Mapping[str, int] | None = None,
                     target: str | Target = "cuda", resources: bool = False,
                     exact_guards: bool = True) -> list[KernelReport]:
    """Kernel reports for one GPU-scheduled PrimFunc.

    ``shapes`` gives one concrete shape per buffer parameter in order (needed only when the
    PrimFunc has symbolic shapes), ``scalars`` its scalar parameters by name. ``resources``
    compiles the CUDA source with nvcc to read registers and shared memory.
    """
    lowered = _Lowerer(parse_target(target), resources)(func, name)
    return _static_reports(lowered, shapes, scalars, exact_guards)


def lowered_reports(lowered: LoweredFunc, memory_intensive: bool = True,
                    shape_vars: Mapping[str, int] | None = None) -> list[KernelReport]:
    """Kernel reports of a PrimFunc already lowered (``tvm_stitch.lowering.lower``), its
    symbolic dimensions at the sizes ``shape_vars`` gives by name (scalar parameters too);
    raises AnalysisError for a dimension without a size."""
    shapes, scalars = None, None
    if shape_vars:
        ana = Analyzer()
        params = lowered.params
        for var in _shape_vars_of(params):
            if str(var.name) in shape_vars:
                ana.bind(var, tirx.IntImm(scalar_dtype(var), shape_vars[str(var.name)]))
        shapes = [[_integer(ana, d, f"{lowered.name}: shape of {p.name}") for d in p.shape]
                  for p in params if isinstance(p.ty, tirx.BufferType)]
        scalars = {p.name: shape_vars[p.name] for p in params
                   if not isinstance(p.ty, tirx.BufferType) and p.name in shape_vars}
    return _static_reports(_Lowered(lowered, memory_intensive, None), shapes, scalars, True)


def _shape_vars_of(params: Sequence[tvm.ir.Var]) -> list[tvm.ir.Var]:
    return shape_vars(d for p in params for d in getattr(p, "shape", ()))


def _static_reports(lowered: _Lowered, shapes: Sequence[Sequence[int]] | None,
                    scalars: Mapping[str, int] | None, exact_guards: bool
                    ) -> list[KernelReport]:
    name = lowered.func.name
    if shapes is None:
        shapes = [[_integer(Analyzer(), d, f"{name}: shape of {p.name}") for d in p.shape]
                  for p in lowered.func.params if isinstance(p.ty, tirx.BufferType)]
    host = lowered.func.bind_shapes([tuple(s) for s in shapes], dict(scalars or {}))
    return lowered.reports(host, exact_guards)


# Relax main -------------------------------------------------------------------------------

def _op_name(call: relax.Call) -> str:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else ""


def _tensor_types(ty: relax.Type, what: str) -> list[relax.TensorType]:
    if isinstance(ty, relax.TensorType):
        return [ty]
    if isinstance(ty, relax.TupleType):
        return [t for f in ty.fields for t in _tensor_types(f, what)]
    raise AnalysisError(f"{what} has type {ty}, not a tensor or a tuple of tensors")


def _shape(ana: Analyzer, ty: relax.TensorType, what: str) -> tuple[int, ...]:
    if not isinstance(ty.shape, relax.ShapeExpr):
        raise AnalysisError(f"{what} has no known shape ({ty})")
    return tuple(_integer(ana, d, f"{what} dimension {d}") for d in ty.shape.values)


def _tensor_bytes(ana: Analyzer, ty: relax.TensorType, what: str) -> int:
    return math.prod(_shape(ana, ty, what)) * bytes_per_access(str(ty.dtype))


def static_bytes(ty: relax.Type) -> int | None:
    """Bytes of the tensors of a Relax type (a tensor or a tuple of them); None when a shape
    is symbolic or unknown, or the type holds something else."""
    try:
        return sum(_tensor_bytes(Analyzer(), t, "value") for t in _tensor_types(ty, "value"))
    except AnalysisError:
        return None


def _bind_inputs(main: relax.Function, input_shapes: Shapes | None,
                 shape_vars: Mapping[str, int] | None) -> Analyzer:
    """An analyzer with main's symbolic dimensions bound from the given shapes and values."""
    ana = Analyzer()
    params = [(p.name, t) for p in main.params for t in _tensor_types(p.ty, f"parameter {p.name}")]
    if input_shapes is None:
        given: dict[str, Sequence[int]] = {}
    elif isinstance(input_shapes, Mapping):
        given = dict(input_shapes)
        unknown = set(given) - {n for n, _ in params}
        if unknown:
            raise ValueError(f"input_shapes names no parameter of main: {sorted(unknown)}")
    else:
        if len(input_shapes) != len(params):
            raise ValueError(
                f"main has {len(params)} tensor inputs, got {len(input_shapes)} shapes")
        given = {n: s for (n, _), s in zip(params, input_shapes, strict=True)}
    symbols: dict[str, tvm.ir.Var] = {}

    def symbol(var: tvm.ir.Var) -> None:
        if isinstance(var.ty, tvm.ir.PrimType):
            symbols.setdefault(str(var.name), var)

    tvm_ffi.structural_walk(main, [(tvm.ir.Var, symbol)])
    for name, value in (shape_vars or {}).items():
        if name not in symbols:
            raise ValueError(f"shape variable {name!r} does not occur in main")
        ana.bind(symbols[name], tirx.IntImm(scalar_dtype(symbols[name]), int(value)))
    for name, ty in params:
        if name not in given:
            continue
        dims = ty.shape.values if isinstance(ty.shape, relax.ShapeExpr) else []
        if len(dims) != len(given[name]):
            raise ValueError(f"input {name} has rank {len(dims)}, got shape {tuple(given[name])}")
        for dim, size in zip(dims, given[name], strict=True):
            if isinstance(dim, tvm.ir.Var) and not isinstance(ana.simplify(dim), tirx.IntImm):
                ana.bind(dim, tirx.IntImm(scalar_dtype(dim), int(size)))
    for name, ty in params:
        if name in given and _shape(ana, ty, f"input {name}") != tuple(given[name]):
            raise ValueError(f"input {name} is {ty}, got shape {tuple(given[name])}")
    return ana


def _call_tir_bindings(mod: IRModule, main: relax.Function) -> list[relax.Call]:
    """main's call_tir calls in order; errors on kernels launched anywhere else."""
    calls = []
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and _op_name(value) in _CALL_TIR:
                calls.append(value)
            else:
                _reject_hidden_kernels(mod, value, f"binding of {binding.var.name}", set())
    _reject_hidden_kernels(mod, main.body.body, "main's result", set())
    return calls


def _reject_hidden_kernels(mod: IRModule, expr: object, where: str, visited: set[str]) -> None:
    """Raise AnalysisError if ``expr`` launches kernels other than through a binding's call_tir:
    call_tir nested in an expression (``If`` branches), a Relax function that calls kernels,
    or a library call whose kernels we cannot see."""
    calls: list[relax.Call] = []
    tvm_ffi.structural_walk(expr, [(relax.Call, calls.append)])  # raising inside is lost
    for node in calls:
        op = _op_name(node)
        if op in _CALL_TIR:
            raise AnalysisError(f"{where}: call_tir nested inside an expression (a branch or "
                                "a loop) is not supported; only main's own bindings count")
        if op in _LIBRARY_CALLS:
            raise AnalysisError(f"{where}: library call {node.args[0]} launches kernels whose "
                                "traffic cannot be counted")
        if not isinstance(node.op, tvm.ir.GlobalVar):
            continue
        callee = node.op.name_hint
        func = mod[callee]
        if isinstance(func, tirx.PrimFunc):
            raise AnalysisError(f"{where}: direct call of PrimFunc {callee} is not supported")
        if callee not in visited:
            visited.add(callee)
            try:
                _reject_hidden_kernels(mod, func, f"function {callee}", visited)
            except AnalysisError as err:
                raise AnalysisError(f"{where} calls {callee}, which launches kernels; only "
                                    f"call_tir bindings of main are counted ({err})") from None


def _call_shapes(ana: Analyzer, call: relax.Call, func: tirx.PrimFunc, name: str
                 ) -> tuple[list[tuple[int, ...]], dict[str, int]]:
    """Concrete shapes of the PrimFunc's buffer parameters and values of its scalars."""
    args = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
    values = [a for a in args if tvm.ir.is_prim_expr(a)]  # shape values passed as arguments
    shapes = [_shape(ana, t, f"{name} argument {i}") for i, a in enumerate(args)
              if not tvm.ir.is_prim_expr(a) for t in _tensor_types(a.ty, f"{name} argument {i}")]
    outs = [t for ty in call.ty_args for t in _tensor_types(ty, f"{name} output")]
    if _op_name(call) == "relax.call_tir_inplace":
        outs = [t for t, i in zip(outs, call.attrs.inplace_indices, strict=True) if int(i) < 0]
    shapes += [_shape(ana, t, f"{name} output {i}") for i, t in enumerate(outs)]
    if len(call.args) > 2:
        values += list(call.args[2].values)
    params = [p for p in func.params if not isinstance(p.ty, tirx.BufferType)]
    scalars = {p.name: _integer(ana, v, f"{name} symbolic argument")
               for p, v in zip(params, values, strict=True)}
    return shapes, scalars


def call_arguments(scheduled: IRModule, entry: str = "main"
                   ) -> dict[str, list[tuple[list[tuple[int, ...]], dict[str, int]]]]:
    """The concrete shapes of the buffers and the values of the scalars that each call_tir
    binding of ``entry`` passes its PrimFunc, by PrimFunc name, each distinct call once: how
    a PrimFunc of symbolic shapes (TVM's own scan, ``gpu_2d_continuous_cumsum``) is launched
    in a model of static shapes. Raises AnalysisError where ``entry``'s shapes are
    symbolic."""
    main = scheduled[entry]
    ana = _bind_inputs(main, None, None)
    found: dict[str, list[tuple[list[tuple[int, ...]], dict[str, int]]]] = {}
    for call in _call_tir_bindings(scheduled, main):
        name = call.args[0].name_hint
        arguments = _call_shapes(ana, call, scheduled[call.args[0]], name)
        if arguments not in found.setdefault(name, []):
            found[name].append(arguments)
    return found


def _constants(main: relax.Function) -> list[tvm.ir.Constant]:
    found: list[tvm.ir.Constant] = []

    def constant(c: tvm.ir.Constant) -> None:
        if isinstance(c.ty, relax.TensorType) and not any(c.same_as(f) for f in found):
            found.append(c)

    tvm_ffi.structural_walk(main, [(tvm.ir.Constant, constant)])
    return found


def analyze(scheduled: IRModule, input_shapes: Shapes | None = None, *,
            shape_vars: Mapping[str, int] | None = None, target: str | Target = "cuda",
            resources: bool = False, exact_guards: bool = True,
            entry: str = "main") -> ModuleReport:
    """Kernels launched, global traffic and roofline time of one run of ``scheduled``.

    ``scheduled`` is the output of ``tvm_stitch.pipeline.lower``. Symbolic dimensions are bound
    from ``input_shapes`` (by parameter name, or a list in parameter order) and/or
    ``shape_vars`` (by variable name). ``resources`` adds registers and shared memory from
    ``ptxas -v`` for the target's architecture. Raises AnalysisError for kernels launched
    other than by a ``call_tir`` binding of ``main``.
    """
    target = parse_target(target)
    main = scheduled[entry]
    ana = _bind_inputs(main, input_shapes, shape_vars)
    lowerer = _Lowerer(target, resources)
    kernels: list[KernelReport] = []
    for call in _call_tir_bindings(scheduled, main):
        gv = call.args[0]
        func = scheduled[gv]
        shapes, scalars = _call_shapes(ana, call, func, gv.name_hint)
        lowered = lowerer(func, gv.name_hint)
        kernels += lowered.reports(lowered.func.bind_shapes(shapes, scalars), exact_guards)
    inputs = sum(_tensor_bytes(ana, t, f"input {p.name}")
                 for p in main.params for t in _tensor_types(p.ty, p.name))
    constants = sum(_tensor_bytes(ana, t, "constant")
                    for c in _constants(main) for t in _tensor_types(c.ty, "constant"))
    outputs = sum(_tensor_bytes(ana, t, "output")
                  for t in _tensor_types(main.body.body.ty, "main's result"))
    notes = [] if all(k.traffic.exact for k in kernels) else [
        "* some guards counted as always true: that kernel's bytes are upper bounds"]
    return ModuleReport(kernels, inputs, constants, outputs, notes)


def estimated_us(lowered: LoweredFunc, gpu: GPU, sizes: dict[str, int] | None = None
                 ) -> float | None:
    """The roofline estimate on ``gpu`` of all kernels of ``lowered``, symbolic dimensions at
    ``sizes``; None when a dimension has no size."""
    try:
        reports = lowered_reports(lowered, shape_vars=sizes)
    except AnalysisError:
        return None
    return sum(kernel_time_us(gpu, k.work) for k in reports)


def global_bytes(lowered: LoweredFunc, persistent_params: set[str] | None = None,
                 sizes: dict[str, int] | None = None) -> int | None:
    """Global bytes all kernels of ``lowered`` move, symbolic dimensions at ``sizes``; None
    when a dimension has no size.

    For a Global group give its PrimFunc's parameters (``persistent_params``): its inputs
    count as read, its outputs once each, and its scratch buffers (partial sums) not at all.
    Its partial sums and the combination of its outputs go through global memory by design,
    a few rows of sums that stay in L2, bought for the parallelism TVM's column reductions
    and long rows lack; what it reads of its inputs is compared like any kernel's."""
    try:
        reports = lowered_reports(lowered, shape_vars=sizes)
    except AnalysisError:
        return None
    if persistent_params is None:
        return sum(k.traffic.global_bytes for k in reports)
    moved: dict[str, int] = {}
    for report in reports:
        for name, b in report.traffic.buffers.items():
            if name in persistent_params:
                moved[name] = b.size_bytes if b.write_bytes else moved.get(name, 0) + \
                    b.read_bytes
    return sum(moved.values())
