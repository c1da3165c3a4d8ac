"""Compile an ONNX model with a flow, run it on the CPU SIMT runner, check it against
onnxruntime and report kernels and traffic.

``python -m tvm_stitch.verify MODEL.onnx --pipeline baseline|stitch [--target cuda:sm_90]``
prints one JSON object and exits 1 when the outputs do not match.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np
import onnx
from tvm.ir import IRModule

from . import analysis, pipeline
from .frontend.onnx import ModelError, graph_inputs, import_model, load
from .plan import StitchPlan
from .target import DEFAULT_TARGET
from .workloads import inputs as make_inputs

RTOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2}
ATOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2}


@dataclass
class Check:
    """Outcome of comparing a model's outputs with onnxruntime's."""

    max_abs_err: float
    ok: bool


def compile_model(model: onnx.ModelProto, flow: str, target: str = DEFAULT_TARGET) -> IRModule:
    """Import ``model`` and fuse and schedule it with ``flow``: the scheduled module."""
    return pipeline.lower(import_model(model), target, flow)


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


def run_simt(scheduled: IRModule, model: onnx.ModelProto, seed: int = 0) -> Check:
    """Run ``scheduled`` on the SIMT runner with seeded inputs and compare with onnxruntime."""
    from .simt import SimtModule

    feeds = make_inputs(model, seed)
    outputs = SimtModule(scheduled)(*feeds.values())
    return compare(outputs, reference_outputs(model, feeds))


def verify(model: onnx.ModelProto, flow: str = "baseline", target: str = DEFAULT_TARGET,
           seed: int = 0) -> dict:
    """Compile, run on the SIMT runner and measure: the JSON-ready summary ``verify`` prints."""
    return summarize(compile_model(model, flow, target), model, seed)


def summarize(scheduled: IRModule, model: onnx.ModelProto, seed: int = 0) -> dict:
    """Kernels, traffic and the onnxruntime comparison of an already compiled model."""
    report = analysis.analyze(scheduled).to_dict()
    check = run_simt(scheduled, model, seed)
    return {
        "kernels": report["kernels"],
        "global_bytes": report["global_bytes"],
        "compulsory_bytes": report["compulsory_bytes"],
        "traffic_ratio": report["traffic_ratio"],
        "max_abs_err": check.max_abs_err,
        "ok": check.ok,
    }


def _require_static_inputs(model: onnx.ModelProto) -> None:
    """verify feeds random inputs, so every input dimension must be a number."""
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            raise ModelError(f"input {value.name!r} has a symbolic shape "
                             f"{[d.dim_param or d.dim_value for d in dims]}: verify needs "
                             "static input shapes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line arguments of ``verify`` (shared with ``tvm-stitch verify``)."""
    parser.add_argument("model", help="path of an ONNX model")
    parser.add_argument("--pipeline", default="baseline",
                        help="compile flow: baseline (TVM's default fusion) or stitch")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="e.g. cuda:sm_90, cuda:sm_80")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--plan", action="store_true",
                        help="also print the stitch plan (groups, schemes, fallbacks) to stderr")


def run(args: argparse.Namespace) -> int:
    """Execute ``verify`` for parsed arguments; returns the process exit code."""
    if args.pipeline not in pipeline.available_flows():
        print(f"pipeline {args.pipeline!r} is not available yet "
              f"(available: {', '.join(pipeline.available_flows())})", file=sys.stderr)
        return 2
    try:
        model = load(args.model)
        _require_static_inputs(model)
        scheduled = compile_model(model, args.pipeline, args.target)
    except ModelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.plan:
        print(StitchPlan.of_module(scheduled) or "no stitch plan: the baseline flow",
              file=sys.stderr)
    result = summarize(scheduled, model, args.seed)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tvm_stitch.verify``."""
    parser = argparse.ArgumentParser(prog="python -m tvm_stitch.verify", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
