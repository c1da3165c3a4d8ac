"""An input staged per row and read at permuted rows is staged one row per block.

Fuzz graph 6613:191 (large 0.05, float16): a LayerNorm of a transposed (500, 2, 3) came out
2.1 from onnxruntime. Its rows of 3 were packed 2 per block, and the block staged its input
``x`` read at 5 places of a permuted row; the two rows of a block lie apart in ``x``, so TVM
staged the box around them (3 rows) with its row loop bound to threadIdx.y, of which the
block has 2: one row was never staged. Rows of such an input are now one per block
(schedule/decisions/rows.py, ``_one_permuted_row``), or, where a tuner fixes the rows per
block, the input is re-read from global memory; and emission refuses a block computed at a
row step that covers more rows than the block has (schedule/emit.py, ``_bind_at_step``).
The same box made a window reverse before a Swin LayerNorm (96 channels) ask for 2.2 MB of
shared memory and fall back; it stitches now.

Fuzz graph 10007:419: ``x`` read transposed (a column mean of it) and as it is (``x + s``) in
one Global group was staged as one permuted row: the two readers want two different rows of
``x`` at each row of the group, and the transposed output came out 0.36 from onnxruntime.
Staging now needs every reader at the same row of the input
(schedule/rows.py, ``same_permuted_rows``); else the input is re-read."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, DemotionKind, StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.tasks import extract_tasks


def _level(group, name: str) -> StorageLevel:
    (level,) = {b.level for b in group.buffers if b.name == name}
    return level


def _transposed_layer_norm(shape: list[int], elem_type: int = TensorProto.FLOAT):
    dtype = np.float16 if elem_type == TensorProto.FLOAT16 else np.float32
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("LayerNormalization", ["t", "g"], ["y"], axis=2)]
    return model(nodes, {"x": shape}, {"y": [shape[1], shape[0], shape[2]]},
                 {"g": np.linspace(0.5, 1.5, shape[2]).astype(dtype)}, elem_type=elem_type)


def _window_reverse_layer_norm(channels: int, window: int, windows: int):
    tokens = windows * windows * window * window
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["t", "s2"], ["r2"]),
             helper.make_node("LayerNormalization", ["r2", "g"], ["y"], axis=2)]
    return model(nodes, {"x": [windows * windows, window * window, channels]},
                 {"y": [1, tokens, channels]},
                 {"s1": np.array([1, windows, windows, window, window, channels], np.int64),
                  "s2": np.array([1, tokens, channels], np.int64),
                  "g": np.linspace(0.5, 1.5, channels).astype(np.float32)})


@pytest.mark.parametrize("shape,elem_type", [([500, 2, 3], TensorProto.FLOAT16),
                                             ([256, 2, 3], TensorProto.FLOAT),
                                             ([500, 2, 32], TensorProto.FLOAT)])
def test_a_layer_norm_of_a_transpose_stages_one_permuted_row_per_block(
        shape: list[int], elem_type: int) -> None:
    # the rules keep the transpose as a block (below); inlined, x is staged permuted
    built = _transposed_layer_norm(shape, elem_type)
    with choosing(FixedChoices(Choices(kept_transposes=False))):
        plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
        outcome = check_model(built, "stitch")
    (group,) = plan.groups
    assert group.mapping.rows_per_block == 1, group
    assert any(d.kind is DemotionKind.ONE_PERMUTED_ROW for d in group.demotions), group
    assert _level(group, "x") is StorageLevel.SHARED, group
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.parametrize("shape,elem_type,kept,inlined", [
    ([500, 2, 3], TensorProto.FLOAT16, 15000, 24000),
    ([500, 2, 32], TensorProto.FLOAT, 320000, 512000)])
def test_a_layer_norm_of_a_kept_transpose_packs_rows_and_reads_gamma_less(
        shape: list[int], elem_type: int, kept: int, inlined: int) -> None:
    # kept as a block the transpose reads each row of x once, into the rows the block packs;
    # inlined, one permuted row per block reads gamma once per row
    built = _transposed_layer_norm(shape, elem_type)
    scheduled = verify.compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.transposed_copies and group.mapping.rows_per_block > 1, group
    assert verify.summarize(scheduled, built)["global_bytes"] == kept
    with choosing(FixedChoices(Choices(kept_transposes=False))):
        unkept = verify.compile_model(built, "stitch")
    assert verify.summarize(unkept, built)["global_bytes"] == inlined
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_rows_per_block_a_tuner_fixes_re_read_the_permuted_input() -> None:
    built = _transposed_layer_norm([256, 2, 3])
    (task, *_) = extract_tasks(import_model(built), "cuda:sm_90")
    choices = Choices(rows_per_block=2, kept_transposes=False)
    group = decide(task.func, task.group, task.rows, task.target, choices).group
    assert group.mapping.rows_per_block == 2, group
    assert _level(group, "x") is StorageLevel.GLOBAL, group
    assert any(d.kind is DemotionKind.PERMUTED_REREAD for d in group.demotions), group
    with choosing(FixedChoices(choices)):
        outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_window_reverse_before_a_layer_norm_stitches() -> None:
    built = _window_reverse_layer_norm(96, 7, 4)
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks and len(plan.groups) == 1, plan
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_an_input_read_transposed_and_as_it_is_is_not_staged_as_one_row() -> None:
    nodes = [helper.make_node("Add", ["x", "s"], ["a"]),
             helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("ReduceMean", ["t", "axes"], ["y"], keepdims=0)]
    built = model(nodes, {"x": [8, 8, 256], "s": []},
                  {"y": [256], "t": [8, 8, 256], "a": [8, 8, 256]},
                  {"axes": np.array([0, 1], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    (group,) = plan.groups
    assert _level(group, "x") is StorageLevel.GLOBAL, str(plan)
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok", outcome.error
