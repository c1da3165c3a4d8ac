"""What each compile flow makes of an ONNX model: the plan, the kernels, and the totals.

``inspect_onnx(path, target)`` compiles the model with the stitch and the baseline flow (or
one of them) and counts one run of each (``tvm_stitch.analysis``): per kernel its kind (a
stitched group's kernel, a memory-intensive kernel of TVM's fusion, or a matmul or convolution
on TVM's default path), grid, threads per block, global bytes accessed and those that reach
DRAM, and the roofline estimate on the target's GPU; the stitch plan with its fallbacks and
their reasons; and the totals of both flows side by side. ``tvm-stitch inspect`` prints it
(``--json`` for plain data). A model with symbolic input dimensions is compiled symbolic, as
``tvm-stitch compile`` does, and counted at the sizes ``dims`` gives each of them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import onnx
from tvm.ir import IRModule
from tvm.target import Target

from . import analysis, pipeline
from .analysis import GPU, KernelReport, ModuleReport, gpu_of_arch
from .analysis.report import format_bytes, trim_dims
from .frontend.onnx import ModelError, check_dims, import_model, load
from .plan import GROUP_ATTR, Fallback, StitchPlan
from .target import DEFAULT_TARGET, TargetSpec, describe, parse_target, target_argument
from .tuning.database import DatabaseError, add_database_argument, database_or_none
from .verify import add_dim_max_argument, dim_argument

BOTH = "both"
"""The ``--pipeline`` choice that inspects every flow, stitch first."""

FLOW_ORDER = ("stitch", "baseline")


class KernelKind(StrEnum):
    """Where a kernel comes from."""

    STITCHED = "stitched"  # the kernel of a stitched group of the plan
    FUSED = "fused"  # memory-intensive, from TVM's FuseOps/FuseTIR and dlight
    COMPUTE = "compute"  # a matmul or convolution on TVM's default path


@dataclass(frozen=True)
class KernelRow:
    """One kernel launch of a run: what the per-kernel table shows."""

    name: str
    func: str
    kind: KernelKind
    group: int | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    accessed_bytes: int
    dram_bytes: int
    estimated_us: float
    exact: bool

    @property
    def threads(self) -> int:
        """Threads per block."""
        return math.prod(self.block)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form."""
        return {"name": self.name, "func": self.func, "kind": self.kind.value,
                "group": self.group, "grid": list(self.grid), "block": list(self.block),
                "threads": self.threads, "accessed_bytes": self.accessed_bytes,
                "dram_bytes": self.dram_bytes, "estimated_us": self.estimated_us,
                "exact": self.exact}


@dataclass(frozen=True)
class FlowReport:
    """One flow's compile of the model: its plan (None for the baseline flow), the counted
    run, and its kernels as table rows."""

    flow: str
    plan: StitchPlan | None
    report: ModuleReport
    kernels: tuple[KernelRow, ...]
    gpu: GPU

    @property
    def fallbacks(self) -> tuple[Fallback, ...]:
        """The plan's fallbacks: ops left to TVM's fusion, each with its reason."""
        return () if self.plan is None else self.plan.fallbacks

    def totals(self) -> dict[str, Any]:
        """The run's totals: kernels, bytes, ratios and estimated microseconds per GPU."""
        r = self.report
        return {"kernels": len(r.kernels), "mem_kernels": r.mem_kernels,
                "stitched_kernels": sum(k.kind is KernelKind.STITCHED for k in self.kernels),
                "accessed_bytes": r.global_bytes, "dram_bytes": r.dram_bytes,
                "sector_bytes": r.sector_bytes,
                "compulsory_bytes": r.compulsory_bytes, "traffic_ratio": r.traffic_ratio,
                "dram_ratio": r.dram_ratio, "estimated_us": r.roofline_us()}

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form."""
        return {"plan": None if self.plan is None else self.plan.to_dict(),
                "kernels": [k.to_dict() for k in self.kernels],
                "fallbacks": [{"ops": list(f.ops), "reason": f.reason} for f in self.fallbacks],
                "notes": list(self.report.notes), "totals": self.totals()}


@dataclass(frozen=True)
class Inspection:
    """Every inspected flow of one model, for one target, at the sizes ``dims`` gives."""

    model: str
    target: Target
    gpu: GPU
    dims: dict[str, int]
    flows: tuple[FlowReport, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, JSON-ready."""
        return {"model": self.model, "target": describe(self.target), "gpu": self.gpu.name,
                "dims": self.dims, "flows": {f.flow: f.to_dict() for f in self.flows}}

    def render(self) -> str:
        """The inspection as text: each flow's plan, kernels and fallbacks, then the totals."""
        return render(self)


