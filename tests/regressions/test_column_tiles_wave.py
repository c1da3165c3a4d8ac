"""Fuzz seed 2026 graph 732: a column reduction over rows of 6144 in a 1024-thread block was
offered 192 warp-wide column tiles, more than the 132 blocks of one wave; the row tiles for
them came out empty and an exception gave up stitching for the whole module (TVM's fusion
only, right numbers, no plan). Options wider than the wave are skipped now. Owner:
schedule/decisions.py (``_tiles``)."""

from __future__ import annotations

from pathlib import Path

import onnx
from regression_models import needs_stitch

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan

pytestmark = needs_stitch

CASE = Path(__file__).parent / "cases" / "stitch-s2026-g732.onnx"


def test_column_tiles_wider_than_a_wave_are_skipped() -> None:
    plan = StitchPlan.of_module(verify.compile_model(onnx.load(CASE), "stitch"))
    assert not plan.notes, plan.notes
    tiled = [p for g in plan.groups for p in g.phases if p.column_tiles > 1]
    assert tiled and all(g.launch.grid <= g.launch.wave for g in plan.groups if g.phases)
