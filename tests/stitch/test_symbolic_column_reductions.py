"""Column reductions over a run-time length: a bias or LayerNorm-weight gradient of a model
exported with dynamic batch and sequence sums over ``batch * seq`` rows. Global stitching
takes a wave of row tiles whatever the rows; each tile walks ``max(ceil(rows / tiles), 8)``
rows at run time, the rows past the end guarded and the tiles past them idle (no staging,
no partial sums written or combined)."""

from __future__ import annotations

import functools

import onnx
import pytest
from onnx import TensorProto, helper
from stitch_helpers import compile_cuda, module_cuda_source, spills, stack_frames

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule.decisions.tiles import MIN_TILE_ROWS
from tvm_stitch.target import cuda_target
from tvm_stitch.workloads.inputs import set_input_dists, uniform

WIDTH = 768  # BERT-base's hidden size


def weighted_column_sum(width: int = WIDTH) -> onnx.ModelProto:
    """``sum over (batch, seq) of x * dy``: a LayerNorm weight's gradient."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])
    dy = helper.make_tensor_value_info("dy", TensorProto.FLOAT, ["batch", "seq", width])
    out = helper.make_tensor_value_info("dgamma", TensorProto.FLOAT, [width])
    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [0, 1])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "dy"], ["xdy"]),
         helper.make_node("ReduceSum", ["xdy", "axes"], ["dgamma"], keepdims=0)],
        "dgamma", [x, dy], [out], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    # positive terms: a float32 sum of thousands of normal products cancels to near 0, where
    # any order's rounding (onnxruntime's pairwise one included) exceeds 1e-4
    set_input_dists(model, {"x": uniform(0.0, 1.0), "dy": uniform(0.0, 1.0)})
    return model


@functools.cache
def _compiled(flow: str):
    model = weighted_column_sum()
    return model, pipeline.lower(import_model(model), cuda_target(), flow)


def test_the_plan_takes_a_wave_of_row_tiles_of_run_time_length() -> None:
    plan = StitchPlan.of_module(_compiled("stitch")[1])
    assert not plan.fallbacks, str(plan)
    (group,) = plan.groups
    mapping = group.mapping
    assert mapping.rows_expr == "batch * seq" and mapping.row_steps == MIN_TILE_ROWS
    assert mapping.row_tiles == group.launch.grid == group.launch.wave, str(plan)
    assert f"{mapping.row_tiles} row tiles of max(ceil(batch * seq / {mapping.row_tiles}), " \
           f"{MIN_TILE_ROWS}) rows" in str(plan)


@pytest.mark.parametrize("dims", [
    {"batch": 1, "seq": 1},  # one tile of one row, every other tile idle
    {"batch": 3, "seq": 13},  # 39 rows: tiles of 8, the last of 7
    {"batch": 2, "seq": 1501},  # 3002 rows x 768: 2.3M elements, 376 tiles
])
def test_one_compile_sums_every_length_with_partial_sums_of_the_rows_only(dims) -> None:
    """Right at every length; the kernel moves what TVM's does plus one row of partial sums
    per tile of at least 8 rows (written once, read once), and no more."""
    model, stitched = _compiled("stitch")
    _, baseline = _compiled("baseline")
    ours = verify.summarize(stitched, model, dims=dims)
    tvms = verify.summarize(baseline, model, dims=dims)
    assert ours["ok"], (ours, tvms)
    rows = dims["batch"] * dims["seq"]
    tiles = StitchPlan.of_module(stitched).groups[0].mapping.row_tiles
    steps = max(-(-rows // tiles), MIN_TILE_ROWS)
    partials = 2 * -(-rows // steps) * WIDTH * 4
    assert ours["global_bytes"] == tvms["global_bytes"] + partials, (dims, ours, tvms)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernel_compiles_without_spills_or_stack(arch: str) -> None:
    report = compile_cuda(module_cuda_source(_compiled("stitch")[1], arch), arch)
    found = spills(report)
    assert found and all(s == (0, 0) for s in found), report
    assert set(stack_frames(report)) == {0}, report
