"""A small Global group runs on few row tiles when its prime row count has no divisor that
fills the wave.

Fuzz graphs 4242:46, :151, :185 (large 0.05): a column softmax over (257, 5) fell back with
"257 rows do not split into about one wave of 32 tiles (at most 1)". Row tiles must divide
the rows, and 257 is prime. On 1285 elements one tile is no loss; on a large tensor the
tiles' rows need not divide the rows (``test_ragged_row_tiles.py``), where there are more
rows than columns: a column softmax of no more rows than columns is strided rows of a
transposed view (``mixed_reductions``).

Such a Global kernel's partial sums make it move more than TVM's kernels: it falls back
unless it is estimated faster, the launches it saves included (``stitch_fuse._worse``; fuzz
graphs 12011:131, :386, :456, where TVM runs the same ops in one kernel, and 12014:338, two
column log-softmaxes of one input where TVM runs two). Beside an op TVM runs apart (a sum
over each row of the softmax), it is one kernel for TVM's two. Since a column reduction of
several results (a softmax's pair) keeps every result's partials on chip, not only its
first's, the two log-softmaxes of 12014:338 move 1185280 B (not 1448448) in 8.7 us, within
``TIME_MARGIN`` of TVM's 7.2: they stitch. Owners: schedule/decisions/tiles.py,
transform/stitch_fuse.py, schedule/emit.py (``_rewritten_global``). Where TVM runs the ops
in one kernel, a Global kernel that moves more saves no launch and must be estimated faster
(``yardstick.ONE_KERNEL_MARGIN``; fuzz graph 12046:152)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform.yardstick import TIME_MARGIN


def _column_softmax(shape: list[int]):
    return model([helper.make_node("Softmax", ["x"], ["y"], axis=0)], {"x": shape},
                 {"y": shape})


def _column_softmax_and_row_sums(shape: list[int]):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=0),
             helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0)]
    return model(nodes, {"x": shape}, {"y": shape, "s": shape[:1]},
                 {"axes": np.array([1], np.int64)})


def _two_column_log_softmaxes(shape: list[int]):
    nodes = [helper.make_node("LogSoftmax", ["x"], ["y"], axis=0),
             helper.make_node("LogSoftmax", ["x"], ["z"], axis=0)]
    return model(nodes, {"x": shape}, {"y": shape, "z": shape})


def _stitched_and_checked(built) -> None:
    scheduled = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.phases, group
    assert len(analyze(scheduled).kernels) == 1
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_small_column_softmax_over_prime_rows_stitches_beside_a_row_sum() -> None:
    _stitched_and_checked(_column_softmax_and_row_sums([257, 5]))


@pytest.mark.usefixtures("global_at_any_cost")
def test_a_small_column_softmax_over_prime_rows_stitches_alone_at_any_cost() -> None:
    _stitched_and_checked(_column_softmax([257, 5]))


# (257, 5): estimated past TIME_MARGIN. (1000, 8), fuzz graph 12046:152, 125 row tiles:
# within TIME_MARGIN, it was taken though it saves no launch (ONE_KERNEL_MARGIN)
@pytest.mark.parametrize("shape,counts", [([257, 5], (24080, 20560, "7.0", "3.6")),
                                          ([1000, 8], (144064, 128000, "6.6", "5.3"))])
def test_a_small_global_kernel_slower_than_tvms_one_kernel_falls_back(
        shape: list[int], counts: tuple[int, int, str, str]) -> None:
    scheduled = verify.compile_model(_column_softmax(shape), "stitch")
    plan = StitchPlan.of_module(scheduled)
    (fallback,) = plan.fallbacks
    assert not plan.groups
    stitched, tvm, stitched_us, tvm_us = counts
    assert fallback.reason == (
        f"the stitched kernel moves {stitched} B of global memory, TVM's fusion of the same "
        f"ops {tvm} B in 1 kernel(s), partial sums included; the stitched kernel is "
        f"estimated at {stitched_us} us on the H200, TVM's fusion of the same ops at "
        f"{tvm_us} us in 1 kernel(s)")
    assert len(analyze(scheduled).kernels) == 1


def test_a_large_column_softmax_of_few_prime_rows_is_strided_rows() -> None:
    plan = StitchPlan.of_module(verify.compile_model(_column_softmax([257, 4096]), "stitch"))
    (group,) = plan.groups
    assert not plan.fallbacks and not group.phases, plan
    assert group.mapping.kind is MappingKind.STRIDED_ROWS, group


def test_two_column_log_softmaxes_keep_their_pairs_on_chip_and_stitch() -> None:
    # fuzz graph 12014:338 (shrunk): one row of (257, 64) per row tile (a tile of more rows
    # would keep too many elements in registers), the partial pairs of 257 tiles for each
    # log-softmax. With each pair's sums in global memory, element by element, it moved
    # 1448448 B in 12.3 us, where TVM's two kernels move 526336 B in 7.2, and fell back
    built = _two_column_log_softmaxes([257, 64])
    scheduled = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(scheduled)
    (group,) = plan.groups
    assert not plan.fallbacks and len(group.online) == 2, str(plan)
    stitched = analyze(scheduled)
    assert stitched.global_bytes == 1185280
    tvm = analyze(verify.compile_model(built, "baseline"))
    assert len(tvm.kernels) == 2
    assert stitched.roofline_us()["H200"] <= TIME_MARGIN * tvm.roofline_us()["H200"]


@pytest.mark.usefixtures("global_at_any_cost")
def test_two_column_log_softmaxes_stitch_as_one_global_kernel_at_any_cost() -> None:
    _stitched_and_checked(_two_column_log_softmaxes([257, 64]))
