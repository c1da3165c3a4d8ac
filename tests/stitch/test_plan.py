"""StitchPlan on small graphs: exact groups, dominants, schemes, fallbacks and refusals."""

from __future__ import annotations

import json

import pytest
import stitch_patterns as patterns
from stitch_helpers import assert_matches, lower_baseline, lower_stitch, reference, run_simt

from tvm_stitch.analysis import analyze
from tvm_stitch.plan import (
    Buffer,
    BufferRole,
    Dominant,
    DominantKind,
    Edge,
    MappingKind,
    PhaseKind,
    Scheme,
    StitchPlan,
    StorageLevel,
    ThreadMapping,
)
from tvm_stitch.testing.resources import check_resources


def _plan(name: str, *args: int) -> StitchPlan:
    model, _ = patterns.PATTERNS[name](*args)
    return lower_stitch(model)[1]


def test_layer_norm_softmax_add_is_one_group_with_two_dominants() -> None:
    plan = _plan("ln_softmax_add", 16, 64)
    assert len(plan.groups) == 1 and not plan.fallbacks and not plan.compute
    group = plan.groups[0]
    assert group.ops == ("lv:layer_norm", "lv1:softmax", "gv:add")
    assert group.outputs == ("gv:add",)
    assert group.dominants == (
        Dominant("lv:layer_norm", DominantKind.REDUCTION, ("lv:layer_norm",)),
        Dominant("lv1:softmax", DominantKind.REDUCTION, ("lv1:softmax", "gv:add"),
                 ("gv:add",)),
    )
    assert group.edges == (
        Edge("lv:layer_norm", "lv1:softmax", Scheme.REGIONAL),
        Edge("lv1:softmax", "gv:add", Scheme.LOCAL),
    )
    # float4 accesses: 16 vectors of a row over its 64 threads
    assert group.mapping == ThreadMapping(MappingKind.BLOCK_PER_ROW, 16, 64, 1, 64, vector=4)
    assert set(group.inlined) == {"T_softmax_norm", "x_mean"}
    shared = {b.name: b for b in group.staged}
    # the input row is staged once; the LN output and exp() are Regional intermediates
    assert shared["x"] == Buffer("x", BufferRole.INPUT, StorageLevel.SHARED, 256,
                                 "read at 5 places in the row")
    assert shared["T_layer_norm_intermediate"].shared_bytes == 256
    assert shared["T_softmax_exp"].shared_bytes == 256
    assert group.shared_bytes <= group.shared_budget == 49152
    assert not group.demotions


def test_matmul_splits_clusters() -> None:
    plan = _plan("matmul_between_layer_norms", 16, 64)
    assert [g.ops for g in plan.groups] == [("lv:layer_norm",), ("lv2:layer_norm",)]
    assert [c.op for c in plan.compute] == ["lv1:matmul"]
    assert plan.refusals[0].reason == "cycle through lv1:matmul"


def test_merge_that_would_form_a_cycle_is_refused() -> None:
    # LN1 feeds the matmul and, as a residual, its epilogue: LN1 and LN2 have one row space
    # and no direct edge, but stitching them together would put the matmul inside a cycle.
    plan = _plan("residual_cycle", 16, 64)
    assert [g.ops for g in plan.groups] == [("lv:layer_norm",), ("lv3:layer_norm",)]
    assert [(c.op, c.epilogue) for c in plan.compute] == [("lv1:matmul", ("lv2:add",))]
    (refusal,) = plan.refusals
    assert (refusal.first, refusal.second) == ("{lv:layer_norm}", "{lv3:layer_norm}")
    assert refusal.reason == "cycle through lv1:matmul"


def test_unconnected_groups_of_one_row_space_are_stitched_remotely() -> None:
    plan = _plan("two_layer_norms", 16, 64)
    (group,) = plan.groups
    assert group.ops == ("lv:layer_norm", "lv1:layer_norm")
    assert [d.op for d in group.dominants] == ["lv:layer_norm", "lv1:layer_norm"]
    assert group.edges == (Edge("lv:layer_norm", "lv1:layer_norm", Scheme.INDEPENDENT),)


