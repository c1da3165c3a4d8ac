"""Statistics over the channels of NCHW tensors, normalised and written back in place: one
kernel.

Written with explicit transposes, or as reductions over (N, H, W) that ``mixed_reductions``
rewrites over a channel-first view, their element-wise readers sunk to the view's rows
(``mixed_reduction._sinks``).

A batch norm reduces every axis but the channels'. Over a channel-first view (C, N, H, W) of
its input it is a row reduction per channel, and its normalised result, transposed back to
(N, C, H, W), moves runs of H x W elements: shorter than the rows, so the transpose back
could not join the row group, and was a kernel of its own. As the last op of the kernel it
is a permuted write (``grouping._permuted_sink``, ``schedule.row_permutation``): one kernel
where TVM's flow takes five."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.graph import grouping
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads import registry


def _channel_first_batch_norm(shape: list[int]):
    """x (N, C, H, W) transposed to (C, N, H, W), normalised per channel, transposed back."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2, 3]),
             helper.make_node("ReduceMean", ["xt", "axes"], ["m"], keepdims=1),
             helper.make_node("Sub", ["xt", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("ReduceMean", ["d2", "axes"], ["v"], keepdims=1),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["yt"]),
             helper.make_node("Transpose", ["yt"], ["y"], perm=[1, 0, 2, 3])]
    return model(nodes, {"x": shape}, {"y": shape},
                 {"axes": np.array([1, 2, 3], np.int64), "eps": np.array(1e-5, np.float32)})


@pytest.mark.parametrize("shape", [[8, 64, 28, 28], [2, 96, 7, 7]])
def test_a_channel_first_batch_norm_is_one_kernel(shape: list[int]) -> None:
    (group,) = _one_kernel(_channel_first_batch_norm(shape)).groups
    assert group.permuted_outputs, group


def _one_kernel(built) -> StitchPlan:
    """The plan of ``built``, after checking that it is one kernel where TVM's flow takes
    more, moving less than half of their bytes, and right on the SIMT runner."""
    scheduled = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and len(plan.groups) == 1 and not plan.notes, plan
    stitch = verify.summarize(scheduled, built)
    baseline = verify.summarize(verify.compile_model(built, "baseline"), built)
    assert stitch["kernels"] == 1 < baseline["kernels"], (stitch, baseline)
    assert stitch["global_bytes"] < baseline["global_bytes"] / 2, (stitch, baseline)
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    return plan


def _batch_norm_statistics(shape: list[int]):
    """x (N, C, H, W) normalised by its mean and variance over (N, H, W), as explicit ops."""
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("ReduceMean", ["d2", "axes"], ["v"], keepdims=1),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["y"])]
    return model(nodes, {"x": shape}, {"y": shape, "m": [1, shape[1], 1, 1]},
                 {"axes": np.array([0, 2, 3], np.int64), "eps": np.array(1e-5, np.float32)})


@pytest.mark.parametrize("shape", [[8, 64, 28, 28], [4, 32, 7, 7]])
def test_a_batch_norm_over_mixed_axes_sinks_into_one_kernel(shape: list[int]) -> None:
    # the statistics reduce mixed axes: over a transposed view (``mixed_reductions``) they
    # were one kernel, the normalisation another, reading x again. Sunk, the subtraction,
    # the square, the division are applied to the channels' rows, and the result is
    # transposed back as the kernel's permuted write; the mean, a graph output, is a view
    _one_kernel(_batch_norm_statistics(shape))


def test_reductions_that_do_not_stitch_sunk_are_rewritten_unsunk(monkeypatch) -> None:
    # with no permuted write, the sunk form cannot be one kernel: the reductions are
    # rewritten over transposed views as before, the normalisation left to its own kernel
    monkeypatch.setattr(grouping, "_permuted_sink", lambda *_: False)
    built = _batch_norm_statistics([4, 32, 7, 7])
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert any(n.startswith("reductions not sunk") for n in plan.notes), plan
    assert not any(n.startswith("kept as imported") for n in plan.notes), plan
    assert any(op.startswith("reduce_view") for g in plan.groups for op in g.ops), plan
    outcome = check_model(built, "stitch", cost=True)
    assert outcome.kind == "ok" and not outcome.costlier, (outcome.error, outcome.costlier)


def test_a_training_batch_norm_and_its_relu_are_one_kernel() -> None:
    # the micro workload: a training-mode BatchNormalization (rewritten by the front end)
    # and a ReLU over (8, 32, 14, 14), its running statistics computed in the same kernel
    plan = _one_kernel(registry.get("batchnorm_nchw_train").model("ci"))
    assert any(":relu" in op for op in plan.groups[0].ops), plan
