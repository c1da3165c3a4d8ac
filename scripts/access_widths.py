"""Bytes per global access of each stitched kernel of zoo models, counted in nvcc's PTX.

    python scripts/access_widths.py llama_block gpt2_block_fp16 [--size real] [--layers 1]

A memory-bound kernel reaches the bandwidth with 16-byte accesses (``ld.global.nc.v4.u32``:
eight halves or four floats per thread); narrower ones need more instructions in flight for
the same bytes. One line per kernel of a stitched group (identical layers' kernels once):
its access instructions by width, and the smallest width it loads or stores with.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

from tvm_stitch import pipeline
from tvm_stitch.analysis.ptxas import access_bytes, global_accesses
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.target import cuda_target
from tvm_stitch.workloads import models


def kernel_widths(name: str, size: str, layers: int, arch: str) -> dict[str, Counter[int]]:
    """Per stitched kernel of ``name`` (layers' copies once, by their name without digits):
    its global access instructions counted by bytes per thread."""
    scheduled = pipeline.lower(import_model(models.load_model(name, size, layers=layers)),
                               cuda_target(arch), "stitch")
    executable = pipeline.build(scheduled, cuda_target(arch))
    stack, cuda = [executable.mod], None
    while stack and cuda is None:
        mod = stack.pop()
        cuda = mod.inspect_source() if mod.kind == "cuda" else None
        stack.extend(mod.imports)
    if cuda is None:
        raise SystemExit(f"{name}: no CUDA module built")
    found: dict[str, Counter[int]] = {}
    for kernel, counts in sorted(global_accesses(cuda, arch).items()):
        key = re.sub(r"\d+", "#", kernel)
        if kernel.startswith("stitch") and key not in found:
            found[key] = Counter()
            for instruction, n in counts.items():
                found[key][access_bytes(instruction)] += n
    return found


def main(argv: list[str] | None = None) -> int:
    """Print each model's stitched kernels with their access widths."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", choices=sorted(models.SPECS))
    parser.add_argument("--size", default="real", choices=["ci", "real"])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args(argv)
    for name in args.models:
        print(f"== {name} ({args.size}, {args.layers} layer(s), {args.arch})")
        for kernel, widths in kernel_widths(name, args.size, args.layers, args.arch).items():
            text = ", ".join(f"{n} x {b} B" for b, n in sorted(widths.items()))
            print(f"  {kernel[:60]:60s} narrowest {min(widths, default=0):2d} B  ({text})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
