"""Statistics over the channels of NCHW tensors, normalised and written back in place: one
kernel.

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
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model


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
    built = _channel_first_batch_norm(shape)
    scheduled = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and len(plan.groups) == 1, plan
    (group,) = plan.groups
    assert group.permuted_outputs, group
    stitch = verify.summarize(scheduled, built)
    baseline = verify.summarize(verify.compile_model(built, "baseline"), built)
    assert stitch["kernels"] == 1 and baseline["kernels"] == 5, (stitch, baseline)
    assert stitch["global_bytes"] < baseline["global_bytes"] / 2, (stitch, baseline)
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
