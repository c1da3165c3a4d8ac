"""Differential fuzzing of a compile flow on random graphs of memory-intensive ops.

    python scripts/fuzz.py --graphs 200 --seed 1 [--jobs 2] [--flow stitch] [--out fuzz-out]
                           [--regressions tests/regressions/cases] [--large 0.05]

Each graph is compiled with the flow for a CUDA target, run on the CPU SIMT runner, compared
with onnxruntime, and every kernel's resources are checked for sm_80 and sm_90. Failures are
written to ``--out``, shrunk to a minimal graph and (``--regressions``) saved as regression
cases. The last line printed is::

    graphs=N mismatches=M crashes=C fallbacks=F tvm_crashes=T resource_violations=R
    tvm_resource_violations=V genuine_fallbacks=G

``crashes`` counts crashes of ours; ``tvm_crashes`` the crashes raised in TVM's code while
importing or compiling that the baseline flow meets too (``tvm_stitch.testing.differential``),
each printed with its error; ``fallbacks`` the graphs whose stitch plan left a region to TVM,
``genuine_fallbacks`` those among them that left one for a reason other than "nothing to
stitch" (a single op, reshapes TVM makes views).
Exit status 1 when M, C or R is non-zero.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tqdm import tqdm

from tvm_stitch.pipeline import available_flows
from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.testing.differential import default_flow
from tvm_stitch.testing.fuzz import Options, Summary, run
from tvm_stitch.testing.graphs import GraphConfig


def parse_args(argv: list[str] | None = None) -> Options:
    """Options of a fuzz run from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=100, help="number of graphs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the graph sequence")
    parser.add_argument("--start", type=int, default=0,
                        help="index of the first graph (--start 97 --graphs 1: graph 97 alone)")
    parser.add_argument("--flow", default=default_flow(), choices=available_flows())
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--out", type=Path, help="directory for failing graphs and reports")
    parser.add_argument("--regressions", type=Path,
                        help="save shrunk failures here as regression cases "
                             "(e.g. tests/regressions/cases)")
    parser.add_argument("--no-resources", action="store_true",
                        help="skip the per-kernel resource checks (nvcc)")
    parser.add_argument("--no-cost", action="store_true",
                        help="skip comparing kernels and global bytes with TVM's flow")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per graph before it counts as a hang (0: no worker)")
    parser.add_argument("--shrink-budget", type=int, default=60,
                        help="replays spent shrinking each failure (0: no shrinking)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="graphs checked at once, each in its own worker process "
                             "(1 with --timeout 0: checks then run in this process)")
    parser.add_argument("--max-nodes", type=int, default=GraphConfig.max_nodes)
    parser.add_argument("--float16", type=float, default=GraphConfig.float16,
                        help="probability of a float16 graph")
    parser.add_argument("--matmul", type=float, default=GraphConfig.matmul,
                        help="weight of MatMul nodes among the ops (0: none)")
    parser.add_argument("--large", type=float, default=GraphConfig.large,
                        help="probability of a graph on a large model-like shape (10^5 to "
                             "10^7 elements: (B*S, hidden), (B, HW, C), (B, C, H, W), "
                             "(B, heads, S, S))")
    args = parser.parse_args(argv)
    config = GraphConfig(max_nodes=args.max_nodes, float16=args.float16, matmul=args.matmul,
                         large=args.large)
    return Options(graphs=args.graphs, seed=args.seed, start=args.start, flow=args.flow,
                   target=args.target, out=args.out, regressions=args.regressions,
                   resources=not args.no_resources, cost=not args.no_cost,
                   timeout=args.timeout,
                   shrink_budget=args.shrink_budget,
                   jobs=max(1, args.jobs) if args.timeout > 0 else 1,
                   config=config)


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; returns the exit status."""
    options = parse_args(argv)
    print(f"fuzzing flow {options.flow} on {options.target}: {options.graphs} graphs, "
          f"seed {options.seed}", flush=True)
    # A bar per graph on a terminal (stderr); elsewhere the plain lines alone, as before.
    with tqdm(total=options.graphs, unit="graph", desc="fuzz", disable=None) as bar:
        def say(line: str) -> None:
            if bar.disable:
                print(line, flush=True)
            else:
                bar.write(line, file=sys.stdout)

        def done(so_far: Summary) -> None:
            bar.update()
            bar.set_postfix_str(so_far.line(), refresh=False)

        summary = run(options, log=say, done=done)
    for reason, graphs in summary.fallback_reasons.most_common():
        print(f"fallback in {graphs} graph(s): {reason}")
    for error, graphs in summary.tvm_errors.most_common():
        print(f"TVM's crash (excused) in {graphs} graph(s): {error}")
    for failure in summary.failures:
        print(f"failed: {failure}")
    print(summary.line())
    return 1 if summary.failed else 0


if __name__ == "__main__":
    # On SIGTERM, unwind normally so that the worker process is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
