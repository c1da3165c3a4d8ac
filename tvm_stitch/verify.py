"""Compile an ONNX model with a flow, run it on the CPU SIMT runner, check it against
onnxruntime and report kernels and traffic.

``python -m tvm_stitch.verify MODEL.onnx --pipeline baseline|stitch [--target cuda:sm_90]``
prints one JSON object and exits 1 when the outputs do not match. A model with symbolic
input dimensions (ONNX dim_params) is compiled once as it is and run, measured and checked
at the sizes ``--dim NAME=SIZE`` gives them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from tvm.ir import IRModule

from . import analysis, pipeline
from .frontend.onnx import ModelError, graph_inputs, import_model, load
from .plan import ChoiceSource, StitchPlan
from .target import DEFAULT_TARGET, TargetSpec, target_argument
from .tuning.database import DatabaseError, add_database_argument, database_or_none
from .workloads import inputs as make_inputs
from .workloads.inputs import input_signature

RTOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2}
ATOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2}


@dataclass
class Check:
    """Outcome of comparing a model's outputs with onnxruntime's."""

    max_abs_err: float
    ok: bool


def compile_model(model: onnx.ModelProto, flow: str, target: TargetSpec = DEFAULT_TARGET,
                  dim_max: Mapping[str, int] | None = None) -> IRModule:
    """Import ``model`` (with the upper bounds ``dim_max`` of symbolic dimensions) and fuse
    and schedule it with ``flow``: the scheduled module."""
    return pipeline.lower(import_model(model, dim_max=dim_max), target, flow)


def reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs computed by onnxruntime, the reference for every numerical check."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise RuntimeError("verify needs onnxruntime: pip install 'tvm-stitch[test]'") from err
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def compare(outputs: list[np.ndarray], expected: list[np.ndarray]) -> Check:
    """Compare outputs elementwise (``|a - b| <= atol + rtol |b|``, exact for integers)."""
    if len(outputs) != len(expected):
        return Check(float("inf"), False)
    worst, ok = 0.0, True
    for out, ref in zip(outputs, expected, strict=True):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return Check(float("inf"), False)
        kind = str(ref.dtype)
        if kind not in RTOL:
            ok &= bool(np.array_equal(out, ref))
            continue
        a, b = out.astype(np.float64), ref.astype(np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))  # equal infinities and NaN where NaN
        diff = np.where(same, 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = max(worst, float(diff.max(initial=0.0)))
        close = np.isfinite(b) & (diff <= ATOL[kind] + RTOL[kind] * np.abs(b))
        ok &= bool(np.all(same | close))
    return Check(worst, ok)


def run_simt(scheduled: IRModule, model: onnx.ModelProto, seed: int = 0,
             dims: dict[str, int] | None = None) -> Check:
    """Run ``scheduled`` on the SIMT runner with seeded inputs (symbolic dimensions at the
    sizes ``dims`` gives) and compare with onnxruntime."""
    from .simt import SimtModule

    feeds = make_inputs(with_dims(model, dims or {}), seed)
    outputs = SimtModule(scheduled)(*feeds.values())
    return compare(outputs, reference_outputs(model, feeds))


def verify(model: onnx.ModelProto, flow: str = "baseline", target: TargetSpec = DEFAULT_TARGET,
           seed: int = 0, dims: dict[str, int] | None = None) -> dict:
    """Compile, run on the SIMT runner and measure: the JSON-ready summary ``verify`` prints."""
    return summarize(compile_model(model, flow, target), model, seed, dims)


def summarize(scheduled: IRModule, model: onnx.ModelProto, seed: int = 0,
              dims: dict[str, int] | None = None) -> dict:
    """Kernels, traffic and the onnxruntime comparison of an already compiled model, its
    symbolic dimensions at the sizes ``dims`` gives."""
    shapes = [shape for shape, _ in input_signature(with_dims(model, dims or {})).values()]
    report = analysis.analyze(scheduled, shapes).to_dict()
    check = run_simt(scheduled, model, seed, dims)
    return {
        "kernels": report["kernels"],
        "global_bytes": report["global_bytes"],
        "compulsory_bytes": report["compulsory_bytes"],
        "traffic_ratio": report["traffic_ratio"],
        "max_abs_err": check.max_abs_err,
        "ok": check.ok,
    }


def with_dims(model: onnx.ModelProto, dims: dict[str, int]) -> onnx.ModelProto:
    """``model`` with every input dimension named in ``dims`` (a dim_param) set to its size;
    ``model`` itself when there are none."""
    if not dims:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in out.graph.input:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
    return out


def _require_sized_inputs(model: onnx.ModelProto, dims: dict[str, int]) -> None:
    """verify feeds random inputs, so every input dimension must be a number or a symbolic
    dimension that ``dims`` sizes."""
    for value in graph_inputs(model):
        shape = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") and d.dim_param not in dims for d in shape):
            raise ModelError(f"input {value.name!r} has a symbolic shape "
                             f"{[d.dim_param or d.dim_value for d in shape]}: give each "
                             "symbolic dimension a size with --dim NAME=SIZE")


def dim_argument(text: str) -> tuple[str, int]:
    """``NAME=SIZE`` (a symbolic dimension and its size, SIZE >= 1) for argparse's ``type=``."""
    name, sep, size = text.partition("=")
    if not sep or not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE with SIZE >= 1, got {text!r}")
    return name, int(size)


