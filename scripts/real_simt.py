"""Run zoo models at real width on the CPU SIMT runner and compare with onnxruntime.

    python scripts/real_simt.py bert_layer gpt2_block [--layers 1] [--flow stitch] [--size real]

Slow (seconds to minutes per model: the matmuls run on PoCL too); one line per model.
"""

from __future__ import annotations

import argparse
import sys
import time

from tqdm import tqdm

from tvm_stitch import verify
from tvm_stitch.workloads import models


def main(argv: list[str] | None = None) -> int:
    """Check each named model; exit status 1 if any does not match."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", choices=sorted(models.SPECS))
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--flow", default="stitch")
    parser.add_argument("--target", default="cuda:sm_90")
    parser.add_argument("--size", default="real", choices=["ci", "real"])
    args = parser.parse_args(argv)
    failed = False
    bar = tqdm(args.models, unit="model", desc="SIMT", disable=None)  # on a terminal only
    for name in bar:
        bar.set_postfix_str(name)
        start = time.perf_counter()
        model = models.load_model(name, args.size, layers=args.layers)
        check = verify.run_simt(verify.compile_model(model, args.flow, args.target), model)
        failed |= not check.ok
        line = (f"{name:20s} {'ok' if check.ok else 'MISMATCH'} "
                f"max_abs_err={check.max_abs_err:.2e} ({time.perf_counter() - start:.0f} s)")
        if bar.disable:
            print(line, flush=True)
        else:
            bar.write(line, file=sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
