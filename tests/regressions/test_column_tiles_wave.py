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
from tvm_stitch.plan import BufferRole, DemotionKind, StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions.tiles import choose_tiles, column_tile_options, tile_threads
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


@pytest.mark.usefixtures("columns_as_global")
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


def _mean_beside_rows(shape: list[int], dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """A mean over the leading axis of ``shape`` and element-wise rows, of one producer."""
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("ReduceMean", ["a", "axes"], ["m"], keepdims=1),
             helper.make_node("Exp", ["a"], ["e"]),
             helper.make_node("Neg", ["e"], ["y"])]
    return model(nodes, {"x": shape}, {"m": [1, *shape[1:]], "y": shape},
                 {"axes": np.array([0])}, elem_type=dtype)


@pytest.mark.parametrize(("shape", "dtype", "threads"), [
    ([2, 30000], onnx.TensorProto.FLOAT16, 1000),  # fuzz graph 3301:1959's shape
    ([4, 40, 1024], onnx.TensorProto.FLOAT, 1024),  # 3-D, 163840 elements
])
def test_element_wise_rows_take_the_column_tiles_of_partial_sums_beside_them(
        shape: list[int], dtype: int, threads: int) -> None:
    # fuzz graph 3301:1959: two rows of 30000 beside a mean over them. Whole, a row tile's
    # partial sums take 120 KB, and they were kept in registers, 30 per thread, on one task
    # of 1024 threads that also ran the element-wise rows: spilled 16 B. The rows now take
    # the column tiles too, on blocks as wide as a tile (1000 threads divide 30000), each
    # thread on a column of every row.
    built = _mean_beside_rows(shape, dtype)
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    (accumulator,) = [b for b in group.buffers if b.role is BufferRole.ACCUMULATOR]
    assert (accumulator.level, accumulator.registers) == (StorageLevel.SHARED, 0)
    width = int(np.prod(shape[1:]))
    rows = group.phases[0]
    assert (rows.column_tiles, rows.tasks) == (width // threads, width // threads)
    assert group.mapping.threads_per_block == threads and group.mapping.vector == 1
    assert not any(b.level is StorageLevel.SHARED and b.role is BufferRole.INPUT
                   for b in group.buffers)  # a task holds a part of each row
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_many_rows_keep_their_row_tiles_beside_partial_sums() -> None:
    # rows enough to fill the wave with row tiles keep whole rows and their vectors: the
    # column tiles are for rows too few to spread the work otherwise
    built = _mean_beside_rows([2048, 4096])
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    assert group.phases[0].column_tiles == 1 and group.mapping.vector > 1
    assert not any(d.kind is DemotionKind.ROWS_IN_COLUMN_TILES for d in group.demotions)


@pytest.mark.usefixtures("columns_as_global", "global_at_any_cost")
def test_a_block_narrows_to_column_tiles_that_divide_the_width() -> None:
    # a sum over the leading 2 of (2, 30000): no multiple of a warp divides 30000, and one
    # task kept 30 partial sums per thread in registers; blocks of 1000 threads take 30
    # tiles of 1000 columns
    built = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                  {"x": [2, 30000]}, {"y": [30000]}, {"axes": np.array([0])})
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    assert group.mapping.threads_per_block == 1000
    assert (group.phases[0].tasks, group.phases[0].column_tiles) == (30, 30)
    assert not any(b.registers for b in group.buffers)
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_tile_threads() -> None:
    assert tile_threads(30000, 1024) == 1000
    assert tile_threads(4096, 1024) == 1024
    assert tile_threads(30011, 1024) is None  # a prime: no tile wider than half the block


@pytest.mark.usefixtures("columns_as_global")
def test_column_tiles_beyond_a_wave_where_the_sums_fit_nowhere_else() -> None:
    # fuzz graph 3301:691: a sum over the leading 2 of (2, 3136, 96), 301056 columns. Tiles
    # of 1024 columns are 294 tasks, more than the wave of 132, and 294 partial sums per
    # thread fit no registers: the group fell back. The persistent grid now walks the 294
    # tasks in rounds.
    built = model([helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
                   helper.make_node("Abs", ["s"], ["y"])],
                  {"x": [2, 3136, 96]}, {"y": [3136, 96]}, {"axes": np.array([0])})
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    assert (group.phases[0].tasks, group.phases[0].column_tiles) == (294, 294)
    assert group.launch.grid <= group.launch.wave
    assert not any(b.registers for b in group.buffers)
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_column_tiles_beyond_a_wave_only_when_asked() -> None:
    roles = Roles(kinds={"sum": BlockRole.COLUMN}, levels={"sum": 0}, widths={"sum": 301056})
    assert choose_tiles([294], roles, 2, 1024, 132, 2 * 301056) == (1, 1)
    assert choose_tiles([294], roles, 2, 1024, 132, 2 * 301056, beyond_wave=True) == (1, 294)
