"""StitchFuse: the Relax pass that replaces FuseOps + FuseTIR in the stitch pipeline.

1. Group the memory-intensive ops (``tvm_stitch.graph``).
2. Outline each group into a ``Primitive`` function and let FuseTIR merge it into one
   PrimFunc.
3. Decide each group's kernel (``tvm_stitch.schedule.decisions``; a chooser in force, such
   as a tuning database, is asked first: ``decisions.choosing``), which also checks that the
   schedule can be emitted. A group that cannot be stitched is sent back with its reason:
   its ops fall back, and steps 1-3 run again without them. A compute kernel that absorbs
   copies (``graph.operands``) is outlined the same way and scheduled by dlight's matmul
   rules here; when they do not take it, the next round lets it only read through copies (if
   it wrote through some) or absorb none, with the reason among the plan's refusals.
4. Mark the stitched PrimFuncs (``stitch.group``, and opaque for FuseOps), run TVM's FuseOps
   and FuseTIR on what is left, and attach the StitchPlan to the module.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import tvm
from tvm import relax, tirx
from tvm.ir import IRModule
from tvm.target import Target

from ..analysis.report import estimated_us, global_bytes
from ..graph.copies import Copy
from ..graph.grouping import FUSED_VIEW, OpGroup, broadcast_cuts, pieces
from ..graph.operands import Limits
from ..graph.ops import OPAQUE
from ..graph.planner import Draft, draft_plan
from ..graph.tvm_fusion import tvm_fusion_groups
from ..plan import GROUP_ATTR, ComputeOp, Fallback, Group, Refusal, StitchPlan
from ..schedule.decisions import Decided
from ..schedule.decisions.choosing import Task, decisions_for
from ..schedule.decisions.memo import remembering
from ..schedule.occupancy import device_of
from ..schedule.rows import CrossRowRead, Unstitchable, error_summary
from ..schedule.rule import contraction_rules, is_scheduled, pads_matmul, schedule_func
from ..symbolic import declared_bounds, with_bounds, yardstick_sizes
from .corrected_layer_norm import plain_layer_norms
from .legalization import legalize
from .mixed_reduction import mixed_reductions
from .outline import outline
from .rewrite import without_aliases
from .unwrap_indices import unwrap_indices
from .yardstick import Yardstick

logger = logging.getLogger(__name__)

MAX_ROUNDS = 16
"""Grouping rounds before every remaining failing group is given up at once."""


@tvm.transform.module_pass(opt_level=0, name="StitchFuse")
class StitchFuse:
    """Group, fuse and plan the memory-intensive ops of ``main``; attach the plan.

    ``target`` gives the shared-memory and thread limits (default: the current target).
    ``plan_sink``, when given, is called with the final StitchPlan.
    """

    def __init__(self, target: Target | None = None, plan_sink=None) -> None:
        self.target = target
        self.plan_sink = plan_sink

    def transform_module(self, mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        """Run the pass on ``mod``."""
        target = self.target or Target.current(allow_none=True)
        fused, plan = stitch(mod, target)
        if self.plan_sink is not None:
            self.plan_sink(plan)
        return fused


def stitch(mod: IRModule, target: Target | None = None) -> tuple[IRModule, StitchPlan]:
    """``mod`` with its stitched groups fused and every other op fused by TVM, and the plan.

    ``mod`` is rewritten (``mixed_reduction``) and legalized (``legalization``) first, as
    ``_stitch_kept`` says; a module already legalized stays as it is.

    An unexpected error while grouping (a bug of ours, an IR we do not know) gives up
    stitching for the module, with a note in the plan, rather than breaking the compile.
    """
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return _tvm_fusion(legalize(mod)), StitchPlan(
            notes=("no main function: TVM's fusion only",))
    try:
        with remembering():
            fused, groups, draft, failed, notes = _stitch_kept(mod, target)
    except Exception as err:  # noqa: BLE001 - never worse than TVM's own fusion
        logger.warning("stitching gave up: %s", err)
        fused, groups, draft, failed = legalize(mod), [], Draft([]), []
        notes = (f"stitching gave up ({type(err).__name__}: {error_summary(err)}): "
                 "TVM's fusion only",)
    for g in groups:
        gv = fused.get_global_var(g.function)
        fused[gv] = fused[gv].with_attr(GROUP_ATTR, g.id).with_attr("op_pattern", OPAQUE)
    fused = _tvm_fusion(fused)
    plan = StitchPlan(
        groups=tuple(groups),
        fallbacks=tuple(_fallbacks(draft, failed)),
        compute=tuple(draft.compute),
        refusals=tuple(draft.refusals),
        notes=notes,
    )
    return plan.attach(fused), plan


def _stitch_kept(mod: IRModule, target: Target | None
                 ) -> tuple[IRModule, list[Group], Draft, list[Fallback], tuple[str, ...]]:
    """``_stitch_rounds`` of ``mod`` with its reductions over axes mixed with kept ones, and
    its softmaxes over a middle axis, rewritten over transposed inputs
    (``mixed_reductions``) but for those whose transposed form does not stitch: an op of it
    (not a view) falls back, or its groups need more kernels than TVM's fusion of the op as
    imported (the yardstick measures TVM's fusion of ``mod`` as imported). Those are kept as
    imported, and the module stitched again: their transposes would be kernels of their own,
    or cut a reduction off the epilogue TVM fuses into it (fuzz graphs 12021:400, a softmax
    over a middle axis of a broadcast, 7 kernels for TVM's 5; 12023:24, a minimum over the
    channels before a LayerNorm, 3 for 2). First, though, where one of those had sunk (its
    element-wise readers applied to its rows, ``mixed_reduction._sinks``), no reduction
    sinks: their transposed forms may stitch on their own. From the second time ops are
    kept on, every rewritten op is. The plan's notes say what was given up."""
    kept: frozenset[str] = frozenset()
    sinks = True
    notes: tuple[str, ...] = ()
    reference = None
    while True:
        rewritten, origins, sunk = mixed_reductions(mod, kept, sinks)
        legal = without_aliases(legalize(rewritten))
        if origins and reference is None:
            reference = without_aliases(legalize(mod))
        fused, groups, draft, failed, more = _stitch_rounds(
            legal, target, (reference, origins) if origins else None)
        unstitched = _unstitched_sites(draft.fallbacks + failed, origins)
        if not unstitched:
            return fused, groups, draft, failed, notes + more
        names = ", ".join(sorted(unstitched))
        if unstitched & sunk:
            sinks = False
            notes += (f"reductions not sunk, their transposed forms not stitched: {names}",)
            continue
        notes += (f"kept as imported, their transposed forms not stitched: {names}",)
        kept |= unstitched if not kept else frozenset(origins.values())


def _unstitched_sites(fallbacks: list[Fallback], origins: dict[str, str]) -> frozenset[str]:
    """The bindings rewritten by ``mixed_reductions`` (``origins``) an op of which, not a
    view, falls back (nor a copy that TVM's fusion makes a view)."""
    return frozenset(origins[name] for f in fallbacks if f.reason != FUSED_VIEW
                     for name, _, callee in (op.partition(":") for op in f.ops)
                     if name in origins and callee not in _VIEWS)


_VIEWS = frozenset({"reshape"})
"""Ops that TVM makes views, which launch nothing (``RewriteDataflowReshape``)."""


def _stitch_rounds(mod: IRModule, target: Target | None,
                   reference: tuple[IRModule, dict[str, str]] | None = None
                   ) -> tuple[IRModule, list[Group], Draft, list[Fallback], tuple[str, ...]]:
    """Group, fuse and decide until every group can be stitched: a group that cannot sends
    its ops back to TVM with the reason, and the others are grouped again without them. A
    group that remote stitching gave element-wise parts (``OpGroup.joined``) is grouped
    again without them first, the merge refused with the reason; one that would fall back
    whole (it cannot be scheduled, or it moves more bytes than TVM's kernels of its ops or is
    slower) is grouped again in pieces where a result is broadcast (``_broadcast_cut``)
    before it falls back. Stitched groups that need more kernels than TVM's fusion runs
    their ops in (``Yardstick.extra_kernels``) fall back. The yardstick measures TVM's
    fusion of ``mod``, or of the module ``reference`` gives, whose ops the bindings of
    ``mod`` it names (binding -> binding in the reference) were made for."""
    excluded: dict[str, str] = {}
    failed: list[Fallback] = []
    apart: frozenset[str] = frozenset()
    cuts: frozenset[tuple[str, str]] = frozenset()
    limits, unscheduled, parted = Limits(), [], []
    fusion = tvm_fusion_groups(plain_layer_norms(mod))
    yardstick = None
    if target is not None:
        yardstick = Yardstick(fusion, target) if reference is None else Yardstick(
            tvm_fusion_groups(plain_layer_norms(reference[0])), target, reference[1])
    for _ in range(MAX_ROUNDS):
        draft = draft_plan(mod, excluded, fusion.groups,
                           absorb=None if target is None else limits, apart=apart, cuts=cuts)
        fused, names = _fuse_groups(mod, draft)
        groups, failures = _decide_all(fused, draft, names, target, yardstick)
        for og, ops, reason in failures:
            if og.joined:
                apart |= {og.graph.nodes[i].name for i in og.joined}
                parted.append(_parts_refusal(og, list(og.parts), f"remote stitching: {reason}"))
                continue
            # a group that would fall back whole may stitch in pieces
            cut = _broadcast_cut(og, cuts, yardstick) if len(ops) == len(og.members) \
                else frozenset()
            if cut:  # its pieces are grouped again apart, each stitched or falling back
                cuts |= cut
                apart |= {n.name for n in og.nodes}
                parted.append(_parts_refusal(og, pieces(og, cuts), "stitched apart where a "
                                             f"result is broadcast: {reason}"))
                continue
            excluded.update({op.partition(":")[0]: reason for op in ops})
            failed.append(Fallback(ops, reason))
        refused = _schedule_operands(fused, draft, names, target)
        unscheduled.extend(refusal for _, refusal in refused)
        limits = Limits(
            limits.read_only | {e.op for e, _ in refused if e.writes_through},
            limits.alone | {e.op for e, _ in refused if not e.writes_through})
        extra = [] if failures or refused or yardstick is None else yardstick.extra_kernels(
            *_stitched_and_launching(draft))
        for indices, reason in extra:
            for i in indices:
                ops = draft.groups[i][1].ops
                excluded.update({op.partition(":")[0]: reason for op in ops})
                failed.append(Fallback(ops, reason))
        if not failures and not refused and not extra:
            draft.refusals.extend(parted + unscheduled)
            return fused, groups, draft, failed, ()
    draft = Draft(draft.graphs, compute=draft.compute, refusals=draft.refusals)
    return mod, [], draft, failed, (f"gave up stitching after {MAX_ROUNDS} rounds of failing "
                                    "groups",)


def _stitched_and_launching(draft: Draft) -> tuple[list[frozenset[relax.Var]],
                                                    frozenset[relax.Var]]:
    """The ops of each drafted group, and the ops left out of every group that launch a
    kernel for ``Yardstick.extra_kernels``: all but views and the copies a compute kernel
    absorbs (they run in it, and TVM runs that op in a kernel too)."""
    stitched = [frozenset(n.var for n in og.nodes) for og, _ in draft.groups]
    absorbed = [n.var for og, entry in draft.operands for n in og.nodes
                if n.label != entry.op]
    grouped = frozenset().union(*stitched, absorbed)
    launching = frozenset(n.var for graph in draft.graphs for n in graph.nodes
                          if n.info is not None and n.info.copy is not Copy.VIEW
                          and n.var not in grouped)
    return stitched, launching


def _broadcast_cut(og: OpGroup, cuts: frozenset[tuple[str, str]],
                   yardstick: Yardstick | None) -> frozenset[tuple[str, str]]:
    """The edges of ``og`` not yet in ``cuts`` where a result is broadcast
    (``grouping.broadcast_cuts``), if its pieces cut there are no more kernels than TVM's
    fusion runs its ops in; else none."""
    cut = broadcast_cuts(og) - cuts
    kernels = None if yardstick is None else yardstick.kernels(
        frozenset(n.var for n in og.nodes))
    if not cut or kernels is None or len(pieces(og, cuts | cut)) > kernels:
        return frozenset()
    return cut


def _parts_refusal(og: OpGroup, parts: list[tuple[int, ...]], reason: str) -> Refusal:
    """The parts (member indices) of ``og`` kept apart for ``reason``."""
    first, *rest = ("{" + ", ".join(og.graph.nodes[i].label for i in part) + "}"
                    for part in parts)
    return Refusal(first, " + ".join(rest), reason)


def _tvm_fusion(mod: IRModule) -> IRModule:
    """TVM's fusion of what is not stitched, its LayerNorms topi's (``plain_layer_norms``)."""
    return tvm.transform.Sequential([relax.transform.FuseOps(), relax.transform.FuseTIR()])(
        plain_layer_norms(mod))


def _function_name(prefix: str, ops: tuple[str, ...]) -> str:
    callees = []
    for op in ops:
        callee = re.sub(r"[^0-9A-Za-z_]", "_", op.partition(":")[2] or op)
        if callee not in callees:
            callees.append(callee)
    return f"{prefix}_" + "_".join(callees)[:48]


def _fuse_groups(mod: IRModule, draft: Draft) -> tuple[IRModule, dict[int | str, str]]:
    """``mod`` with every drafted group and compute kernel that absorbs copies outlined and
    fused by FuseTIR; group id or compute op -> PrimFunc."""
    keys: list[int | str] = [g.id for _, g in draft.groups] + [c.op for _, c in draft.operands]
    requested = [(og, _function_name(f"stitch{g.id}", g.ops)) for og, g in draft.groups] + [
        (og, _function_name(f"operand{i}", tuple(n.label for n in og.nodes)))
        for i, (og, _) in enumerate(draft.operands)]
    if not requested:
        return mod, {}
    bounds = declared_bounds(mod["main"].attrs)
    outlined, actual = outline(mod, draft.graphs, requested)
    fused = relax.transform.FuseTIR()(outlined)
    names = {key: actual[name] for key, (_, name) in zip(keys, requested, strict=True)}
    for name in names.values():
        gv = fused.get_global_var(name)
        if isinstance(fused[gv], tirx.PrimFunc):
            fused[gv] = with_bounds(unwrap_indices(fused[gv]), bounds)
    return fused, names


def _schedule_operands(fused: IRModule, draft: Draft, names: dict[int | str, str],
                       target: Target | None) -> list[tuple[ComputeOp, Refusal]]:
    """Schedule, in ``fused``, every compute kernel that absorbs copies with dlight's matmul
    rules, marked opaque so that FuseOps leaves it whole; the kernels they do not take, with
    why. Identical layers share one outlined function, scheduled once."""
    refused = []
    for _, entry in draft.operands:
        gv = fused.get_global_var(names[entry.op])
        func = fused[gv]
        if is_scheduled(func):
            continue
        why = "dlight's matmul rules do not schedule the compute kernel with these copies"
        scheduled = None
        if isinstance(func, tirx.PrimFunc) and target is not None:
            with target:
                scheduled = schedule_func(func, target, contraction_rules())
        if scheduled is not None and entry.writes_through and pads_matmul(scheduled):
            # TVM 0.27's dlight Matmul guards the stores of a padded tile by the index the
            # epilogue's reshape merged, not by the padded axis: padding overwrites results
            why, scheduled = ("dlight pads the matmul, and guards padded stores written "
                              "through a copy by the wrong index (TVM 0.27)"), None
        if scheduled is None:
            refused.append((entry, Refusal(entry.op, "{" + ", ".join(entry.absorbed) + "}",
                                           why)))
            continue
        fused[gv] = scheduled.with_attr("op_pattern", OPAQUE)
    return refused


def _decide_all(fused: IRModule, draft: Draft, names: dict[int | str, str],
                target: Target | None,
                yardstick: Yardstick | None
                ) -> tuple[list[Group], list[tuple[OpGroup, tuple[str, ...], str]]]:
    """Decide every group of ``draft``: the stitched groups, and the failures (the group,
    the ops that fall back, and why)."""
    groups, failures = [], []
    for og, entry in draft.groups:
        name = names[entry.id]
        func = fused[fused.get_global_var(name)]
        if not isinstance(func, tirx.PrimFunc):
            failures.append((og, entry.ops, "FuseTIR did not make one PrimFunc"))
            continue
        task = Task(func, replace(entry, function=name), og.rows, target)
        try:
            for decided in decisions_for(task):
                worse = _worse(decided, func, og, target, yardstick)
                if not worse:
                    groups.append(decided.group)
                    break
            else:
                failures.append((og, entry.ops, worse))
        except CrossRowRead as err:  # given back whole: first cut where a result is broadcast
            failures.append((og, entry.ops, str(err)))
        except Unstitchable as err:
            failures.append((og, _given_back(og, entry.ops, yardstick), str(err)))
    return groups, failures


def _worse(decided: Decided, func: tirx.PrimFunc, og: OpGroup, target: Target | None,
           yardstick: Yardstick | None) -> str | None:
    """Why the kernel ``decided`` for the group ``og`` (fused into ``func``) is worse than
    TVM's fusion of its ops (``Yardstick``), or None when it is not or cannot be compared."""
    if yardstick is None or decided.lowered is None:
        return None
    sizes = yardstick_sizes(func) or None  # symbolic shapes: counted at these
    members = frozenset(n.var for n in og.nodes)
    phased = bool(decided.group.phases)
    # a Global group's partial sums make a round trip through global memory by design,
    # bought for parallelism where TVM's kernel leaves most of the GPU idle
    moved = global_bytes(decided.lowered, {p.name for p in func.params} if phased else None,
                         sizes)
    worse = None if moved is None else yardstick.excess(members, moved, sizes)
    if worse or not (og.joined or phased):
        return worse
    gpu = device_of(target)
    took = estimated_us(decided.lowered, gpu, sizes)
    if took is None:
        return None
    if og.joined:
        return yardstick.slower(members, took, gpu, sizes)
    # partial sums that make it move more than TVM's kernels must pay for themselves in
    # time, launches saved included: a softmax down the 1000 rows of (1000, 13) in 125
    # blocks, 280 KB and 11.6 us where TVM's kernel of 13 blocks moves 208 KB in an
    # estimated 5.3 (fuzz graph 12011:386); two log-softmaxes down the 257 rows of (257, 64)
    # in 257 row tiles of one row (a tile of more would keep too many elements in
    # registers), 1.4 MB and 12.3 us, where TVM's two kernels move 526 KB in 7.2 (12014:338);
    # where TVM runs them in one kernel, no launch is saved (ONE_KERNEL_MARGIN)
    total = global_bytes(decided.lowered, None, sizes)
    more = None if total is None else yardstick.excess(members, total, sizes)
    slower = None if more is None \
        else yardstick.slower(members, took, gpu, sizes, partial_sums=True)
    return None if slower is None else f"{more}, partial sums included; {slower}"


def _given_back(og: OpGroup, ops: tuple[str, ...], yardstick: Yardstick | None
                ) -> tuple[str, ...]:
    """The ops of a group that cannot be stitched that fall back: the transposes it writes
    across its rows (``OpGroup.permuted_sinks``) alone when it has others, whose other ops
    are grouped again without them, as they were before such a transpose joined rows; its
    members in column space alone when it has others (a LayerNorm backward's dgamma and
    dbeta, at a width whose partial sums fit nowhere on chip), whose row ops are grouped
    again without them and may stitch on their own, if TVM's fusion runs the group's ops in
    more kernels than that would at most (one stitched kernel, and one of TVM's per
    column-space op); else all of ``ops``."""
    sinks = og.permuted_sinks
    if sinks and len(sinks) < len(ops):
        return sinks
    columns = {n.label for n in og.nodes if n.index in og.columns}
    if not columns or len(columns) == len(ops) or yardstick is None:
        return ops
    tvm_kernels = yardstick.kernels(frozenset(n.var for n in og.nodes))
    if tvm_kernels is None or tvm_kernels <= 1 + len(columns):
        return ops
    return tuple(op for op in ops if op in columns)


def _fallbacks(draft: Draft, failed: list[Fallback]) -> list[Fallback]:
    """The draft's fallbacks, with the ops of each failed group reported once, together."""
    reported = {op for f in failed for op in f.ops}
    rest = [f for f in draft.fallbacks if not set(f.ops) & reported]
    return failed + rest
