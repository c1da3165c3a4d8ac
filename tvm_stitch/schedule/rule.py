"""The scheduling pass: stitched kernels by their plan, everything else by dlight's defaults.

``StitchSchedule`` schedules every PrimFunc marked with ``stitch.group`` as its group in the
plan says (``emit.kernel``); a persistent kernel's Relax calls then get its barrier state
and workspaces (``transform.kernel_state``). It runs dlight's default GPU rules (Matmul,
GEMV, Reduction, GeneralReduction, Fallback) on the other PrimFuncs, trying the next rule
when one raises: a crash inside a dlight rule (TVM 0.27's GEMV rule asserts on some
broadcast-multiply + sum functions) then costs a slower schedule, never the compile.
"""

from __future__ import annotations

import logging

import tvm
from tvm import tirx
from tvm.ir import IRModule
from tvm.s_tir import dlight as dl
from tvm.target import Target

from ..plan import GROUP_ATTR, Group, StitchPlan
from ..transform.kernel_state import extend_calls
from .emit import Kernel, kernel

logger = logging.getLogger(__name__)

SCHEDULED_ATTR = "tirx.is_scheduled"


def default_rules() -> list[dl.ScheduleRule]:
    """dlight's default GPU rules, in the order TVM's CUDA pipeline applies them."""
    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]


def schedule_func(func: tirx.PrimFunc, target: Target, rules: list[dl.ScheduleRule]
                  ) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule that applies without raising, or None."""
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
        return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)
    return None


@tvm.transform.module_pass(opt_level=0, name="StitchSchedule")
class StitchSchedule:
    """Schedule every PrimFunc of the module: stitched groups by the plan, then dlight."""

    def __init__(self, target: Target | None = None) -> None:
        self.target = target

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Schedule every unscheduled PrimFunc of ``mod``."""
        plan = StitchPlan.of_module(mod) or StitchPlan()
        defaults = default_rules()
        updates: dict[tvm.ir.GlobalVar, tirx.PrimFunc] = {}
        kernels: dict[str, Kernel] = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            group = _group_of(func, plan)
            if group is not None:
                stitched = kernel(func, group)
                updates[gv] = stitched.func.with_attr(SCHEDULED_ATTR, True)
                kernels[gv.name_hint] = stitched
                continue
            new = schedule_func(func, self.target or _target_of(func), defaults)
            if new is not None:
                updates[gv] = new
        for gv, func in updates.items():
            mod[gv] = func
        for name, stitched in kernels.items():
            mod = extend_calls(mod, name, stitched.state, stitched.workspaces)
        return mod


def _group_of(func: tirx.PrimFunc, plan: StitchPlan) -> Group | None:
    if func.attrs is None or GROUP_ATTR not in func.attrs:
        return None
    return plan.group(int(func.attrs[GROUP_ATTR]))


def _is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and SCHEDULED_ATTR in func.attrs \
        and bool(func.attrs[SCHEDULED_ATTR])


def _target_of(func: tirx.PrimFunc) -> Target:
    if func.attrs is not None and "target" in func.attrs:
        return func.attrs["target"]
    return Target.current(allow_none=False)
