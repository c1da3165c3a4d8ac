"""``tvm-stitch tune``: tune an ONNX model's stitched groups into a database.

``tvm-stitch tune MODEL.onnx --target cuda:sm_90 --trials N --db DIR [--runner
local|rpc|simt] [--rpc-tracker HOST:PORT --rpc-key KEY] [--model analytic|xgboost]
[--save-model DIR]`` prints a line per group (default and best time, the choices that won)
and leaves every measurement in the database, which ``verify --db`` and
``tuning.use_database`` apply.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..frontend.onnx import ModelError, import_model, load
from ..target import DEFAULT_TARGET
from .cost import load_model, model_of
from .database import Database, DatabaseError
from .kinds import ModelKind, RunnerKind


def _tracker(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tvm-stitch tune``."""
    parser.add_argument("model", help="path of an ONNX model")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="e.g. cuda:sm_90")
    parser.add_argument("--trials", type=int, default=16,
                        help="candidates measured per group (default 16)")
    parser.add_argument("--db", required=True, metavar="DIR", help="the tuning database")
    parser.add_argument("--runner", type=RunnerKind, default=RunnerKind.LOCAL,
                        choices=list(RunnerKind),
                        help="local: this machine's GPU; rpc: a GPU behind TVM's RPC "
                             "tracker; simt: the CPU SIMT runner (CPU times: tests the "
                             "machinery, never a GPU speed)")
    parser.add_argument("--rpc-tracker", type=_tracker, metavar="HOST:PORT")
    parser.add_argument("--rpc-key", metavar="KEY", help="the device key of the RPC servers")
    parser.add_argument("--model", dest="cost_model", default=ModelKind.XGBOOST.value,
                        help="cost model: analytic, xgboost (trained as tuning goes), or "
                             "the directory of a saved model")
    parser.add_argument("--save-model", metavar="DIR", help="save the cost model there")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    """Execute ``tvm-stitch tune``; returns the exit code (2 for bad input)."""
    if args.runner is RunnerKind.RPC and (args.rpc_tracker is None or not args.rpc_key):
        print("error: --runner rpc needs --rpc-tracker HOST:PORT and --rpc-key KEY",
              file=sys.stderr)
        return 2
    try:
        mod = import_model(load(args.model))
        database = Database(args.db)
        model = model_of(ModelKind(args.cost_model)) \
            if args.cost_model in set(ModelKind) else load_model(args.cost_model)
    except (ModelError, DatabaseError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from .measure import runner_of  # the SIMT runner needs pyopencl, a test extra
    from .tuner import tune

    options = {}
    if args.runner is RunnerKind.RPC:
        host, port = args.rpc_tracker
        options = {"tracker_host": host, "tracker_port": port, "key": args.rpc_key}
    with runner_of(args.runner, **options) as runner:
        results = tune(mod, args.target, trials=args.trials, database=database,
                       runner=runner, model=model, seed=args.seed,
                       log=None if args.json else print)
    if args.save_model:
        model.save(args.save_model)
    if args.json:
        print(json.dumps([{"workload": r.workload, "ops": list(r.ops),
                           "measured": len(r.measured), "default_seconds": r.default_seconds,
                           "best_seconds": r.best[1] if r.best else None,
                           "best_choices": str(r.best[0].choices) if r.best else None}
                          for r in results]))
    return 0