def inspect_onnx(model: str | os.PathLike | onnx.ModelProto,
                 target: TargetSpec = DEFAULT_TARGET, *, flows: Sequence[str] = FLOW_ORDER,
                 dims: Mapping[str, int] | None = None,
                 database: str | os.PathLike | None = None,
                 cost_model: str | os.PathLike | None = None,
                 dim_max: Mapping[str, int] | None = None) -> Inspection:
    """Compile an ONNX model with each of ``flows`` for ``target`` and count one run of each.
    ``dim_max`` declares upper bounds of symbolic dimensions (``frontend.import_model``).

    Symbolic input dimensions are counted at the sizes ``dims`` gives; ModelError when one has
    none, or ``dims`` names one the inputs do not have, or the model cannot be compiled.
    ValueError for a target whose GPU the roofline table lacks. ``database`` is a tuning
    database whose records the stitch flow applies, ``cost_model`` a cost model that picks
    the kernels of the other groups (``tuning.database.database_or_none``)."""
    target = parse_target(target)
    gpu = target_gpu(target)
    proto = load(model)
    sizes = dict(dims or {})
    check_dims(proto, sizes, complete=True)
    mod = import_model(proto, dim_max=dim_max)
    reports = []
    for flow in flows:
        with database_or_none(database, cost_model):
            scheduled = pipeline.lower(mod, target, flow)
        reports.append(flow_report(flow, scheduled, gpu, target, sizes))
    name = proto.graph.name if isinstance(model, onnx.ModelProto) else Path(model).name
    return Inspection(name, target, gpu, sizes, tuple(reports))


def target_gpu(target: Target) -> GPU:
    """The GPU of the roofline table with the target's architecture; ValueError naming the
    known ones for any other."""
    return gpu_of_arch(str(target.attrs.get("arch", "")))


def flow_report(flow: str, scheduled: IRModule, gpu: GPU, target: Target,
                dims: Mapping[str, int]) -> FlowReport:
    """Count one run of a scheduled module at the sizes ``dims`` gives its symbolic
    dimensions, its kernels told apart by where they come from."""
    report = analysis.analyze(scheduled, shape_vars=dims, target=target)
    rows = tuple(_row(k, scheduled, gpu) for k in report.kernels)
    return FlowReport(flow, StitchPlan.of_module(scheduled), report, rows, gpu)


def _row(kernel: KernelReport, scheduled: IRModule, gpu: GPU) -> KernelRow:
    attrs = scheduled[kernel.func].attrs
    group = None if attrs is None or GROUP_ATTR not in attrs else int(attrs[GROUP_ATTR])
    kind = (KernelKind.STITCHED if group is not None else
            KernelKind.FUSED if kernel.memory_intensive else KernelKind.COMPUTE)
    traffic = kernel.traffic
    return KernelRow(kernel.name, kernel.func, kind, group, kernel.grid, kernel.block,
                     traffic.global_bytes, traffic.dram_bytes,
                     kernel.roofline_us()[gpu.name], traffic.exact)


