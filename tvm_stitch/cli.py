"""The ``tvm-stitch`` command line: ``demo``, ``verify``, ``tune``, ``compile``, ``run``,
``inspect``, ``report`` and ``workloads``."""

from __future__ import annotations

import argparse
import sys

from tvm.target import Target

from . import analysis, deploy, inspect_model, pipeline, verify, workloads
from . import report as html_report
from .plan import StitchPlan
from .target import DEFAULT_TARGET, target_argument
from .tuning import command as tune_command
from .workloads.__main__ import format_table

DEMO_WORKLOAD = "bert_layer"


def demo(workload: str, size: str, target: str | Target, seed: int,
         report_path: str | None = None) -> int:
    """Compile a bundled workload with every available flow, run each on the SIMT runner,
    check it against onnxruntime and print the side-by-side report; with ``report_path``,
    also write the workload's HTML report there (``tvm-stitch report``) and print its path.
    Returns the exit code."""
    model = workloads.get(workload).model(size)
    print(f"workload {workload} ({size}: {workloads.get(workload).sizes[size]}), target {target}")
    all_ok = True
    for flow in pipeline.available_flows():
        scheduled = verify.compile_model(model, flow, target)
        report = analysis.analyze(scheduled)
        check = verify.run_simt(scheduled, model, seed)
        all_ok &= check.ok
        print(f"\n== {flow} ==")
        plan = StitchPlan.of_module(scheduled)
        if plan is not None:
            print(plan)
        print(report.render())
        verdict = "matches" if check.ok else "DOES NOT match"
        print(f"SIMT run {verdict} onnxruntime (max abs err {check.max_abs_err:.2e})")
    if report_path is not None:
        path = html_report.write_report(model, report_path, target)
        print(f"\nreport written to {path.resolve()}")
    return 0 if all_ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tvm-stitch`` console script."""
    parser = argparse.ArgumentParser(prog="tvm-stitch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_demo = sub.add_parser("demo", help="compile a bundled model with each flow and report")
    p_demo.add_argument("--workload", default=DEMO_WORKLOAD, choices=workloads.names())
    p_demo.add_argument("--size", default="ci", choices=["ci", "real"])
    p_demo.add_argument("--target", type=target_argument, default=DEFAULT_TARGET)
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--report", metavar="REPORT.html",
                        help="also write the workload's HTML report (tvm-stitch report) here")

    p_verify = sub.add_parser("verify", help="check a model against onnxruntime, print JSON")
    verify.add_arguments(p_verify)

    p_tune = sub.add_parser("tune", help="tune a model's stitched groups into a database")
    tune_command.add_arguments(p_tune)

    p_compile = sub.add_parser("compile", help="compile a model into a library and sidecar")
    deploy.add_compile_arguments(p_compile)

    p_run = sub.add_parser("run", help="run a compiled library on the GPU")
    deploy.add_run_arguments(p_run)

    p_inspect = sub.add_parser("inspect", help="plan, kernels and totals of each flow")
    inspect_model.add_arguments(p_inspect)

    p_report = sub.add_parser("report", help="an offline HTML report of both flows")
    html_report.add_arguments(p_report)

    sub.add_parser("workloads", help="list the workload zoo")

    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.size == "real":
            print("note: real size runs the SIMT emulation on the CPU and can take minutes")
        return demo(args.workload, args.size, args.target, args.seed, args.report)
    if args.command == "verify":
        return verify.run(args)
    if args.command == "tune":
        return tune_command.run(args)
    if args.command == "compile":
        return deploy.compile_command(args)
    if args.command == "run":
        return deploy.run_command(args)
    if args.command == "inspect":
        return inspect_model.run(args)
    if args.command == "report":
        return html_report.run(args)
    print(format_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
