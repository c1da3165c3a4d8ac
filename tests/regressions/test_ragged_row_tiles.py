"""A Global group's row tiles need not divide its rows: the last one may be short.

A vision transformer has 197 tokens a row at 224 x 224 (577 at 384 x 384), both prime. Row
tiles had to divide the rows, so such a group took one tile per row (a partial sum per row
and column, which no wave holds) or fell back: the LayerNorm backward over (197, 768),
dgamma and dbeta beside the row sums of dx, fell back with "197 rows do not split into about
one wave of 24 tiles": 3 kernels, 4.2 MB, estimated at 109 us where TVM's flow takes 29.9; a
batch norm in training over (197, 768) was left to TVM whole. Ragged tiles
(``tiles.ragged_tiles``) walk ``ceil(rows / tiles)`` rows each, the last tile's rows past the
end guarded as those of a run-time row count (``transform.guarded_updates``, which now also
guards a pair's update: an online softmax's maximum and sum). The rules take them where the
kernel in tiles that divide the rows does not build or is estimated slower, or no faster
and moving more bytes, or, over at most ``tiles.SMALL_GLOBAL_ELEMENTS`` elements, faster by
less than ``TIME_MARGIN`` and moving more bytes (``decisions._even_or_ragged``); the
candidate space offers the other (``ragged_tiles``).
Owners: schedule/decisions/global_stitch.py, schedule/decisions/tiles.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.space import choice_space
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.workloads import micro

TARGET = "cuda:sm_90"


def _one_ragged_kernel(built, tiles: int, steps: int):
    scheduled = verify.compile_model(built, "stitch", TARGET)
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert (group.mapping.row_tiles, group.mapping.row_steps) == (tiles, steps), group.mapping
    assert (tiles - 1) * steps < group.mapping.rows < tiles * steps, group.mapping
    return group, analyze(scheduled), analyze(verify.compile_model(built, "baseline", TARGET))


@pytest.mark.parametrize("build", [micro.layernorm_backward, micro.batchnorm_train],
                         ids=["layernorm_backward", "batchnorm_train"])
def test_vit_token_rows_stitch_in_ragged_tiles(build) -> None:
    built = build((197, 768))
    _, stitched, tvm = _one_ragged_kernel(built, 22, 9)
    assert len(stitched.kernels) == 1 < len(tvm.kernels)
    assert stitched.global_bytes < 0.5 * tvm.global_bytes
    assert stitched.roofline_us()["H200"] < tvm.roofline_us()["H200"]
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_column_softmax_over_prime_rows_keeps_its_online_pair_in_ragged_tiles() -> None:
    # (4099, 64): two passes over ragged tiles took 5 phases and 4 grid barriers, estimated
    # at 15.4 us; the pair's guarded update gives 3 phases, 2 barriers
    built = model([helper.make_node("Softmax", ["x"], ["y"], axis=0)], {"x": [4099, 64]},
                  {"y": [4099, 64]})
    group, stitched, tvm = _one_ragged_kernel(built, 456, 9)
    assert group.online and len(group.phases) == 3, group
    assert stitched.roofline_us()["H200"] <= tvm.roofline_us()["H200"]
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_ragged_tiles_estimated_as_fast_and_moving_fewer_bytes_are_taken() -> None:
    # fuzz graph 12041:277: a softmax down the 257 rows of tanh(x), (257, 2) float16. Both
    # kernels sit at the launch floor (6.6 us estimated); the even one, 257 tiles of one row,
    # moved 17,492 B where TVM's three kernels move 8,224 B; 29 ragged tiles of 9 rows move
    # 7,576 B
    built = model([helper.make_node("Tanh", ["x"], ["t"]),
                   helper.make_node("Softmax", ["t"], ["y"], axis=0)], {"x": [257, 2]},
                  {"y": [257, 2]}, elem_type=TensorProto.FLOAT16)
    _, stitched, tvm = _one_ragged_kernel(built, 29, 9)
    assert stitched.global_bytes < tvm.global_bytes
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_small_ragged_tiles_estimated_a_little_slower_and_moving_fewer_bytes_are_taken(
        ) -> None:
    # fuzz graph 12044:80: a log-softmax down the 257 rows of (257, 3) beside element-wise
    # outputs. The even kernel, 257 tiles of one row (a tile of 257 rows would keep 257
    # elements of x a thread in registers), moved 43,200 B where TVM's three kernels move
    # 27,756 B, estimated at 6.6 us; 29 ragged tiles of 9 rows move 27,132 B at 7.1 us
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["h"]),
             helper.make_node("Pow", ["h", "power"], ["p"]),
             helper.make_node("Add", ["x", "bias"], ["b"]),
             helper.make_node("LogSoftmax", ["x"], ["y"], axis=0)]
    built = model(nodes, {"x": [257, 3]}, {"p": [257, 3], "b": [257, 3], "y": [257, 3]},
                  {"half": np.array(0.5, np.float32), "power": np.array(1.5, np.float32),
                   "bias": np.array([-1.0, 0.0, 1.0], np.float32)})
    _, stitched, tvm = _one_ragged_kernel(built, 29, 9)
    assert stitched.global_bytes < tvm.global_bytes
    with choosing(FixedChoices(Choices(ragged_tiles=False))):
        even = analyze(verify.compile_model(built, "stitch", TARGET))
    assert even.global_bytes > tvm.global_bytes
    assert even.roofline_us()["H200"] < stitched.roofline_us()["H200"]
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def _global_task(rows: int):
    (task,) = extract_tasks(import_model(micro.layernorm_backward((rows, 768))), TARGET)
    return task


def test_ragged_tiles_are_a_choice_of_the_candidate_space() -> None:
    task = _global_task(197)
    rules = decide(task.func, task.group, task.rows, task.target).group
    assert rules.mapping.row_tiles == 22
    assert Choices(ragged_tiles=False) in choice_space(rules, 1024)
    with pytest.raises(Unstitchable, match="197 rows do not split"):
        decide(task.func, task.group, task.rows, task.target, Choices(ragged_tiles=False))


def test_rows_a_divisor_splits_take_no_ragged_tiles() -> None:
    task = _global_task(192)
    assert not decide(task.func, task.group, task.rows, task.target).group.mapping.row_tiles
    with pytest.raises(Unstitchable, match="no ragged row tiles: 192 rows"):
        decide(task.func, task.group, task.rows, task.target, Choices(ragged_tiles=True))


def test_a_long_row_walk_keeps_one_row_of_its_row_results() -> None:
    # fuzz graph 12035:233 (shrunk): a softmax down the 257 rows of the row minima of
    # (257, 31), beside a softmax along them. In one tile of 257 rows (the even choice; the
    # rules take ragged tiles) the row reductions' results in registers were sized for every
    # row of the walk: arrays of 257 elements a thread, over the plan's register budget
    nodes = [helper.make_node("Max", ["x", "s"], ["m"]),
             helper.make_node("ReduceMin", ["m", "axes"], ["r"], keepdims=1),
             helper.make_node("Softmax", ["x"], ["y"], axis=-1),
             helper.make_node("ReduceMin", ["y", "all"], ["z"], keepdims=1),
             helper.make_node("Softmax", ["r"], ["c"], axis=0),
             helper.make_node("Relu", ["x"], ["u"])]
    built = model(nodes, {"x": [257, 31], "s": []}, {"z": [1, 1], "c": [257, 1], "u": [257, 31]},
                  {"axes": np.array([1], np.int64), "all": np.array([-2, -1], np.int64)})
    with choosing(FixedChoices(Choices(ragged_tiles=False))):
        plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
        outcome = check_model(built, "stitch", cost=True)
    assert any(g.mapping.row_steps == 257 for g in plan.groups), plan
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
