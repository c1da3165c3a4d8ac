"""A row split over several blocks (task splitting) reads its inputs from global memory once:
each block stages its sub-row in shared memory in the first phase that reads it and keeps it
there across the grid barriers for the later phases. A block keeps its shared memory across a
grid barrier, and, with a task per block, its sub-row too. The SIMT runner runs these kernels
with the real barrier when the grid fits the work-groups PoCL runs at once, and otherwise as
phase kernels with the kept buffer spilled to global memory, a slice per work-group; both match
onnxruntime. Counted, the split softmax moves its compulsory bytes and little more, where the
re-reading split read its row once per phase (a traffic ratio of 2.0)."""

from __future__ import annotations

import functools

import pytest
import stitch_patterns as patterns
from stitch_helpers import (
    compile_cuda,
    spills,
    stack_frames,
    stitched_functions,
)

from tvm_stitch import analysis, pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.lowering import lower
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.schedule.task_split import aligned_part, split_options
from tvm_stitch.simt.grid import GridBarriers
from tvm_stitch.target import SIMT_CONCURRENT_BLOCKS, cuda_target, opencl_target
from tvm_stitch.testing.differential import check_model

CASES = {
    # name: (model, inputs kept on chip)
    "softmax_one_row": (lambda: patterns.softmax(1, 4096)[0], {"x"}),  # 8 tasks
    "softmax": (lambda: patterns.softmax(2, 4096)[0], {"x"}),  # 16 tasks
    "add_layer_norm": (lambda: patterns.add_layer_norm(2, 8192)[0], {"x", "res"}),
}


@functools.cache
def _compiled(case: str):
    model = CASES[case][0]()
    return model, pipeline.lower(import_model(model), cuda_target(), "stitch")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_split_row_keeps_its_inputs_on_chip_across_the_grid_barriers(case: str) -> None:
    model, scheduled = _compiled(case)
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and len(plan.groups) == 1, str(plan)
    (group,) = plan.groups
    assert group.row_split > 1 and group.grid_barriers, str(plan)
    assert {b.name for b in group.buffers if b.across_barriers} == CASES[case][1], str(plan)
    assert group.launch.grid >= max(p.tasks for p in group.phases), "a task per block"
    report = analysis.analyze(scheduled)
    assert report.dram_bytes <= 1.01 * report.compulsory_bytes, report.to_dict()
    assert verify.run_simt(scheduled, model).ok


def test_the_split_softmax_reads_its_row_once() -> None:
    """2.0 with a re-read per phase (max, sum, normalise) of 3 reads and a write."""
    report = analysis.analyze(_compiled("softmax")[1]).to_dict()
    assert report["traffic_ratio"] <= 1.05, report


def test_a_grid_larger_than_pocl_runs_is_split_with_the_kept_buffer_spilled() -> None:
    _, scheduled = _compiled("softmax")
    (func,) = stitched_functions(scheduled).values()
    lowered = lower(func, "k", opencl_target())
    barriers = GridBarriers(lowered)
    (kernel,) = barriers.phases
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.launch.grid > SIMT_CONCURRENT_BLOCKS
    assert len(barriers.phases[kernel]) == group.grid_barriers + 1, barriers.reasons
    (spill,) = barriers.spills[kernel]
    assert spill.name == "x_shared" and spill.nbytes == 2 * 4096 * 4


@pytest.mark.parametrize("case", ["softmax", "add_layer_norm"])
def test_the_differential_check_passes(case: str) -> None:
    outcome = check_model(CASES[case][0](), "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kept_kernels_compile_without_spills(arch: str) -> None:
    for case in ("softmax", "add_layer_norm"):
        for name, func in stitched_functions(_compiled(case)[1]).items():
            report = compile_cuda(lower(func, name, cuda_target(arch)).source(), arch)
            found = spills(report)
            assert found and all(s == (0, 0) for s in found), report
            assert all(frame == 0 for frame in stack_frames(report)), report


def test_a_sub_row_larger_than_the_shared_budget_is_read_again_in_each_phase() -> None:
    """Rows of 60000 split in 4 on 512 threads: a sub-row of 15000 floats (60 KB) does not
    fit a block's 48 KB, so nothing is kept, and the split reads its row once per phase:
    twice, as an online softmax has two phases (the two passes would read it three times: a
    ratio of 2.0)."""
    with choosing(FixedChoices(Choices(split_parts=4, threads_per_row=512))):
        scheduled = pipeline.lower(import_model(patterns.softmax(64, 60000)[0]),
                                   cuda_target(), "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.row_split == 4 and not any(b.across_barriers for b in group.buffers)
    assert group.shared_bytes <= group.shared_budget
    assert group.online and group.grid_barriers == 1, group
    assert analysis.analyze(scheduled).traffic_ratio == pytest.approx(1.5, abs=0.01)


def test_the_rules_take_the_block_size_whose_sub_rows_stay_on_chip() -> None:
    """Left to the rules, the same rows split at 256 threads per block, whose wave holds 10
    parts of 6000 floats (24 KB): kept on chip, the row is read once."""
    scheduled = pipeline.lower(import_model(patterns.softmax(64, 60000)[0]), cuda_target(),
                               "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.row_split == 10 and group.launch.threads == 256, group
    assert {b.name for b in group.buffers if b.across_barriers} == {"x"}
    assert analysis.analyze(scheduled).traffic_ratio <= 1.01


def test_sub_rows_are_boxes_of_the_row() -> None:
    # a group normalisation's row of (10 channels, 64, 64): halves (5 channels) and fifths
    # (2 channels) are boxes, quarters (2.5 channels) are not, nor is anything that leaves a
    # block's shorter row of 16 elements unevenly split
    row = (10, 64, 64)
    assert aligned_part(20480, row) and aligned_part(8192, row) and aligned_part(4096, row)
    assert not aligned_part(10240, row) and not aligned_part(5120, row)
    assert aligned_part(2048, row) and aligned_part(32, row) and not aligned_part(96, row)
    assert split_options(32, 40960, 264, 512, (row,)) == [2, 5]  # 4 and 8: not boxes
    assert split_options(4, 65536, 264, 512, ((16, 64, 64), (16,))) == [2, 4, 8, 16]
    assert split_options(64, 30000, 264, 512) == [2, 3, 4]  # a 1-D row splits anywhere