def add_dim_max_argument(parser: argparse.ArgumentParser) -> None:
    """``--dim-max NAME=N``: the upper bound of a symbolic dimension (every command that
    compiles)."""
    parser.add_argument("--dim-max", type=dim_argument, action="append", default=[],
                        metavar="NAME=N",
                        help="declared upper bound of a symbolic input dimension: stitched "
                             "kernels stage rows of that length on chip sized for it, and "
                             "re-read beyond it (checked at run time)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line arguments of ``verify`` (shared with ``tvm-stitch verify``)."""
    parser.add_argument("model", help="path of an ONNX model")
    parser.add_argument("--pipeline", default="baseline",
                        help="compile flow: baseline (TVM's default fusion) or stitch")
    parser.add_argument("--target", type=target_argument, default=DEFAULT_TARGET,
                        help="e.g. cuda:sm_90, cuda:sm_80")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--plan", action="store_true",
                        help="also print the stitch plan (groups, schemes, fallbacks) to stderr")
    parser.add_argument("--dim", type=dim_argument, action="append", default=[],
                        metavar="NAME=SIZE",
                        help="size of a symbolic input dimension (an ONNX dim_param) to run "
                             "and measure the model at; the model is compiled symbolic")
    add_dim_max_argument(parser)
    add_database_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Execute ``verify`` for parsed arguments; returns the process exit code."""
    if args.pipeline not in pipeline.available_flows():
        print(f"pipeline {args.pipeline!r} is not available yet "
              f"(available: {', '.join(pipeline.available_flows())})", file=sys.stderr)
        return 2
    dims = dict(args.dim)
    try:
        model = load(args.model)
        _require_sized_inputs(model, dims)
        with database_or_none(args.db, args.cost_model):
            scheduled = compile_model(model, args.pipeline, args.target, dict(args.dim_max))
    except (ModelError, DatabaseError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.plan:
        print(StitchPlan.of_module(scheduled) or "no stitch plan: the baseline flow",
              file=sys.stderr)
    result = summarize(scheduled, model, args.seed, dims)
    plan = StitchPlan.of_module(scheduled)
    for given, source, key in ((args.db, ChoiceSource.DATABASE, "groups_from_database"),
                               (args.cost_model, ChoiceSource.COST_MODEL,
                                "groups_from_cost_model")):
        if given:
            result[key] = sum(g.source is source for g in (plan.groups if plan else ()))
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tvm_stitch.verify``."""
    parser = argparse.ArgumentParser(prog="python -m tvm_stitch.verify", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