def test_unconnected_readers_of_one_input_read_it_once() -> None:
    # -x, exp(x) and sum(x, axis=1) share only x: each a kernel of its own in TVM's flow
    # (x read three times); remote stitching makes one kernel of the two element-wise ops,
    # which fit any row space, and the row sum.
    model, _ = patterns.sibling_reads(256, 1024)
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert group.ops == ("lv:tir_negative", "lv1:tir_exp", "lv2:sum")
    assert {e.scheme for e in group.edges} == {Scheme.INDEPENDENT}
    assert not plan.fallbacks and not plan.refusals
    report = analyze(scheduled)
    assert len(report.kernels) == 1
    assert report.read_bytes == 256 * 1024 * 4
    assert report.write_bytes == (2 * 256 * 1024 + 256) * 4
    assert not check_resources(scheduled).violations  # nvcc for sm_80 and sm_90


def test_remote_stitching_that_cannot_be_scheduled_groups_its_parts_apart() -> None:
    # with the layer norm's rows, a block would read exp(y) at rows of other blocks: the
    # merge is refused with that reason, and each part is stitched on its own
    plan = _plan("layer_norm_beside_gather", 16, 64)
    assert [g.ops for g in plan.groups] == [
        ("lv:layer_norm",), ("lv1:tir_exp", "lv8:take1", "lv9:tir_negative")]
    assert not plan.fallbacks
    (refusal,) = plan.refusals
    assert (refusal.first, refusal.second) == (
        "{lv:layer_norm}", "{lv1:tir_exp, lv8:take1, lv9:tir_negative}")
    assert refusal.reason.startswith("remote stitching: block ")
    model, _ = patterns.layer_norm_beside_gather(16, 64)
    assert not check_resources(lower_stitch(model)[0]).violations


def test_a_group_moving_more_than_tvm_is_cut_where_a_result_is_broadcast() -> None:
    # one kernel would gather the mask at every (query, key), reading its indices and the
    # mask each time (75776 B, TVM's three kernels 30400 B); cut at the broadcast, one
    # kernel gathers it once per key and the next reads it
    model, _ = patterns.gathered_mask(2, 32)
    scheduled, plan = lower_stitch(model)
    assert [g.ops for g in plan.groups] == [
        ("lv:cast", "lv7:te_gather_nd"), ("lv8:logical_and", "gv:where1")]
    assert not plan.fallbacks
    (refusal,) = plan.refusals
    assert (refusal.first, refusal.second) == (
        "{lv:cast, lv7:te_gather_nd}", "{lv8:logical_and, gv:where1}")
    assert refusal.reason.startswith("stitched apart where a result is broadcast: the "
                                     "stitched kernel moves 75776 B")
    stitched, baseline = analyze(scheduled), analyze(lower_baseline(model))
    assert (len(stitched.kernels), len(baseline.kernels)) == (2, 3)
    assert stitched.global_bytes <= baseline.global_bytes
    assert not check_resources(scheduled).violations


def test_clusters_an_edge_connects_are_not_stitched_remotely() -> None:
    # the softmax reads the log-softmax's results across its rows, so merging along that
    # edge is refused; remote stitching merged the two anyway, the group could not be
    # scheduled and fell back whole: 4 kernels (TVM's and the transposes of the softmax over
    # the first axis) where TVM's flow runs 2
    model, _ = patterns.softmax_of_transposed_log_softmax(64, 64)
    scheduled, plan = lower_stitch(model)
    assert [g.ops for g in plan.groups] == [
        ("lv:log_softmax",),
        ("softmax_view:transpose", "softmax_rows:softmax", "softmax_back:transpose")]
    assert not plan.fallbacks and not plan.refusals
    stitched, baseline = analyze(scheduled), analyze(lower_baseline(model))
    assert (len(stitched.kernels), len(baseline.kernels)) == (2, 2)
    assert stitched.global_bytes < baseline.global_bytes
    assert not check_resources(scheduled).violations  # nvcc for sm_80 and sm_90


