"""The scheduling pass: stitched kernels by their plan, everything else by dlight's defaults.

``StitchSchedule`` schedules every PrimFunc marked with ``stitch.group`` as its group in the
plan says (``emit.kernel``); a persistent kernel's Relax calls then get its barrier state
and workspaces (``transform.kernel_state``). It runs dlight's default GPU rules (Matmul,
GEMV, Reduction, GeneralReduction, Fallback) on the other PrimFuncs, trying the next rule
when one raises: a crash inside a dlight rule (TVM 0.27's GEMV rule asserts on some
broadcast-multiply + sum functions) then costs a slower schedule, never the compile. Its GEMV
rule also schedules wrong kernels for sums whose operand is broadcast along the kept axes, so
ours applies it only where its vector runs along the reduction (``GEMV``). A rule's
schedule counts only when all of the function runs in kernels (``host_code``): TVM 0.27's
GeneralReduction binds a reduction to a scalar inside its own serial loops, one kernel
launch per element from a host loop. When no rule schedules a function, each of its loop
nests runs as a kernel of one thread (``one_thread_kernels``), slow but right, and the plan
says so; a function that cannot even be scheduled so raises ``NoSchedule``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import IRModule
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
from tvm.target import Target

from ..plan import GROUP_ATTR, Group, StitchPlan
from ..transform.kernel_state import extend_calls
from .blocks import child_blocks
from .emit import Kernel, kernel

logger = logging.getLogger(__name__)

SCHEDULED_ATTR = "tirx.is_scheduled"


class GEMV(dl.gpu.GEMV):
    """dlight's GEMV rule, applied only where each operand it would take as the vector (read
    with fewer of the reduction block's iterators than the block has) runs along the
    reduction. TVM 0.27's rule also takes an operand broadcast along the kept axes for one,
    and its kernel is wrong: a sum over the last axis of ``x * c`` on (2, 32, 32) with ``c``
    of (1, 32, 1) came out up to 135 off (TVM's default flow too), and the fallback of fuzz
    graph 6007:1592 (a sum over the middle axis of ``max(log_softmax(x), c)``, read through a
    transpose) gave infinities. The next rule (Reduction) schedules those right."""

    def apply(self, func: tirx.PrimFunc, target: Target, tune: bool
              ) -> None | s_tir.Schedule | list[s_tir.Schedule]:
        if isinstance(func, tirx.PrimFunc) and _broadcast_operand(func):
            return None
        return super().apply(func, target, tune)


def _broadcast_operand(func: tirx.PrimFunc) -> bool:
    """Whether the reduction dlight's GEMV rule would schedule in ``func`` (its first block
    once the spatial blocks before it are inlined, as the rule does) reads a buffer with some
    but not all of its iterators and none of its reduction iterators."""
    sch = s_tir.Schedule(func)
    infos = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
    if not infos:
        return False
    block = sch.get(infos[0].block_rv)
    iters = {iv.var for iv in block.iter_vars}
    reduced = {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    for read in block.reads:
        used: set = set()
        for r in read.region:
            tvm_ffi.structural_walk(r.min, [(tvm.ir.Var, used.add)])
        used &= iters
        if 0 < len(used) < len(iters) and not used & reduced:
            return True
    return False


def default_rules() -> list[dl.ScheduleRule]:
    """dlight's default GPU rules, in the order TVM's CUDA pipeline applies them (its GEMV
    rule only where it is right, ``GEMV``)."""
    return [dl.gpu.Matmul(), GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]


def contraction_rules() -> list[dl.ScheduleRule]:
    """dlight's rules for matmuls and matrix-vector products, the kernels that absorb copies
    (``graph.operands``)."""
    return [dl.gpu.Matmul(), GEMV()]


def pads_matmul(func: tirx.PrimFunc) -> bool:
    """Whether dlight's schedule of ``func`` pads the matmul's axes to whole tiles (it then
    allocates ``*_reindex_pad*`` buffers)."""
    padded = []

    def on_block(block: s_tir.stmt.SBlock) -> None:
        padded.extend(b for b in block.alloc_buffers if "_reindex_pad" in b.name)

    tvm_ffi.structural_walk(func.body, [(s_tir.stmt.SBlock, on_block)])
    return bool(padded)


class NoSchedule(RuntimeError):
    """A PrimFunc that neither dlight's rules nor the one-thread default can schedule."""


