"""``python -m tvm_stitch.workloads --list``: the workload zoo, one line per workload."""

from __future__ import annotations

import argparse
import sys

from .registry import KINDS, all_workloads


def format_table(kind: str | None = None, verbose: bool = False) -> str:
    """One line per workload: name, kind and every size (and the description if verbose)."""
    lines = []
    for w in all_workloads():
        if kind is not None and w.kind != kind:
            continue
        sizes = "; ".join(f"{size}: {text}" for size, text in w.sizes.items())
        lines.append(f"{w.name:24s} {w.kind:6s} {sizes}")
        if verbose:
            lines.append(f"{'':31s} {w.description}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tvm_stitch.workloads``."""
    parser = argparse.ArgumentParser(prog="python -m tvm_stitch.workloads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list every workload")
    parser.add_argument("--kind", choices=KINDS, help="only workloads of this kind")
    parser.add_argument("-v", "--verbose", action="store_true", help="add descriptions")
    args = parser.parse_args(argv)
    if not args.list:
        parser.print_help()
        return 2
    print(format_table(args.kind, args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
