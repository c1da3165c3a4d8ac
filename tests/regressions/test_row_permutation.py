"""Layout moves of whole rows next to a normalisation stitch into its kernel
(``schedule.row_permutation``): a window partition after a LayerNorm writes each normalised
row to its window's place, a window reverse before a residual add and LayerNorm is read where
it lies. Both fell back ("block T_transpose reads T_reshape_intermediate from other rows"),
leaving two kernels; Swin's block had four such fallbacks per two layers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.space import choice_space

RNG = np.random.default_rng(0)


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def _model(nodes: list, x: list[int], y: list[int], consts: list[onnx.TensorProto],
           extra_inputs: dict[str, list[int]] | None = None,
           extra_outputs: dict[str, list[int]] | None = None) -> onnx.ModelProto:
    inputs = {"x": x, **(extra_inputs or {})}
    outputs = {"y": y, **(extra_outputs or {})}
    graph = helper.make_graph(
        nodes, "layout_move",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _layer_norm(src: str, dst: str, channels: int) -> tuple[onnx.NodeProto, list]:
    consts = [_const(f"{dst}_g", RNG.random(channels, np.float32) + 0.5),
              _const(f"{dst}_b", RNG.random(channels, np.float32))]
    return helper.make_node("LayerNormalization", [src, f"{dst}_g", f"{dst}_b"], [dst],
                            axis=-1, epsilon=1e-5), consts


def window_partition(batch: int, side: int, channels: int, window: int) -> onnx.ModelProto:
    """LayerNorm over (B, H*W, C), then Swin's window partition to (B*nW, w*w, C)."""
    n = side // window
    norm, consts = _layer_norm("x", "ln", channels)
    consts += [_const("s1", np.array([batch, n, window, n, window, channels], np.int64)),
               _const("s2", np.array([batch * n * n, window * window, channels], np.int64))]
    nodes = [norm, helper.make_node("Reshape", ["ln", "s1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["t", "s2"], ["y"])]
    return _model(nodes, [batch, side * side, channels],
                  [batch * n * n, window * window, channels], consts)


def window_reverse(batch: int, side: int, channels: int, window: int) -> onnx.ModelProto:
    """Swin's window reverse of (B*nW, w*w, C) to (B, H*W, C), a residual add, a LayerNorm;
    the sum is an output too."""
    n = side // window
    norm, consts = _layer_norm("sum", "y", channels)
    consts += [_const("s1", np.array([batch, n, n, window, window, channels], np.int64)),
               _const("s2", np.array([batch, side * side, channels], np.int64))]
    tokens = [batch, side * side, channels]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["t", "s2"], ["w"]),
             helper.make_node("Add", ["w", "skip"], ["sum"]), norm]
    return _model(nodes, [batch * n * n, window * window, channels], tokens, consts,
                  {"skip": tokens}, {"sum": tokens})


def _kernels(model: onnx.ModelProto, flow: str) -> tuple[int, int]:
    report = analyze(verify.compile_model(model, flow))
    return len(report.kernels), sum(k.traffic.global_bytes for k in report.kernels)


@pytest.mark.parametrize(("batch", "side", "channels", "window"), [
    (2, 14, 96, 7),
    (1, 56, 96, 7),  # Swin-T's first stage: 301,056 elements
])
def test_window_partition_after_layer_norm_is_one_kernel(batch: int, side: int, channels: int,
                                                         window: int) -> None:
    model = window_partition(batch, side, channels, window)
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    (group,) = plan.groups
    assert not plan.fallbacks and group.permuted_outputs
    assert {"T_reshape", "T_transpose"} <= set(group.permuted_copies)
    stitch, baseline = _kernels(model, "stitch"), _kernels(model, "baseline")
    assert (stitch[0], baseline[0]) == (1, 2) and stitch[1] < baseline[1], (stitch, baseline)
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_window_reverse_before_residual_layer_norm_is_one_kernel() -> None:
    model = window_reverse(2, 14, 96, 7)
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    (group,) = plan.groups
    assert not plan.fallbacks and not group.permuted_outputs
    assert {"T_reshape", "T_transpose"} <= set(group.permuted_copies)
    stitch, baseline = _kernels(model, "stitch"), _kernels(model, "baseline")
    assert stitch[0] == 1 < baseline[0] and stitch[1] <= baseline[1]
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_permuted_output_read_inside_the_kernel_is_not_stitched_wrong() -> None:
    # the window partition's output is also normalised again: a block reading it would read
    # rows that other blocks write
    model = window_partition(2, 14, 32, 7)
    norm, consts = _layer_norm("y", "z", 32)
    model.graph.node.append(norm)
    model.graph.initializer.extend(consts)
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 49, 32]))
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_transposed_row_read_inside_the_kernel_is_written_whole() -> None:
    # fuzz graph 5150:916 while shrinking: one row, a LayerNorm over all of (2, 32, 127),
    # transposed to (32, 2, 127) as an output that a Max also reads. Written at permuted
    # places into its on-chip copy, only 4128 of the 8128 values were (TVM bounded the loop
    # by a box of the permuted indices); such a copy is now not moved
    norm = helper.make_node("LayerNormalization", ["x", "g"], ["n"], axis=0)
    model = _model([norm, helper.make_node("Transpose", ["n"], ["y"], perm=[1, 0, 2]),
                    helper.make_node("Max", ["y", "m"], ["z"])],
                   [2, 32, 127], [32, 2, 127],
                   [_const("g", RNG.random((2, 32, 127), np.float32) + 0.5)],
                   extra_inputs={"m": [2, 1]}, extra_outputs={"z": [32, 2, 127]})
    plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
    assert not any(g.permuted_outputs for g in plan.groups), str(plan)
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_batch_norms_channel_rows_that_fit_on_chip_read_their_input_once() -> None:
    # A batch norm in training over (N, C, H, W) reduces each channel's N x H x W elements:
    # rows of a transposed view that keeps W innermost. Its transpose was inlined into the
    # mean and the normalisation, each reading x: twice (602,880 B at (8, 32, 14, 14)).
    # Kept as a block, the row is staged once (402,176 B); rows of (32, 64, 56, 56), 100,352
    # elements, fit on chip nowhere, and the transpose stays inlined (two reads, not three).
    from tvm_stitch.workloads import micro

    model = micro.batchnorm_nchw_train((8, 32, 14, 14))
    scheduled = verify.compile_model(model, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.transposed_copies, group
    (kernel,) = analyze(scheduled).kernels
    x = kernel.traffic.buffers["x"]
    assert x.read_bytes == x.size_bytes
    assert kernel.traffic.global_bytes == 402176
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    # the rules' choice is one of the space's: a tuner may inline the transpose again
    assert Choices(kept_transposes=False) in choice_space(group, 1024)
    with choosing(FixedChoices(Choices(kept_transposes=False))):
        inlined = verify.compile_model(model, "stitch")
        outcome = check_model(model, "stitch", triage=False)
    assert not StitchPlan.of_module(inlined).groups[0].transposed_copies
    (kernel,) = analyze(inlined).kernels
    assert kernel.traffic.global_bytes == 602880
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    real = verify.compile_model(micro.batchnorm_nchw_train((32, 64, 56, 56)), "stitch")
    (group,) = StitchPlan.of_module(real).groups
    assert not group.transposed_copies
    (kernel,) = analyze(real).kernels
    assert kernel.traffic.buffers["x"].read_bytes == 2 * kernel.traffic.buffers["x"].size_bytes
