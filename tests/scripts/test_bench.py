"""scripts/bench.py --dynamic: models exported with dynamic axes, compiled once, counted and
run at their example sizes, which the size column names."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
bench = importlib.import_module("bench")


def test_dynamic_models_are_counted_at_their_example_sizes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert bench.main(["--dynamic", "--workloads", "dien_block,swin_block,softmax",
                       "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["workloads"]  # swin and the micro left out
    assert row["name"] == "dien_block"
    assert "dynamic batch and seq, counted at batch=16, seq=16" in row["size"]
    stitch, baseline = row["pipelines"]["stitch"], row["pipelines"]["baseline"]
    assert stitch["ok"] and baseline["ok"]
    assert stitch["kernels"] <= baseline["kernels"]
    assert stitch["global_bytes"] <= baseline["global_bytes"]