def test_a_group_that_cannot_be_scheduled_is_cut_where_a_result_is_broadcast() -> None:
    # element (i, j) of the where reads the minimum of row j: one kernel over rows of x
    # cannot compute it, and the whole group fell back to TVM's two kernels; cut where the
    # minima are broadcast, each piece is stitched
    model, _ = patterns.row_min_read_by_columns(64, 64)
    scheduled, plan = lower_stitch(model)
    assert [g.ops for g in plan.groups] == [("lv:min", "lv1:greater"), ("lv2:add", "gv:where")]
    assert not plan.fallbacks
    (refusal,) = plan.refusals
    assert refusal.reason.startswith("stitched apart where a result is broadcast: block "
                                     "T_where reads T_greater_intermediate from other rows")
    stitched, baseline = analyze(scheduled), analyze(lower_baseline(model))
    assert (len(stitched.kernels), len(baseline.kernels)) == (2, 2)
    assert stitched.global_bytes < baseline.global_bytes
    assert not check_resources(scheduled).violations  # nvcc for sm_80 and sm_90


def test_a_group_reading_across_rows_is_cut_before_its_transposes_are_given_back() -> None:
    # with a softmax down the columns (a transposed view written back across the rows)
    # stitched remotely beside it, the group's transposes went back to TVM first, although
    # what failed was the read across rows: 4 kernels where TVM's flow runs 3
    model, inputs = patterns.row_min_read_by_columns(64, 64, softmax_down=True)
    scheduled, plan = lower_stitch(model)
    assert [g.ops for g in plan.groups] == [
        ("lv:min", "lv1:greater"), ("lv2:add", "lv3:where"),
        ("softmax_view:transpose", "softmax_rows:softmax", "softmax_back:transpose")]
    assert not plan.fallbacks
    stitched, baseline = analyze(scheduled), analyze(lower_baseline(model))
    assert (len(stitched.kernels), len(baseline.kernels)) == (3, 3)
    assert stitched.global_bytes < baseline.global_bytes
    assert not check_resources(scheduled).violations
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_a_flat_kernel_computed_lane_by_lane_takes_one_element_per_thread() -> None:
    # the Where of booleans takes no vectors: four consecutive elements per thread, lane by
    # lane, left each warp access strided (2.7 MB of L2 sectors where TVM's kernel takes 1.9)
    model, _ = patterns.gathered_mask(8, 128)
    scheduled, plan = lower_stitch(model)
    where = plan.groups[-1]
    assert where.ops == ("lv8:logical_and", "gv:where1")
    assert (where.mapping.kind, where.mapping.vector, where.scalar_blocks) == (
        MappingKind.FLAT, 1, ())
    assert analyze(scheduled).sector_bytes <= analyze(lower_baseline(model)).sector_bytes


def test_remote_stitching_estimated_slower_than_tvm_is_refused() -> None:
    # on the blocks of the sums' 4 rows (split in 4 parts: rows of 8), exp of 4M elements
    # would leave the GPU idle
    model, _ = patterns.short_sums_long_rows(4, 8, 1 << 20)
    _, plan = lower_stitch(model)
    assert [g.ops for g in plan.groups] == [("lv1:sum",)]
    (refusal,) = plan.refusals
    assert refusal.reason.startswith("remote stitching: the stitched kernel is estimated at ")
    assert refusal.reason.endswith("in 2 kernel(s)")


