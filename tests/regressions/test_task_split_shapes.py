"""Task splitting lays out intermediates of any shape as sub-rows.

Fuzz graphs 4242:9 and :13: a LayerNormalization over axis -2 of (1000, 31) (one row of
31000) and over axis 0 of a (2, 32, 4, 255) broadcast (two rows of 65280) fell back: task
splitting refused "intermediate T_layer_norm_intermediate [1000, 31] is not laid out as 1
rows of 31000", and a block per row needs more registers than a thread has. Split rows now
take intermediates whose row-major layout is the rows, whatever their shape
(schedule/task_split.py). The combinations of split rows are checked too (fuzz graphs
4242:1223 and :1236)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import BufferRole, Choices, StitchPlan
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.testing.differential import check_model


def _split_and_right(built, choices: Choices | None = None) -> None:
    """``built`` stitches as one task-split group that matches onnxruntime on the SIMT runner
    and passes the ptxas checks (with ``choices`` fixed, if given)."""
    with choosing(FixedChoices(choices or Choices())):
        plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
        assert not plan.fallbacks, plan
        (group,) = plan.groups
        assert group.row_split > 1, group
        outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_layer_norm_over_two_axes_of_one_long_row_is_split() -> None:
    shape = [1000, 31]
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["n"], axis=-2),
             helper.make_node("Relu", ["n"], ["y"])]
    built = model(nodes, {"x": shape}, {"y": shape},
                  {"g": np.linspace(0.5, 1.5, 31000, dtype=np.float32).reshape(shape)})
    _split_and_right(built)


def test_an_output_read_inside_a_split_row_is_copied_as_sub_rows() -> None:
    # fuzz graphs 4242:118 and :296: a LayerNormalization over a whole (128, 255) tensor of a
    # pow that is also an output; the output's on-chip copy iterated (128, 255), not the
    # sub-rows ("block T_power_intermediate_shared does not iterate over the 51 rows
    # first"), and a block per row needed more registers than a thread has
    shape = [128, 255]
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Pow", ["a", "e"], ["p"]),
             helper.make_node("LayerNormalization", ["p", "g"], ["n"], axis=0),
             helper.make_node("Min", ["p", "n"], ["y"])]
    built = model(nodes, {"x": shape}, {"p": shape, "y": shape},
                  {"e": np.array(1.5, np.float32),
                   "g": np.linspace(0.5, 1.5, 128 * 255, dtype=np.float32).reshape(shape)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.row_split > 1 and any(b.role is BufferRole.OUTPUT for b in group.buffers), group
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_split_row_reduced_to_one_value_keeps_its_combination_a_reduction() -> None:
    # fuzz graph 4242:1223: a LayerNormalization over (3, 4097) reshaped to (1, 3, 4097),
    # next to exp(tanh(x)): the combination of the split sums loaded ``sum[0]`` where it
    # stored ``sum[v]`` (a row of one element), no reducer matched, and the block per row
    # it gave way to spilled 8 B on sm_80
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Exp", ["t"], ["e"]),
             helper.make_node("LayerNormalization", ["r", "g"], ["n"], axis=1)]
    built = model(nodes, {"x": [3, 4097]}, {"e": [3, 4097], "n": [1, 3, 4097]},
                  {"s": np.array([1, 3, 4097], np.int64),
                   "g": np.linspace(0.5, 1.5, 3 * 4097, dtype=np.float32).reshape(3, 4097)})
    _split_and_right(built)


def test_a_combination_read_by_two_blocks_runs_as_float16_on_the_simt_runner() -> None:
    # fuzz graph 4242:1236: a float16 LayerNormalization over one row of 2048, then a
    # softmax of it in float32: the split variance's combination gets a copy per reader,
    # declared with decl_buffer's default layout, which makes a one-element buffer a scalar;
    # TVMScript printed its write-back as ``X.source[0]`` and the SIMT runner's float16
    # retyping could not parse it back (a crash of ours; the CUDA build was fine). In one
    # pass (an online variance) the row is read twice by one block, and not split: the
    # split's two passes are chosen here
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=1),
             helper.make_node("Cast", ["n"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Softmax", ["c"], ["s"], axis=1),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT16)]
    built = model(nodes, {"x": [1, 2048]}, {"y": [1, 2048]},
                  {"g": np.linspace(0.5, 1.5, 2048, dtype=np.float16),
                   "b": np.linspace(-0.5, 0.5, 2048, dtype=np.float16)},
                  elem_type=TensorProto.FLOAT16)
    _split_and_right(built, Choices(online_variance=False))


def _transposed_beside_a_layer_norm(shape: list[int]):
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("Log", ["b"], ["l"]),
             helper.make_node("Transpose", ["b"], ["t"], perm=[1, 0]),
             helper.make_node("LayerNormalization", ["a", "g"], ["n"], axis=0)]
    return model(nodes, {"x": shape}, {"l": shape, "t": shape[::-1], "n": shape},
                 {"half": np.array(0.5, dtype=np.float32),
                  "g": np.linspace(0.5, 1.5, shape[0] * shape[1], dtype=np.float32)
                  .reshape(shape)})


def test_a_transpose_inside_a_split_row_recomputes_what_it_reads_across_sub_rows() -> None:
    # Fuzz graph 8111:151 (shrunk): Transpose(Abs(x) + 0.5) beside a LayerNorm over all of x
    # (one row of 2048, split over 2 blocks). Abs(x) + 0.5 was kept in each block's shared
    # memory, and the transpose, whose sub-row of the output takes a column of every sub-row
    # of x, read the other block's part of it from its own (max error 3.9, stitch only). It
    # is recomputed from x in global memory, or the row is not split.
    outcome = check_model(_transposed_beside_a_layer_norm([16, 128]), "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    _split_and_right(_transposed_beside_a_layer_norm([64, 512]))
