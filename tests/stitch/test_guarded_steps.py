"""Row steps that do not divide a block's row groups: the last block walks fewer, guarded,
so the grid fills one wave of the GPU instead of following the divisors of the row count
(issue 13, part 4). 750000 rows of 32 took 625 blocks walking 75 steps (0.47 waves, as 75 is
the least divisor of the 46875 row groups that fits one wave); they now take 1303 blocks of
36 steps (0.99 waves)."""

from __future__ import annotations

import pytest

from tvm_stitch import pipeline
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads import micro


def test_a_row_reduction_fills_one_wave_with_a_guarded_last_block() -> None:
    scheduled = pipeline.lower(import_model(micro.row_sum((750000, 32))), "cuda:sm_90",
                               flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    mapping, launch = group.mapping, group.launch
    groups = mapping.rows // mapping.rows_per_block
    assert groups % mapping.row_steps, "the steps do not divide the row groups"
    assert launch.grid == mapping.blocks == -(-groups // mapping.row_steps)
    assert launch.wave * 0.95 <= launch.grid <= launch.wave, launch


@pytest.mark.parametrize("build,shape", [(micro.softmax, (30032, 32)),
                                         (micro.row_sum, (30032, 32)),
                                         (micro.rms_norm, (3001, 256))])
def test_the_last_blocks_fewer_steps_are_right(build, shape) -> None:
    model = build(shape)
    (group,) = StitchPlan.of_module(pipeline.lower(import_model(model), "cuda:sm_90",
                                                   flow="stitch")).groups
    mapping = group.mapping
    assert mapping.row_steps > 1
    assert mapping.rows % (mapping.rows_per_block * mapping.row_steps), "a partial last block"
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks and not outcome.violations, (
        outcome.error, outcome.violations)
