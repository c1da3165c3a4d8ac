"""Compile flows, split where fusion and scheduling are done.

``lower`` stops at the *scheduled* module: Relax ``main`` calling GPU-scheduled PrimFuncs,
one ``call_tir`` per launch group. The same module is built for CUDA (``build``), run on the
SIMT runner, and measured by ``tvm_stitch.analysis``, so every figure we report describes the
code we actually build. Flows differ only in their fusion passes; everything before and after
is TVM's default CUDA pipeline.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax
from tvm.ir import IRModule
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.target import Target

from . import baseline
from .target import parse_target
from .transform import fusion_passes as stitch_fusion_passes

FusionPasses = Callable[[Target], list[tvm.transform.Pass]]

FLOWS: dict[str, FusionPasses] = {
    "baseline": baseline.fusion_passes,
    "stitch": stitch_fusion_passes,
}


def available_flows() -> list[str]:
    """Names of the compile flows that can be used today."""
    return sorted(FLOWS)


def _fusion(flow: str) -> FusionPasses:
    if flow not in FLOWS:
        raise ValueError(f"unknown pipeline {flow!r}; available: {', '.join(available_flows())}")
    return FLOWS[flow]


def schedule_passes(flow: str, target: Target) -> list[tvm.transform.Pass]:
    """Passes from a Relax model to the scheduled module: library dispatch, the flow's fusion
    and scheduling, and TVM's rewrite of reshape kernels into views (they launch nothing)."""
    return (
        cuda_pipeline.library_dispatch_passes(target)
        + _fusion(flow)(target)
        + [relax.transform.RewriteDataflowReshape()]
    )


def finish_passes(target: Target) -> list[tvm.transform.Pass]:
    """TVM's passes from the scheduled module to an executable: dataflow lowering, finalize."""
    return cuda_pipeline.dataflow_lower_passes(target) + cuda_pipeline.finalize_passes(target)


def lower(mod: IRModule, target: str | Target = "cuda", flow: str = "baseline") -> IRModule:
    """Fuse and schedule ``mod`` with ``flow`` for ``target``; returns the scheduled module."""
    target = parse_target(target)
    with target:
        return tvm.transform.Sequential(schedule_passes(flow, target))(mod)


def build(scheduled: IRModule, target: str | Target = "cuda") -> tvm.runtime.Executable:
    """Build a scheduled module into a Relax VM executable for ``target``."""
    target = parse_target(target)
    finish = tvm.transform.Sequential(finish_passes(target))
    return tvm.compile(scheduled, target, relax_pipeline=finish)
