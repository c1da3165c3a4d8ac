"""Kernels with a grid barrier are launched cooperatively (TVM's ``tirx.use_cooperative_launch``
launch parameter, which its CUDA runtime launches with ``cuLaunchCooperativeKernel``), so a
grid that cannot be resident at once is refused by the driver instead of hanging; kernels
without one are launched as usual."""

from __future__ import annotations

import pytest
from tvm import tirx

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.lowering import COOPERATIVE_TAG, lower
from tvm_stitch.plan import GROUP_ATTR, StitchPlan
from tvm_stitch.target import parse_target
from tvm_stitch.workloads import micro

TARGET = parse_target("cuda:sm_90")


@pytest.mark.parametrize(("model", "barriers"), [
    (micro.layernorm_backward((256, 128)), True),
    (micro.softmax((8, 8192)), True),  # task splitting
    (micro.softmax((64, 256)), False),
])
def test_a_kernel_with_grid_barriers_launches_cooperatively(model, barriers: bool) -> None:
    scheduled = pipeline.lower(import_model(model), TARGET, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert bool(group.grid_barriers) is barriers
    (func,) = [f for _, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc)
               and f.attrs is not None and GROUP_ATTR in f.attrs]
    lowered = lower(func, "k", TARGET)
    assert [launch.cooperative for launch in lowered.launches] == [barriers]
    for _, device in lowered.device.functions_items():
        assert (COOPERATIVE_TAG in [str(t) for t in device.attrs["tirx.kernel_launch_params"]]) \
            is barriers
    assert verify.run_simt(scheduled, model).ok
    pipeline.build(scheduled, TARGET)
