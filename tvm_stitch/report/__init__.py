"""``tvm-stitch report``: one self-contained HTML page of what both flows make of a model.

``write_report(model, out)`` inspects the model with the stitch and the baseline flow
(``inspect_model.inspect_onnx``), maps every ONNX node to the stitch flow's kernel it went
into (``report.mapping``), optionally reads measured times (``report.measured``), and writes
the page (``report.page``): the graph coloured by kernel, a per-kernel chart of bytes and
estimated time for both flows, a roofline plot and a summary. The page needs no network.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping as MappingABC
from pathlib import Path

import onnx

from ..frontend.onnx import ModelError, load
from ..inspect_model import FLOW_ORDER, inspect_onnx, target_gpu
from ..target import DEFAULT_TARGET, TargetSpec, target_argument
from ..verify import add_dim_max_argument, dim_argument
from .mapping import Mapping, NodeMapping, NodePlace, Place, map_nodes
from .measured import Measured, MeasuredError, load_measured, model_key
from .page import render_page


def write_report(model: str | os.PathLike | onnx.ModelProto, out: str | os.PathLike,
                 target: TargetSpec = DEFAULT_TARGET, *,
                 dims: MappingABC[str, int] | None = None,
                 measured: str | os.PathLike | None = None,
                 dim_max: MappingABC[str, int] | None = None) -> Path:
    """Write the report of ``model`` for ``target`` to ``out``; returns its path.

    ``dims`` sizes symbolic input dimensions and ``dim_max`` bounds them as
    ``inspect_onnx`` takes them; ``measured`` is
    a results JSON of ``scripts/gpu_check.py`` whose entry for the model (by the zoo's
    metadata tags, else the file's stem) gives measured times. ModelError for a refused
    model, MeasuredError for a results file that is not such JSON, ValueError for a target
    whose GPU the roofline table lacks."""
    proto = load(model)
    path = None if isinstance(model, onnx.ModelProto) else model
    times = None if measured is None else load_measured(measured, *model_key(proto, path))
    inspection = inspect_onnx(model, target, flows=FLOW_ORDER, dims=dims, dim_max=dim_max)
    mapping = map_nodes(proto, inspection.flows[0].plan)
    out = Path(out)
    out.write_text(render_page(inspection, mapping, times), encoding="utf-8")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tvm-stitch report``."""
    parser.add_argument("model", help="path of an ONNX model")
    parser.add_argument("-o", "--out", default="report.html", metavar="REPORT.html",
                        help="the page to write (default report.html)")
    parser.add_argument("--measured", metavar="RESULTS.json",
                        help="results JSON of scripts/gpu_check.py with the model's times")
    parser.add_argument("--target", type=target_argument, default=DEFAULT_TARGET,
                        help='cuda:sm_90 (default), cuda:sm_80, or TVM\'s JSON form')
    parser.add_argument("--dim", type=dim_argument, action="append", default=[],
                        metavar="NAME=SIZE",
                        help="size to count a symbolic input dimension at (each needs one)")
    add_dim_max_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Execute ``tvm-stitch report``: write the page and print its path; 2 for bad input."""
    try:
        target_gpu(args.target)
        path = write_report(args.model, args.out, args.target, dims=dict(args.dim),
                            measured=args.measured, dim_max=dict(args.dim_max))
    except (ValueError, ModelError, MeasuredError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report written to {path.resolve()}")
    return 0


__all__ = ["Mapping", "Measured", "MeasuredError", "NodeMapping", "NodePlace", "Place",
           "add_arguments", "load_measured", "map_nodes", "run", "write_report"]
