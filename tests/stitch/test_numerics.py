"""Stitched kernels run on the SIMT runner and match onnxruntime; one kernel per group;
the global traffic of layer_norm -> softmax -> add reaches the hand-stitched figure."""

from __future__ import annotations

import pytest
import stitch_patterns as patterns
from stitch_helpers import (
    assert_matches,
    kernel_count,
    lower_stitch,
    reference,
    run_simt,
    stitched_functions,
)

from tvm_stitch.analysis import analyze
from tvm_stitch.plan import MappingKind

CASES = {
    "softmax": (16, 64),
    "layer_norm": (16, 100),  # a row length that is not a multiple of the threads
    "add_layer_norm": (16, 64),
    "rms_norm": (16, 64),
    "bias_gelu": (16, 64),
    "scale_mask_softmax": (2, 2, 16),
    "log_softmax_nll": (16, 32),
    "ln_softmax_add": (16, 64),
    "matmul_between_layer_norms": (16, 64),
    "residual_cycle": (16, 64),
    "two_layer_norms": (16, 64),
    "sibling_reads": (16, 64),
    "layer_norm_beside_gather": (16, 64),
    "gathered_mask": (2, 32),
    "column_mean_center": (16, 64),
    "softmax_of_transposed_log_softmax": (64, 64),
    "row_min_read_by_columns": (64, 64),
    "adam_update": (16, 64),
    "rotary_grouped_heads": (8, 4, 2, 16),
    "qkv_split": (16, 2, 16),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_matches_onnxruntime(name: str) -> None:
    model, inputs = patterns.PATTERNS[name](*CASES[name])
    scheduled, plan = lower_stitch(model)
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))
    for fname, func in stitched_functions(scheduled).items():
        assert kernel_count(func, fname) == 1, f"{fname} must be one kernel"
    assert {g.function for g in plan.groups} == set(stitched_functions(scheduled))


def test_packed_short_rows_match_onnxruntime() -> None:
    # enough short rows to pack several per block (threadIdx.y), over a 3-d row space
    model, inputs = patterns.scale_mask_softmax(2, 16, 32)
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert group.mapping.kind is MappingKind.WARP_PER_ROW
    assert group.mapping.rows_per_block > 1
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_layer_norm_softmax_add_traffic_is_the_hand_stitched_one() -> None:
    # DESIGN.md: TVM 2 kernels / 3.93 MB read; hand stitch 1 kernel, 1.57 MB read, 0.39 MB
    # written (x and y once, gamma and beta once per row, the output once).
    model, _ = patterns.ln_softmax_add(128, 768)
    scheduled, _ = lower_stitch(model)
    report = analyze(scheduled)
    assert len(report.kernels) == 1
    assert report.read_bytes == 4 * 128 * 768 * 4
    assert report.write_bytes == 128 * 768 * 4


@pytest.mark.parametrize(("name", "args", "staged"), [
    ("layer_norm", (4224, 64), {"const1", "const2"}),  # gamma and beta: the same every row
    ("scale_mask_softmax", (2, 64, 64), {"mask"}),  # the mask row of each batch
])
def test_vertical_packing_stages_shared_inputs_once_per_block(
        name: str, args: tuple[int, ...], staged: set[str]) -> None:
    model, inputs = patterns.PATTERNS[name](*args)
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert group.mapping.row_steps > 1
    assert {b.name for b in group.buffers if b.per_block} == staged
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))
