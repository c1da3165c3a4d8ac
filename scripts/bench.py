"""Every workload, every available flow, side by side: kernels, traffic, roofline estimates.

    python scripts/bench.py --size ci|real --json PATH --md PATH [--workloads a,b] [--flows f,g]
                            [--layers N] [--dynamic]

At ``ci`` size each compiled model also runs on the CPU SIMT runner and is compared with
onnxruntime (``max_abs_err``); at ``real`` size that column is null. Figures are counted from
the scheduled TIR (see ``tvm_stitch.analysis``), not timed. With ``--dynamic`` the model
workloads are exported with dynamic batch and sequence axes, compiled once, symbolic, and
counted (and run) at the sizes of the example inputs they were exported with, which the size
column names; the micro workloads and the models exported static only are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from tqdm import tqdm
from tvm import tirx

from tvm_stitch import analysis, pipeline, verify, workloads
from tvm_stitch.frontend.onnx import declared_dim_max, with_dim_max
from tvm_stitch.schedule.grid_barrier import count_grid_barriers
from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.workloads import models

GPUS = ("H200", "A100", "V100")


def bench_flow(model, flow: str, size: str, target: str, dims: dict[str, int] | None = None
               ) -> dict:
    """Figures of one workload compiled with one flow, symbolic dimensions counted at
    ``dims``."""
    scheduled = verify.compile_model(model, flow, target)
    report = analysis.analyze(scheduled, shape_vars=dims).to_dict()
    row = {k: report[k] for k in ("kernels", "mem_kernels", "global_bytes", "traffic_ratio",
                                  "dram_bytes", "dram_ratio", "sector_bytes", "roofline_us")}
    kernels = report["per_kernel"]
    row["blocks"] = [k["blocks"] for k in kernels]
    row["threads_per_block"] = [k["threads_per_block"] for k in kernels]
    row["waves"] = [round(k["waves"]["H200"], 3) for k in kernels]
    row["grid_barriers"] = sum(count_grid_barriers(f) for f in scheduled.functions.values()
                               if isinstance(f, tirx.PrimFunc))
    check = verify.run_simt(scheduled, model, dims=dims) if size == "ci" else None
    row["max_abs_err"] = check.max_abs_err if check else None
    row["ok"] = check.ok if check else None
    row["compulsory_bytes"] = report["compulsory_bytes"]
    return row


def bench(names: list[str], flows: list[str], size: str, target: str,
          layers: int | None = None, dynamic: bool = False,
          dim_max: dict[str, int] | None = None) -> dict:
    """Run the benchmark (model workloads ``layers`` deep, default their size's depth; with
    ``dynamic``, only the model workloads that export with dynamic axes, exported so, their
    symbolic dimensions bounded by ``dim_max`` where it names them); failures are recorded
    per workload and flow, never hidden."""
    if dynamic:
        names = [n for n in names if workloads.get(n).kind == "model"
                 and models.spec(n, size).arch not in models.STATIC_ONLY]
    rows = []
    bar = tqdm(total=len(names) * len(flows), unit="compile", desc="bench", disable=None)
    for name in names:
        workload = workloads.get(name)
        deep = (layers is not None or dynamic) and workload.kind == "model"
        model = (models.load_model(name, size, layers=layers, dynamic=dynamic) if deep
                 else workload.model(size))
        model = with_dim_max(model, dim_max or {})
        spec = models.spec(name, size, layers, dynamic) if deep else None
        described = spec.summary if deep else workload.sizes[size]
        dims = spec.example_dims if dynamic else None
        if dims:
            described += ", counted at " + ", ".join(f"{d}={v}" for d, v in dims.items())
        bounded = declared_dim_max(model)
        if bounded:
            described += ", at most " + ", ".join(f"{d}={v}" for d, v in bounded.items())
        entry: dict = {"name": name, "size": described, "pipelines": {}}
        for flow in flows:
            start = time.perf_counter()
            try:
                result = bench_flow(model, flow, size, target, dims)
                entry["compulsory_bytes"] = result.pop("compulsory_bytes")
            except Exception as err:  # a crash in one flow must not hide the others' figures
                result = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
                traceback.print_exc(file=sys.stderr)
            result["compile_s"] = round(time.perf_counter() - start, 2)
            entry["pipelines"][flow] = result
            bar.write(f"{name:24s} {flow:9s} {_summary(result)}", file=sys.stderr)
            bar.update()
        rows.append(entry)
    bar.close()
    return {"target": target, "size": size, "workloads": rows}


def _summary(r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    err = "" if r["max_abs_err"] is None else f" err={r['max_abs_err']:.1e}"
    return (f"kernels={r['kernels']} mem={r['mem_kernels']} ratio={r['traffic_ratio']:.2f} "
            f"dram={r['dram_ratio']:.2f} sectors={_sector_ratio(r):.2f} "
            f"H200={r['roofline_us']['H200']:.1f}us{err}")


def markdown(result: dict, flows: list[str]) -> str:
    """The benchmark as a Markdown table, one row per workload, flows side by side."""
    head = ["workload", "size", "compulsory MB"]
    for flow in flows:
        head += [f"{flow} kernels", f"{flow} mem kernels", f"{flow} MB", f"{flow} ratio",
                 f"{flow} DRAM ratio", f"{flow} sector ratio", f"{flow} H200 us",
                 f"{flow} A100 us", f"{flow} V100 us", f"{flow} max err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in result["workloads"]:
        cells = [w["name"], w["size"], _mb(w.get("compulsory_bytes"))]
        for flow in flows:
            r = w["pipelines"].get(flow, {"error": "not run"})
            if "error" in r:
                cells += ["error: " + r["error"][:60]] + [""] * 9
                continue
            err = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.1e}"
            cells += [str(r["kernels"]), str(r["mem_kernels"]), _mb(r["global_bytes"]),
                      f"{r['traffic_ratio']:.2f}", f"{r['dram_ratio']:.2f}",
                      f"{_sector_ratio(r):.2f}"]
            cells += [f"{r['roofline_us'][g]:.1f}" for g in GPUS] + [err]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _sector_ratio(r: dict) -> float:
    """Bytes of the sectors the warps move per byte they access (1.0: coalesced)."""
    return r["sector_bytes"] / r["global_bytes"] if r["global_bytes"] else 1.0


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.3f}"


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 1 when any workload failed to compile or mismatched onnxruntime."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["ci", "real"], default="ci")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--md", type=Path, help="write the Markdown table here")
    parser.add_argument("--workloads", help="comma-separated names (default: all)")
    parser.add_argument("--flows", help="comma-separated flows (default: all available)")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--layers", type=int,
                        help="depth of the model workloads (default: 2 at ci, 4 at real)")
    parser.add_argument("--dynamic", action="store_true",
                        help="the model workloads exported with dynamic batch and sequence "
                             "axes, counted at their example sizes")
    parser.add_argument("--dim-max", type=verify.dim_argument, action="append", default=[],
                        metavar="NAME=N",
                        help="with --dynamic: the declared upper bound of a symbolic "
                             "dimension, in the models that have it")
    args = parser.parse_args(argv)
    names = args.workloads.split(",") if args.workloads else workloads.names()
    flows = args.flows.split(",") if args.flows else pipeline.available_flows()
    result = bench(names, flows, args.size, args.target, args.layers, args.dynamic,
                   dict(args.dim_max))
    table = markdown(result, flows)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        args.md.write_text(f"# Benchmark, {args.size} size, target {args.target}\n\n"
                           "Counted from the scheduled TIR (no GPU timing); regenerate with\n"
                           f"`python scripts/bench.py --size {args.size}"
                           + (f" --layers {args.layers}" if args.layers else "")
                           + (" --dynamic" if args.dynamic else "")
                           + "".join(f" --dim-max {d}={v}" for d, v in args.dim_max)
                           + (f" --json {args.json}" if args.json else "")
                           + f" --md {args.md}`.\n\n"
                           + table)
    print(table)
    failed = [w["name"] for w in result["workloads"] for r in w["pipelines"].values()
              if "error" in r or r["ok"] is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
