"""``tvm-stitch tune``: tune an ONNX model's stitched groups into a database.

``tvm-stitch tune MODEL.onnx --target cuda:sm_90 --trials N --db DIR [--runner
local|rpc|simt] [--rpc-tracker HOST:PORT --rpc-key KEY] [--model analytic|xgboost]
[--save-model DIR]`` prints a line per group (default and best time, the choices that won)
and leaves every measurement in the database, which ``verify --db`` and
``tuning.use_database`` apply.

For a GPU this machine cannot reach (``tuning.pack``): ``tvm-stitch tune MODEL.onnx
--export PACK --db DIR [--runner local|simt]`` builds the candidates instead of measuring
them; ``python PACK/pack_runner.py PACK RESULTS`` times them on the GPU's machine;
``tvm-stitch tune --import RESULTS --db DIR`` records the times.
``tvm-stitch tune --train RESULTS... --save-model DIR`` trains the xgboost model on the
times of such results files (``tuning.training``), prints how well it ranks each file's
groups when trained on the others, and saves it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tvm.ir import IRModule

from ..frontend.onnx import ModelError, import_model, load
from ..target import DEFAULT_TARGET, target_argument
from ..verify import add_dim_max_argument
from .cost import CostModel, load_model, model_of, shipped_models
from .database import Database, DatabaseError
from .kinds import ModelKind, RunnerKind


def _tracker(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tvm-stitch tune``."""
    parser.add_argument("model", nargs="?",
                        help="path of an ONNX model (none with --import)")
    parser.add_argument("--target", type=target_argument, default=DEFAULT_TARGET,
                        help="e.g. cuda:sm_90")
    parser.add_argument("--trials", type=int, default=16,
                        help="candidates measured per group (default 16)")
    parser.add_argument("--db", metavar="DIR", help="the tuning database (needed but with "
                        "--train)")
    parser.add_argument("--runner", type=RunnerKind, default=RunnerKind.LOCAL,
                        choices=list(RunnerKind),
                        help="local: this machine's GPU; rpc: a GPU behind TVM's RPC "
                             "tracker; simt: the CPU SIMT runner (CPU times: tests the "
                             "machinery, never a GPU speed)")
    parser.add_argument("--rpc-tracker", type=_tracker, metavar="HOST:PORT")
    parser.add_argument("--rpc-key", metavar="KEY", help="the device key of the RPC servers")
    parser.add_argument("--model", dest="cost_model", default=ModelKind.XGBOOST.value,
                        help="cost model: analytic, xgboost (trained as tuning goes), a "
                             "shipped model's name (one trained on a GPU's times: "
                             f"{', '.join(shipped_models()) or 'none yet'}), or the "
                             "directory of a saved model")
    parser.add_argument("--save-model", metavar="DIR", help="save the cost model there")
    parser.add_argument("--seed", type=int, default=0)
    add_dim_max_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    offline = parser.add_mutually_exclusive_group()
    offline.add_argument("--export", metavar="PACK",
                         help="build the candidates into the directory PACK instead of "
                              "measuring them: a CUDA pack (--runner local) for a GPU this "
                              "machine cannot reach, or a SIMT pack (--runner simt); "
                              "PACK/pack_runner.py times them")
    offline.add_argument("--import", dest="import_results", metavar="RESULTS",
                         help="record the times of a pack's runner (its RESULTS file) in "
                              "--db; takes no MODEL")
    offline.add_argument("--train", nargs="+", metavar="RESULTS",
                         help="train the xgboost model on the times of pack runners' "
                              "RESULTS files, print its held-out Kendall taus, save it to "
                              "--save-model; takes no MODEL")


def _misuse(args: argparse.Namespace) -> str:
    """Why the arguments do not go together, or ""."""
    if args.train is not None:
        if args.model is not None:
            return "--train takes no MODEL: the RESULTS files hold what it trains on"
        if not args.save_model:
            return "--train needs --save-model DIR, where the trained model goes"
        return ""
    if args.db is None:
        return "the following arguments are required: --db"
    if args.import_results is not None:
        if args.model is not None:
            return "--import takes no MODEL: RESULTS names the candidates it timed"
        if args.save_model:
            return "--save-model needs a tuning that measures here, not --import"
        return ""
    if args.model is None:
        return "give the MODEL to tune or to --export, or --import RESULTS"
    if args.export is not None:
        if args.runner is RunnerKind.RPC:
            return ("--export builds a pack for --runner local (a CUDA GPU) or simt; rpc "
                    "measures through its tracker, without a pack")
        if args.save_model:
            return "--save-model needs a tuning that measures here, not --export"
        return ""
    if args.runner is RunnerKind.RPC and (args.rpc_tracker is None or not args.rpc_key):
        return "--runner rpc needs --rpc-tracker HOST:PORT and --rpc-key KEY"
    return ""


