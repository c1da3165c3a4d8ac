"""Export the model workloads (one-layer transformers blocks and the DIEN-like block) to ONNX.

    python scripts/export_models.py [--size ci|real] [--out DIR] [--only NAME ...] [--force]

Files are written as ``<name>-<size>.onnx`` into ``--out`` (default: the cache the library
reads, ``$TVM_STITCH_MODEL_CACHE`` or ``~/.cache/tvm-stitch/models``). Up-to-date files are
kept unless ``--force``. Needs the ``models`` extra (torch==2.13.0, transformers, onnxscript).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tvm_stitch.workloads import SIZES, ModelsExtraMissing, cache_dir, cached_path, names
from tvm_stitch.workloads.models import export_model, load_model


def main(argv: list[str] | None = None) -> int:
    """Export the requested models; exit 1 when the models extra is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="ci")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output directory (default: {cache_dir()})")
    parser.add_argument("--only", nargs="+", choices=names("model"), default=names("model"),
                        metavar="NAME", help="export only these models")
    parser.add_argument("--force", action="store_true", help="re-export up-to-date files")
    args = parser.parse_args(argv)
    for name in args.only:
        path = cached_path(name, args.size, args.out)
        start = time.perf_counter()
        try:
            if args.force:
                export_model(name, args.size, path)
            else:
                load_model(name, args.size, args.out)
        except ModelsExtraMissing as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        seconds = time.perf_counter() - start
        megabytes = path.stat().st_size / 1e6
        print(f"{name:12s} {args.size:4s} {path}  {megabytes:.1f} MB  {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
