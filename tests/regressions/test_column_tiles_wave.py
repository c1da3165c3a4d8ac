"""Fuzz seed 2026 graph 732: a column reduction over rows of 6144 in a 1024-thread block was
offered 192 warp-wide column tiles, more than the 132 blocks of one wave; the row tiles for
them came out empty and an exception gave up stitching for the whole module (TVM's fusion
only, right numbers, no plan). Options wider than the wave are skipped now. The saved graph's
column reduction was TVM's import of a variadic Min (a stack and a min over it), which the
stitch flow now folds element-wise (transform/stack_reduction.py), so the skipping is
checked on the choice itself. Owner: schedule/decisions/tiles.py (``choose_tiles``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from regression_models import model, needs_stitch

from tvm_stitch import verify
from tvm_stitch.plan import BufferRole, StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions.tiles import choose_tiles, column_tile_options
from tvm_stitch.schedule.phases import BlockRole, Roles
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch

CASE = Path(__file__).parent / "cases" / "stitch-s2026-g732.onnx"


def test_the_saved_graph_compiles_without_giving_up() -> None:
    plan = StitchPlan.of_module(verify.compile_model(onnx.load(CASE), "stitch"))
    assert not plan.notes, plan.notes
    assert all(g.launch.grid <= g.launch.wave for g in plan.groups if g.phases)


def test_column_tiles_wider_than_a_wave_are_skipped() -> None:
    roles = Roles(kinds={"min": BlockRole.COLUMN}, levels={"min": 0}, widths={"min": 6144})
    options = column_tile_options(roles, 1024)
    assert options[0] == 192  # warp-wide tiles: more than the wave of 132
    tiles, column_tiles = choose_tiles(options, roles, 2, 1024, 132, 2 * 6144)
    assert column_tiles in options[1:] and tiles * column_tiles <= 132


@pytest.mark.parametrize("shape", [[1, 256, 512], [1, 16, 64, 512]])
def test_column_tiles_are_not_taken_over_an_input_staged_per_row(shape: list[int]) -> None:
    # fuzz graph 7321:1486 (large 0.05): the max over all rows of a softmax over a unit axis
    # (exp(x - x), which reads x at two places: staged per row) took column tiles with lanes,
    # threads on parts of a tile's rows, which the block-wide copy of each row does not
    # follow: an emitter assertion, and the group fell back ("scheduling failed")
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=0),
             helper.make_node("ReduceMax", ["s", "axes"], ["y"], keepdims=1)]
    reduced = list(range(len(shape) - 1))
    built = model(nodes, {"x": shape}, {"y": [1] * len(reduced) + shape[-1:]},
                  {"axes": np.array(reduced, np.int64)})
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []


def test_partial_sums_too_large_whole_take_column_tiles_before_registers() -> None:
    # fuzz graph 3301:40: a sum over the leading axis of (8, 12, 64, 64), 8 rows of 49152
    # columns. Whole, the partial sums of a row tile take 196 KB, over a quarter of the
    # shared budget, and they were kept in registers, 48 per thread: one row tile, one task,
    # one block of the GPU's 132 doing all the reading. In 48 tiles of 1024 columns they
    # take 4 KB each, one column per thread, on 48 blocks.
    built = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                  {"x": [8, 12, 64, 64]}, {"y": [12, 64, 64]}, {"axes": np.array([0])})
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    (accumulator,) = [b for b in group.buffers if b.role is BufferRole.ACCUMULATOR]
    assert (accumulator.level, accumulator.registers) == (StorageLevel.SHARED, 0)
    assert 1024 * 4 <= accumulator.shared_bytes <= 1024 * 4 + 1024  # a tile's sums
    assert group.phases[0].tasks == 48 and group.phases[0].column_tiles == 48
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