def schedule_func(func: tirx.PrimFunc, target: Target, rules: list[dl.ScheduleRule]
                  ) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule that applies without raising and leaves no host
    code (``host_code``), or None."""
    for rule in rules:
        try:
            sch = rule.apply(func, target, False)
        except Exception as err:  # noqa: BLE001 - a crashing rule is skipped
            logger.warning("schedule rule %s failed: %s", type(rule).__name__,
                           str(err).strip().splitlines()[-1:] or err)
            continue
        if sch is None:
            continue
        if isinstance(sch, list):
            sch = sch[0]
        scheduled = sch.mod["main"]
        outside = host_code(scheduled)
        if outside:
            logger.warning("schedule rule %s left %s outside its kernels", type(rule).__name__,
                           outside)
            continue
        return scheduled.with_attr(SCHEDULED_ATTR, True)
    return None


def host_code(func: tirx.PrimFunc) -> str:
    """The first statement of ``func`` outside every thread-bound loop, that is, code the
    host would run (a loop of kernel launches, a block on the CPU), described; empty when
    all of it runs in kernels."""
    root = func.body

    def visit(stmt: tirx.Stmt) -> str:
        if isinstance(stmt, tirx.For):
            return "" if stmt.kind == tirx.ForKind.THREAD_BINDING \
                else f"the loop over {stmt.loop_var.name}"
        if isinstance(stmt, s_tir.stmt.SBlockRealize):
            return visit(stmt.block.body) if stmt.same_as(root) \
                else f"block {stmt.block.name_hint}"
        if isinstance(stmt, tirx.SeqStmt):
            return next((found for found in map(visit, stmt.seq) if found), "")
        if hasattr(stmt, "body"):
            return visit(stmt.body)
        return f"a {type(stmt).__name__}"

    return visit(root)


def one_thread_kernels(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every loop nest under its root block run as a kernel of one block of
    one thread: right for any nest, and slow; the schedule of last resort."""
    sch = s_tir.Schedule(func)
    nests: list = []
    for block in child_blocks(sch):
        loops = sch.get_loops(block)
        outer = loops[0] if loops else block
        if not any(sch.get(outer).same_as(sch.get(n)) for n in nests):
            nests.append(outer)
    for outer in nests:
        thread = sch.add_unit_loop(outer)
        sch.bind(thread, "threadIdx.x")
        sch.bind(sch.add_unit_loop(thread), "blockIdx.x")
    return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)


@tvm.transform.module_pass(opt_level=0, name="StitchSchedule")
class StitchSchedule:
    """Schedule every PrimFunc of the module: stitched groups by the plan, then dlight."""

    def __init__(self, target: Target | None = None) -> None:
        self.target = target

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Schedule every unscheduled PrimFunc of ``mod``."""
        attached = StitchPlan.of_module(mod)
        plan = attached or StitchPlan()
        defaults = default_rules()
        updates: dict[tvm.ir.GlobalVar, tirx.PrimFunc] = {}
        kernels: dict[str, Kernel] = {}
        notes: list[str] = []
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            group = _group_of(func, plan)
            if group is not None:
                stitched = kernel(func, group)
                updates[gv] = stitched.func.with_attr(SCHEDULED_ATTR, True)
                kernels[gv.name_hint] = stitched
                continue
            new = schedule_func(func, self.target or _target_of(func), defaults)
            if new is None:
                new = _last_resort(gv.name_hint, func)
                notes.append(f"{gv.name_hint}: no dlight rule gave a schedule that runs in "
                             "kernels only; one thread per loop nest")
            updates[gv] = new
        for gv, func in updates.items():
            mod[gv] = func
        for name, stitched in kernels.items():
            mod = extend_calls(mod, name, stitched.state, stitched.workspaces)
        if attached is not None and notes:
            mod = replace(attached, notes=attached.notes + tuple(notes)).attach(mod)
        return mod


def _last_resort(name: str, func: tirx.PrimFunc) -> tirx.PrimFunc:
    try:
        scheduled = one_thread_kernels(func)
    except Exception as err:  # noqa: BLE001 - reported with the function's name
        raise NoSchedule(f"{name}: no dlight rule schedules it, nor one thread per loop "
                         f"nest: {err}") from err
    outside = host_code(scheduled)
    if outside:
        raise NoSchedule(f"{name}: no dlight rule schedules it, and one thread per loop nest "
                         f"leaves {outside} outside its kernels")
    return scheduled


def _group_of(func: tirx.PrimFunc, plan: StitchPlan) -> Group | None:
    if func.attrs is None or GROUP_ATTR not in func.attrs:
        return None
    return plan.group(int(func.attrs[GROUP_ATTR]))


def is_scheduled(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is marked scheduled already."""
    return func.attrs is not None and SCHEDULED_ATTR in func.attrs \
        and bool(func.attrs[SCHEDULED_ATTR])


def _target_of(func: tirx.PrimFunc) -> Target:
    if func.attrs is not None and "target" in func.attrs:
        return func.attrs["target"]
    return Target.current(allow_none=False)