def render(inspection: Inspection) -> str:
    """Text form of ``inspection`` (see ``Inspection.render``)."""
    gpu = inspection.gpu
    dims = ", ".join(f"{d}={s}" for d, s in inspection.dims.items())
    lines = [f"{inspection.model} for {inspection.target.attrs.get('arch')}: estimates for "
             f"the {gpu.name}" + (f", counted at {dims}" if dims else "")]
    for flow in inspection.flows:
        lines += ["", f"== {flow.flow} =="]
        lines.append(str(flow.plan) if flow.plan is not None else
                     "no stitch plan: TVM's fusion and dlight's schedules")
        header = ["#", "kernel", "kind", "grid", "threads", "accessed", "DRAM",
                  f"{gpu.name} us"]
        rows = [[str(i), k.name + ("" if k.exact else " *"),
                 k.kind.value + ("" if k.group is None else f" {k.group}"),
                 "x".join(map(str, trim_dims(k.grid))), str(k.threads),
                 format_bytes(k.accessed_bytes), format_bytes(k.dram_bytes),
                 f"{k.estimated_us:.1f}"] for i, k in enumerate(flow.kernels)]
        lines += _table([header, *rows], left={1, 2})
        lines += flow.report.notes
        if flow.plan is not None:
            lines.append("fallbacks: none" if not flow.fallbacks else
                         f"fallbacks: {len(flow.fallbacks)}, left to TVM's fusion (each "
                         "'fallback' line of the plan gives its reason)")
    lines += ["", "== totals =="]
    totals = [f.totals() for f in inspection.flows]
    metrics = total_rows(gpu.name)
    table = [["", *(f.flow for f in inspection.flows)]]
    table += [[label, *(cell(t) for t in totals)] for label, cell in metrics]
    lines += _table(table, left={0})
    return "\n".join(lines)


def total_rows(gpu: str) -> list[tuple[str, Callable[[dict], str]]]:
    """The rows of a flow's totals (``FlowReport.totals``) as people read them: a label and
    how its cell is written, estimated times for ``gpu``."""
    return [
        ("kernels", lambda t: str(t["kernels"])),
        ("memory-intensive kernels", lambda t: str(t["mem_kernels"])),
        ("stitched kernels", lambda t: str(t["stitched_kernels"])),
        ("global bytes accessed", lambda t: format_bytes(t["accessed_bytes"])),
        ("DRAM bytes", lambda t: format_bytes(t["dram_bytes"])),
        ("L2 sector bytes", lambda t: format_bytes(t["sector_bytes"])),
        ("compulsory bytes", lambda t: format_bytes(t["compulsory_bytes"])),
        ("traffic ratio", lambda t: f"{t['traffic_ratio']:.2f}"),
        ("DRAM ratio", lambda t: f"{t['dram_ratio']:.2f}"),
        (f"estimated {gpu} us", lambda t: f"{t['estimated_us'][gpu]:.1f}"),
    ]

def _table(rows: list[list[str]], left: set[int]) -> list[str]:
    """Rows of cells as aligned lines: columns in ``left`` flush left, the others right."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if c in left else cell.rjust(w)
                      for c, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tvm-stitch inspect``."""
    parser.add_argument("model", help="path of an ONNX model")
    parser.add_argument("--pipeline", default=BOTH, choices=[*FLOW_ORDER, BOTH],
                        help="the flow to inspect, or both side by side (default)")
    parser.add_argument("--target", type=target_argument, default=DEFAULT_TARGET,
                        help='cuda:sm_90 (default), cuda:sm_80, or TVM\'s JSON form '
                             '\'{"kind": "cuda", "arch": "sm_90"}\'')
    parser.add_argument("--dim", type=dim_argument, action="append", default=[],
                        metavar="NAME=SIZE",
                        help="size to count a symbolic input dimension at (each needs one); "
                             "the model is compiled symbolic")
    add_dim_max_argument(parser)
    add_database_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")


def run(args: argparse.Namespace) -> int:
    """Execute ``tvm-stitch inspect``; returns the exit code (2 for a refused model)."""
    flows = FLOW_ORDER if args.pipeline == BOTH else (args.pipeline,)
    try:
        target_gpu(args.target)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        inspection = inspect_onnx(args.model, args.target, flows=flows, dims=dict(args.dim),
                                  database=args.db, cost_model=args.cost_model,
                                  dim_max=dict(args.dim_max))
    except (ModelError, DatabaseError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(inspection.to_dict()) if args.json else inspection.render())
    return 0


__all__ = ["Inspection", "FlowReport", "KernelKind", "KernelRow", "flow_report",
           "inspect_onnx", "render", "target_gpu"]
