"""Thread-block clusters (issue 13 part 2): a row split over several blocks combines its
partials through distributed shared memory and cluster barriers, not global memory and grid
barriers. Each kernel runs on the SIMT runner (a cluster as one work-group) against
onnxruntime, and compiles with nvcc for sm_90 with its cluster size in the kernel
(``__cluster_dims__``), without spills or stack. Counted, it moves no partials through
global memory and needs no barrier state; sm_80 never gets clusters."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import stitch_patterns as patterns
from stitch_helpers import compile_cuda, module_cuda_source, spills, stack_frames
from test_float16_vectors import _model as float16_model

from tvm_stitch import analysis, pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.cluster import CLUSTER_SYNC, with_cluster_dims
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.decisions.choosing import FixedChoices, Task, choosing
from tvm_stitch.schedule.grid_barrier import GRID_SYNC
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.target import cuda_target
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.tuning.space import choice_space
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.workloads import micro

CASES = {
    # name: (model, choices, parts per row, blocks per cluster)
    "softmax_64x30000": (lambda: patterns.softmax(64, 30000)[0], Choices(cluster=4), 4, 4),
    "softmax_two_rows_a_cluster": (lambda: patterns.softmax(2, 4096)[0],
                                   Choices(split_parts=4, cluster=8), 4, 8),
    "add_layer_norm": (lambda: patterns.add_layer_norm(2, 8192)[0],
                       Choices(split_parts=8, cluster=8), 8, 8),
    "rms_norm": (lambda: patterns.rms_norm(4, 16384)[0], Choices(cluster=8), 8, 8),
    "layer_norm_float16": (lambda: float16_model("ln", [2, 16384]),
                           Choices(split_parts=8, cluster=8), 8, 8),
    "softmax_float16": (lambda: float16_model("softmax", [2, 16384]),
                        Choices(split_parts=4, cluster=4), 4, 4),
}


@functools.cache
def _model(case: str):
    return CASES[case][0]()  # once: the patterns draw their weights afresh on each call


@functools.cache
def _compiled(case: str, clusters: bool = True):
    _, choices, parts, _ = CASES[case]
    with choosing(FixedChoices(choices if clusters else Choices(split_parts=parts))):
        return pipeline.lower(import_model(_model(case)), cuda_target(), "stitch")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cluster_kernel_matches_onnxruntime(case: str) -> None:
    scheduled = _compiled(case)
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and len(plan.groups) == 1, str(plan)
    (group,) = plan.groups
    _, _, parts, size = CASES[case]
    assert (group.row_split, group.cluster) == (parts, size), str(plan)
    assert len(group.phases) > 1 and group.grid_barriers == 0, str(plan)
    assert "cluster barrier" in str(plan)
    assert StitchPlan.from_json(plan.to_json()) == plan  # the cluster is in the record
    assert verify.run_simt(scheduled, _model(case)).ok


@pytest.mark.parametrize("case", sorted(CASES))
def test_partials_stay_on_chip(case: str) -> None:
    """No partial and no barrier state in global memory: the kernel's only parameters are
    the group's inputs and outputs, and it counts no more bytes than the grid-barrier split
    in as many parts."""
    clustered, split = _compiled(case), _compiled(case, clusters=False)
    (group,) = StitchPlan.of_module(clustered).groups
    (func,) = [f for gv, f in clustered.functions.items() if gv.name_hint == group.function]
    assert len(func.params) == len(group.inputs) + len(group.outputs), func.params
    with_clusters, with_grid = analysis.analyze(clustered), analysis.analyze(split)
    assert len(with_clusters.kernels) == len(with_grid.kernels) == 1
    assert with_clusters.global_bytes <= with_grid.global_bytes
    assert with_clusters.dram_bytes == with_clusters.compulsory_bytes


def test_the_long_softmax_reads_its_rows_once() -> None:
    report = analysis.analyze(_compiled("softmax_64x30000"))
    assert report.traffic_ratio <= 1.05, report.to_dict()


@pytest.mark.nvcc
def test_cluster_kernels_compile_for_sm_90_with_their_size() -> None:
    for case in sorted(CASES):
        source = module_cuda_source(_compiled(case), "sm_90")
        size = CASES[case][3]
        assert f"__cluster_dims__({size}, 1, 1)" in source
        assert CLUSTER_SYNC in source and GRID_SYNC not in source
        report = compile_cuda(source, "sm_90")
        found = spills(report)
        assert found and all(s == (0, 0) for s in found), report
        assert set(stack_frames(report)) == {0}, report


@pytest.mark.nvcc
def test_resource_checks_take_cluster_kernels_on_sm_90_alone() -> None:
    report = check_resources(_compiled("softmax_two_rows_a_cluster"))
    assert {k.arch for k in report.kernels} == {"sm_90"}
    assert not report.violations, report.violations


def _task(arch: str) -> Task:
    mod = import_model(patterns.softmax(64, 30000)[0])
    (task,) = extract_tasks(mod, cuda_target(arch))
    return task


def test_sm_80_gets_no_clusters() -> None:
    task = _task("sm_80")
    with pytest.raises(Unstitchable, match="no thread-block clusters"):
        decide(task.func, task.group, task.rows, task.target, Choices(cluster=4))
    rules = decide(task.func, task.group, task.rows, task.target).group
    assert rules.row_split > 1
    assert not any(c.cluster for c in choice_space(rules, 1024, clusters=False))


def test_the_space_offers_clusters_of_whole_rows_on_sm_90() -> None:
    task = _task("sm_90")
    rules = decide(task.func, task.group, task.rows, task.target).group
    assert rules.cluster == 1, "the rules keep the grid barrier until a GPU has measured"
    offered = [c for c in choice_space(rules, 1024, clusters=True) if c.cluster]
    assert offered and all(c.cluster % c.split_parts == 0 and c.cluster <= 8
                           for c in offered)


@pytest.mark.parametrize("shape, choices, why", [
    ((64, 30000), Choices(split_parts=4, cluster=2), "hold no whole rows"),  # a row, 2 clusters
    ((64, 30000), Choices(split_parts=2, cluster=16), "hold no whole rows"),  # not portable
    ((2, 65536), Choices(split_parts=8, threads_per_row=1024, cluster=8), "SIMT runner"),
])
def test_clusters_that_cannot_be_are_refused(shape: tuple[int, int], choices: Choices,
                                              why: str) -> None:
    (task,) = extract_tasks(import_model(patterns.softmax(*shape)[0]), cuda_target())
    decide(task.func, task.group, task.rows, task.target,
           replace(choices, cluster=None))  # splits so, without clusters
    with pytest.raises(Unstitchable, match=why):
        decide(task.func, task.group, task.rows, task.target, choices)


def test_a_group_that_is_not_split_takes_no_cluster() -> None:
    mod = import_model(patterns.softmax(4096, 256)[0])
    (task,) = extract_tasks(mod, cuda_target())
    with pytest.raises(Unstitchable):
        decide(task.func, task.group, task.rows, task.target, Choices(cluster=2))


def test_kernels_without_clusters_are_left_alone() -> None:
    source = 'extern "C" __global__ void __launch_bounds__(256) k(float* x) { x[0] = 1; }'
    assert with_cluster_dims(source) == source


def test_a_combination_of_every_row_in_each_block_is_refused() -> None:
    """A group normalisation whose blocks each combine the partials of all the rows of
    their image (and then read their own): those partials lie in other clusters, so the
    check of what each block reads refuses clusters, which would give wrong numbers."""
    mod = import_model(micro.group_norm_silu((2, 320, 64, 64)))
    (task,) = extract_tasks(mod, cuda_target())
    decide(task.func, task.group, task.rows, task.target, Choices(split_parts=2))
    with pytest.raises(Unstitchable, match="not its cluster's"):
        decide(task.func, task.group, task.rows, task.target,
               Choices(split_parts=2, cluster=2))
