"""Resource limits of every kernel a scheduled module launches, for each CUDA architecture.

A kernel that breaks one of these either fails to launch, deadlocks or runs far slower than
planned on the GPU, while the SIMT runner would still run it. Checked per kernel, per
architecture (``nvcc -Xptxas -v`` on TVM's CUDA source for that architecture, read by
``tvm_stitch.analysis.ptxas_resources``; launch shapes from ``tvm_stitch.lowering``):

- threads per block at most 1024 (and at most 64 on z); grid y and z at most 65535;
- static shared memory within the per-block limit (48 KB without the dynamic opt-in);
- registers per block within the register file (``registers x threads <= 65536``: more fails
  to launch with "too many resources requested");
- no register spills (stores or loads); no local memory (stack frame) at all in a stitched
  kernel, at most ``MAX_STACK_BYTES`` per thread in one TVM scheduled;
- in a stitched kernel, no thread-local array (``alloc_local`` in its TIR) with more elements
  than the plan's register budget for the group (``occupancy.cached_elements_cap``, or the
  partial sums its plan keeps in registers where they are more);
- kernels with a grid barrier: at most one wave of blocks (every block resident at once, or
  the barrier deadlocks), from the occupancy of the kernel's threads, registers and shared
  memory on the architecture's GPU; for a stitched kernel, on the GPU its plan was made for
  only (a persistent grid is sized to one wave of that GPU).

A stitched kernel of thread-block clusters is made for sm_90 and checked only on the
architectures that have clusters.

Violations are split by who scheduled the kernel: the stitch flow (PrimFuncs carrying the plan's
group attribute) or TVM's own rules (the baseline flow, and regions the plan left to TVM).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import IRModule
from tvm.sym import Analyzer

from ..analysis import GPU, KernelResources, gpu_of_arch, ptxas, ptxas_resources
from ..analysis.ptxas import BuildError
from ..analysis.report import call_arguments
from ..analysis.traffic import AnalysisError
from ..lowering import KernelLaunch, LoweredFunc, lower
from ..plan import GROUP_ATTR, BufferRole, Launch, Scheme, StitchPlan
from ..schedule.cluster import has_clusters
from ..schedule.grid_barrier import GRID_SYNC
from ..schedule.occupancy import blocks_per_sm, cached_elements_cap
from ..target import MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK, cuda_target

ARCHS = ("sm_80", "sm_90")
# A stack frame means per-thread arrays in local memory (DRAM behind L1). TVM's own kernels
# may have a few small ones; a large one is a tensor staged per thread (a whole intermediate).
MAX_STACK_BYTES = 1024


SMS: dict[str, GPU] = {arch: gpu_of_arch(arch) for arch in ARCHS}
"""The GPU of each architecture checked (``tvm_stitch.analysis.GPUS``: SM count and limits)."""


@dataclass
class KernelCheck:
    """One kernel launch on one architecture and the limits it breaks."""

    arch: str
    func: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int
    shared_bytes: int
    spill_bytes: int
    stack_bytes: int
    grid_barrier: bool
    wave: int
    stitched: bool  # scheduled by the stitch flow (else by TVM's own rules, e.g. a fallback)
    local_elements: int = 0  # elements of the largest thread-local array in the kernel's TIR
    register_budget: int = 0  # the plan's register budget (elements), 0 when it has none
    problems: list[str] = field(default_factory=list)


@dataclass
class ResourceReport:
    """Every kernel of a module on every architecture checked."""

    kernels: list[KernelCheck]

    @property
    def violations(self) -> list[str]:
        """One line per broken limit of a stitched kernel: ``arch func/kernel: problem``."""
        return self._lines(stitched=True)

    @property
    def tvm_violations(self) -> list[str]:
        """The same for kernels TVM scheduled (baseline flow, stitch fallbacks)."""
        return self._lines(stitched=False)

    def _lines(self, stitched: bool) -> list[str]:
        return [f"{k.arch} {k.func}/{k.kernel}: {p}" for k in self.kernels
                if k.stitched == stitched for p in k.problems]


def _is_grid_barrier(call: tvm.ir.Call) -> bool:
    """TVM's global barrier, ``tvm_storage_sync("global")``, or the stitch flow's own,
    ``call_extern(GRID_SYNC, ...)``."""
    op = getattr(call.op, "name", "")
    first = getattr(call.args[0], "value", None) if call.args else None
    return ((op == "tirx.tvm_storage_sync" and first == "global")
            or (op == "tirx.call_extern" and first == GRID_SYNC))


def _global_barrier_funcs(scheduled: IRModule, plan: StitchPlan | None) -> set[str]:
    """PrimFuncs that synchronise their whole grid: a grid barrier in their TIR, or a group of
    the plan with a Global edge."""
    found = set()
    for gv, func in scheduled.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        calls: list[tvm.ir.Call] = []
        tvm_ffi.structural_walk(func, [(tvm.ir.Call, calls.append)])
        if any(_is_grid_barrier(c) for c in calls):
            found.add(gv.name_hint)
    if plan is not None:
        found |= {g.function for g in plan.groups
                  if g.grid_barriers or any(e.scheme is Scheme.GLOBAL for e in g.edges)}
    return found


def _launches(scheduled: IRModule, arch: str) -> Iterator[tuple[str, KernelLaunch, Analyzer,
                                                             LoweredFunc]]:
    """Every kernel launch of every PrimFunc, lowered for ``arch``, with its shapes bound: its
    own, or for a PrimFunc of symbolic shapes, those of each call of it in ``main``."""
    target = cuda_target(arch)
    calls = None
    for gv, func in scheduled.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        lowered = lower(func, gv.name_hint, target)
        buffers = [p for p in lowered.params if isinstance(p.ty, tirx.BufferType)]
        symbolic = next((p for p in buffers
                         if not all(isinstance(d, tirx.IntImm) for d in p.shape)), None)
        if symbolic is None:
            arguments = [([tuple(int(d) for d in p.shape) for p in buffers], {})]
        else:
            if calls is None:
                try:
                    calls = call_arguments(scheduled)
                except AnalysisError:
                    calls = {}
            arguments = calls.get(gv.name_hint, [])
            if not arguments:
                raise ValueError(f"{gv.name_hint}: parameter {symbolic.name} has a symbolic "
                                 f"shape {list(symbolic.shape)}; resources need static "
                                 "shapes")
        for shapes, scalars in arguments:
            ana = lowered.bind_shapes(shapes, scalars)
            for launch in lowered.launch_sequence(ana):
                yield gv.name_hint, launch, ana, lowered


def local_arrays(kernel: tirx.PrimFunc) -> dict[str, int]:
    """The thread-local arrays (``local`` scope allocations, ``local.result`` ones too) of a
    finalised device kernel: buffer name -> elements (-1 when its shape is not a constant)."""
    found: dict[str, int] = {}

    def visit(alloc: tirx.AllocBuffer) -> None:
        buffer = alloc.buffer
        if buffer.scope().split(".")[0] == "local":
            dims = [int(d) if isinstance(d, tirx.IntImm) else -1 for d in buffer.shape]
            found[buffer.name] = -1 if -1 in dims else math.prod(dims)

    tvm_ffi.structural_walk(kernel, [(tirx.AllocBuffer, visit)])
    return found


def _planned_launches(plan: StitchPlan | None) -> dict[str, Launch]:
    """The planned launch of each stitched function."""
    return {} if plan is None else {g.function: g.launch for g in plan.groups if g.launch}


def _register_budgets(plan: StitchPlan | None) -> dict[str, int]:
    """The elements a thread of each stitched function may keep in a thread-local array:
    the cap of its cached elements (``occupancy.cached_elements_cap``), or the partial sums
    its plan keeps in registers where they are more (each takes one register, where a
    cached element is budgeted two: ``occupancy.cached_room``)."""
    if plan is None:
        return {}
    return {g.function: max(cached_elements_cap(g.launch),
                            sum(b.registers for b in g.buffers
                                if b.role is BufferRole.ACCUMULATOR))
            for g in plan.groups if g.launch}


def _check(arch: str, func: str, launch: KernelLaunch, ana: Analyzer,
           res: KernelResources | None, grid_barrier: bool, stitched: bool,
           local: dict[str, int], budget: int, planned_gpu: str = "") -> KernelCheck:
    grid, block = launch.geometry(ana)
    threads, blocks = math.prod(block), math.prod(grid)
    registers = res.registers if res else 0
    shared = res.shared_bytes if res else 0
    spills = (res.spill_store_bytes + res.spill_load_bytes) if res else 0
    stack = res.stack_bytes if res else 0
    sm = SMS[arch]
    wave = sm.sms * blocks_per_sm(sm, threads, registers, shared)
    largest = max(local.values(), default=0)
    check = KernelCheck(arch, func, launch.kernel, grid, block, registers, shared, spills,
                        stack, grid_barrier, wave, stitched,
                        -1 if -1 in local.values() else largest, budget)
    problems = check.problems
    if threads > MAX_THREADS_PER_BLOCK or block[2] > 64:
        problems.append(f"{threads} threads per block (block {block})")
    if grid[1] > 65535 or grid[2] > 65535 or grid[0] > 2**31 - 1:
        problems.append(f"grid {grid} exceeds CUDA's grid limits")
    if res is None:
        problems.append("no ptxas resources reported for this kernel")
    if shared > MAX_SHARED_MEMORY_PER_BLOCK:
        problems.append(f"{shared} B of shared memory per block (limit "
                        f"{MAX_SHARED_MEMORY_PER_BLOCK})")
    if registers * threads > sm.registers_per_sm:
        problems.append(f"{registers} registers x {threads} threads exceed the register file "
                        f"({sm.registers_per_sm})")
    if res is not None and spills:
        problems.append(f"spills {spills} B (stores {res.spill_store_bytes}, loads "
                        f"{res.spill_load_bytes})")
    if stack > (0 if stitched else MAX_STACK_BYTES):
        problems.append(f"{stack} B of local memory (stack frame) per thread")
    if stitched:
        over = {n: e for n, e in local.items() if e < 0 or e > budget}
        problems.extend(f"thread-local array {n} of {'unknown' if e < 0 else e} elements, "
                        f"more than the plan's register budget ({budget})"
                        for n, e in over.items())
    # a persistent grid is sized to one wave of the GPU it was planned for (README, Limits):
    # on another architecture only the other limits apply
    if grid_barrier and blocks > wave and planned_gpu in ("", sm.name):
        problems.append(f"grid barrier with {blocks} blocks, more than one wave ({wave})")
    return check


def check_resources(scheduled: IRModule, plan: StitchPlan | None = None,
                    archs: tuple[str, ...] = ARCHS) -> ResourceReport:
    """Check every kernel of every PrimFunc of ``scheduled``, compiled for each of ``archs``
    (nvcc runs in parallel, one process per core)."""
    plan = plan if plan is not None else StitchPlan.of_module(scheduled)
    barriers = _global_barrier_funcs(scheduled, plan)
    stitched = {gv.name_hint for gv, f in scheduled.functions.items()
                if isinstance(f, tirx.PrimFunc) and f.attrs is not None and GROUP_ATTR in f.attrs}
    clustered = {g.function for g in plan.groups if g.cluster > 1} if plan else set()
    launches = [(arch, *item) for arch in archs for item in _launches(scheduled, arch)
                if has_clusters(arch) or item[0] not in clustered]
    ptxas.find_nvcc()  # a missing nvcc fails the check; a kernel nvcc rejects is a problem of it
    compiled = _compiled_sources(launches)
    planned = _planned_launches(plan)
    budgets = _register_budgets(plan)
    checks = []
    for arch, func, launch, ana, lowered in launches:
        built = compiled[lowered.source(), arch]
        check = _check(arch, func, launch, ana,
                       built.get(launch.kernel) if isinstance(built, dict) else None,
                       func in barriers, func in stitched,
                       local_arrays(lowered.kernel(launch.kernel)),
                       budgets.get(func, 0),
                       planned[func].gpu if func in planned else "")
        if isinstance(built, str):
            check.problems[:] = [f"does not build for {arch}: {built}",
                                 *(p for p in check.problems if not p.startswith("no ptxas"))]
        checks.append(check)
    return ResourceReport(checks)


def _compiled_sources(launches: list[tuple[str, str, KernelLaunch, Analyzer, LoweredFunc]]
                      ) -> dict[tuple[str, str], dict[str, KernelResources] | str]:
    """``_built`` of the CUDA source of every lowered PrimFunc of ``launches`` for its
    architecture, by (source, architecture). The kernels of all PrimFuncs are first compiled
    as one translation unit per architecture, as TVM builds a module: nvcc spends most of a
    small kernel's time on the CUDA headers, once per unit. Where that unit does not build,
    each source is compiled alone, so that an error names its own kernels."""
    by_arch: dict[str, dict[str, LoweredFunc]] = {}
    for arch, _, _, _, lowered in launches:
        by_arch.setdefault(arch, {})[lowered.name] = lowered
    jobs = [(arch, list(funcs.values())) for arch, funcs in by_arch.items()]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        units = list(pool.map(lambda job: _built_together(job[1], job[0]), jobs))
        alone = [(f.source(), arch) for (arch, funcs), unit in zip(jobs, units, strict=True)
                 if unit is None for f in funcs]
        compiled = dict(zip(alone, pool.map(lambda job: _built(*job), alone), strict=True))
    for (arch, funcs), unit in zip(jobs, units, strict=True):
        if unit is not None:
            compiled.update({(f.source(), arch): unit for f in funcs})
    return compiled


def _built_together(funcs: list[LoweredFunc], arch: str) -> dict[str, KernelResources] | None:
    """ptxas' resources of the kernels of every one of ``funcs``, built as one CUDA source
    (one device module, as TVM builds a whole module); None when that does not build."""
    if len(funcs) < 2:
        return None
    try:
        device = IRModule({gv: f for func in funcs for gv, f in func.device.functions.items()})
        source = tvm.get_global_func("target.build.cuda")(device, funcs[0].target) \
            .inspect_source()
        return ptxas_resources(source, arch)
    except (BuildError, RuntimeError):  # TVM's errors are RuntimeErrors
        return None


def _built(source: str, arch: str) -> dict[str, KernelResources] | str:
    """ptxas' resources of the kernels in ``source``, or nvcc's first error if it rejects it
    (a TVM-scheduled kernel over the shared-memory limit, fuzz seed 2027 graph 89)."""
    try:
        return ptxas_resources(source, arch)
    except BuildError as err:
        lines = [line.strip() for line in str(err).splitlines()[1:] if "error" in line]
        return (lines[0] if lines else str(err).splitlines()[0])[:300]