def _import(args: argparse.Namespace) -> int:
    """``--import RESULTS``: record its times in ``--db``."""
    from .pack import import_results  # imports measure: pyopencl, as runner_of below

    try:
        count = import_results(args.import_results, Database(args.db))
    except DatabaseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"imported": count, "db": args.db}))
    else:
        print(f"imported {count} records from {args.import_results} into {args.db}")
    return 0


def _train(args: argparse.Namespace) -> int:
    """``--train RESULTS...``: fit the xgboost model on their times, score it held out,
    save it with what it was trained on."""
    from .training import held_out_taus, read_timed, train

    try:
        timed = read_timed(args.train)
    except DatabaseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not timed:
        print("error: the RESULTS files hold no timed candidate", file=sys.stderr)
        return 2
    scores = held_out_taus(timed)
    train(timed).save(args.save_model)
    summary = {
        "candidates": len(timed),
        "sources": sorted({t.source for t in timed}),
        "held_out": [vars(s) for s in scores],
        "mean_tau": {"xgboost": _mean([s.xgboost for s in scores]),
                     "analytic": _mean([s.analytic for s in scores])},
        "command": "tvm-stitch tune --train " + " ".join(map(str, args.train))
                   + f" --save-model {args.save_model}",
    }
    Path(args.save_model, TRAINED_ON).write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{'held out':32s} {'groups':>6s} {'xgboost tau':>12s} {'analytic tau':>13s}")
    for s in scores:
        print(f"{s.source:32s} {s.tasks:6d} {s.xgboost:12.2f} {s.analytic:13.2f}")
    means = summary["mean_tau"]
    print(f"{'mean':32s} {'':6s} {_show(means['xgboost']):>12s} {_show(means['analytic']):>13s}")
    print(f"trained on {len(timed)} candidates; saved to {args.save_model}")
    return 0


TRAINED_ON = "trained_on.json"
"""The file of a model saved by ``--train`` that says what it was trained on and how it
ranked held-out workloads."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _show(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _export(args: argparse.Namespace, mod: IRModule, model: CostModel) -> int:
    """``--export PACK``: build the pack instead of measuring."""
    from .pack import MANIFEST, export_pack

    try:
        pack = export_pack(mod, args.target, args.export, trials=args.trials, model=model,
                           runner_kind=args.runner, seed=args.seed)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    manifest = json.loads((pack / MANIFEST).read_text())
    count, groups = len(manifest["candidates"]), len({c["workload"]
                                                       for c in manifest["candidates"]})
    failed = len(manifest["build_errors"])
    if args.json:
        print(json.dumps({"pack": str(pack), "runner": manifest["runner"],
                          "candidates": count, "groups": groups, "build_errors": failed}))
        return 0
    kind = "a CUDA" if manifest["runner"] == RunnerKind.LOCAL else "a SIMT"
    print(f"{kind} pack in {pack}: {count} candidates of {groups} "
          f"group{'' if groups == 1 else 's'}"
          + (f", {failed} that did not build (see its manifest)" if failed else ""))
    print(f"next: python {pack}/pack_runner.py {pack} RESULTS (where the GPU is), then "
          f"tvm-stitch tune --import RESULTS --db {args.db}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute ``tvm-stitch tune``; returns the exit code (2 for bad input)."""
    problem = _misuse(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.import_results is not None:
        return _import(args)
    if args.train is not None:
        return _train(args)
    try:
        mod = import_model(load(args.model), dim_max=dict(args.dim_max))
        database = Database(args.db)
        model = model_of(ModelKind(args.cost_model)) \
            if args.cost_model in set(ModelKind) else load_model(args.cost_model)
    except (ModelError, DatabaseError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.export is not None:
        return _export(args, mod, model)
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