def test_merge_refused_for_a_path_through_a_third_cluster_is_retried() -> None:
    # keys * cos is refused to join the add of its rotary half while the slices lie between
    # them in other clusters; once the slices have joined the add, the merge is legal.
    plan = _plan("rotary_grouped_heads", 8, 4, 2, 16)
    (group,) = plan.groups
    assert group.ops == (
        "lv:transpose", "lv1:strided_slice", "lv2:tir_negative", "lv3:strided_slice1",
        "lv4:concatenate", "lv5:multiply", "lv6:multiply", "lv7:transpose1",
        "lv8:strided_slice2", "lv9:tir_negative1", "lv10:strided_slice3", "lv11:concatenate1",
        "lv12:multiply1", "lv13:multiply1", "lv14:add", "lv15:expand_dims", "lv16:broadcast_to",
        "lv17:add1", "lv18:reshape")
    assert set(group.outputs) == {"lv17:add1", "lv18:reshape"}
    assert not plan.fallbacks and not plan.refusals


def test_split_parts_are_slices_stitched_with_their_readers() -> None:
    # SplitToSlices: no split kernel of its own writing every part to DRAM
    plan = _plan("qkv_split", 16, 2, 16)
    (group,) = plan.groups
    assert group.ops == (
        "lv1:strided_slice", "lv2:strided_slice1", "lv3:strided_slice2", "lv4:reshape",
        "lv5:reshape", "lv6:reshape", "lv7:transpose", "lv8:transpose", "lv9:transpose")
    assert group.inputs == ("qkv",)
    assert group.outputs == ("lv7:transpose", "lv8:transpose", "lv9:transpose")
    assert not plan.fallbacks and not plan.refusals


def test_middle_axis_sum_reduces_rows_of_a_transposed_view() -> None:
    # mixed_reductions: the sum over axis 1 of (4, 8, 16) reduces rows of 8 of a transpose that
    # the kernel reads through (a symbolic length still falls back: test_dynamic_rows.py)
    plan = _plan("middle_axis_sum", 4, 8, 16)
    (group,) = plan.groups
    assert group.ops == ("reduce_view:transpose", "lv:sum", "gv:tir_exp")
    assert group.inputs == ("x",) and group.mapping.row_length == 8
    assert not plan.fallbacks


@pytest.mark.usefixtures("global_at_any_cost")
def test_column_reduction_read_back_by_rows_is_one_global_group() -> None:
    plan = _plan("column_mean_center", 16, 64)
    (group,) = plan.groups
    assert not plan.fallbacks
    assert group.ops == ("lv:mean", "gv:subtract")
    assert group.edges == (Edge("lv:mean", "gv:subtract", Scheme.GLOBAL),)
    assert [(p.kind, p.blocks) for p in group.phases] == [
        ("rows", ("x_red",)), ("columns", ("x_red", "T_divide")), ("rows", ("T_subtract",))]
    assert group.grid_barriers == 2
    assert group.launch.grid <= group.launch.wave
    partial = next(b for b in group.buffers if b.role is BufferRole.PARTIAL)
    again = StitchPlan.from_json(plan.to_json()).groups[0]
    assert again == group and all(type(ph.kind) is PhaseKind for ph in again.phases)
    assert partial.level is StorageLevel.GLOBAL and partial.name == "x_red"


def test_element_wise_group_is_flat_and_keeps_reused_values_in_registers() -> None:
    plan = _plan("adam_update", 16, 64)
    (group,) = plan.groups
    assert group.mapping == ThreadMapping(MappingKind.FLAT, 1024, 1, 256, 1)  # 4 blocks
    assert len(group.outputs) == 3
    assert {b.level for b in group.buffers} == {StorageLevel.REGISTER}
    assert group.shared_bytes == 0


def test_plan_round_trips_through_json_and_prints() -> None:
    plan = _plan("ln_softmax_add", 16, 64)
    data = json.loads(plan.to_json())
    assert data["groups"][0]["edges"][0]["scheme"] == "regional"
    assert StitchPlan.from_json(plan.to_json()) == plan
    assert StitchPlan.from_dict(plan.to_dict()) == plan
    text = str(plan)
    assert "dominant lv1:softmax (reduction)" in text
    assert "edge lv:layer_norm -> lv1:softmax: regional" in text
    assert "mapping block-per-row: 16 rows x 64" in text
