"""Strided rows: a reduction over a middle axis maps consecutive rows to consecutive lanes.

A sum over T of (B, T, E) is a row reduction of a transposed view (rows (b, e), elements t,
``transform/mixed_reduction.py``): a row's elements lie E apart in memory, consecutive rows
side by side. Mapped as rows are (threads along the row), every lane of a warp read a sector
of its own: 8x the bytes it used for float32 (a block per row of 512 elements of
(16, 512, 256): 67.2 MB of sectors for 8.4 MB read). ``strided-rows`` puts a warp's lanes on
consecutive rows and a row's threads on threadIdx.y, combined through shared memory: the
warp reads 32 neighbouring elements at each step (``mapping.strided_row_mapping``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.analysis.ptxas import ptxas_resources
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, MappingKind, StitchPlan
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.tasks import extract_tasks


def _reduce(op: str, shape: list[int], axis: int, keepdims: int = 0,
            elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    out = [1 if i == axis else d for i, d in enumerate(shape)] if keepdims \
        else [d for i, d in enumerate(shape) if i != axis]
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)]
    graph = helper.make_graph(
        nodes, "strided", [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, out)],
        initializer=[onnx.numpy_helper.from_array(np.array([axis], np.int64), "axes")])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    built.ir_version = 8
    onnx.checker.check_model(built)
    return built


def _group(built: onnx.ModelProto):
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks and len(plan.groups) == 1, plan
    return plan.groups[0]


def test_a_sum_over_the_middle_axis_puts_a_warp_on_neighbouring_rows() -> None:
    built = _reduce("ReduceSum", [16, 512, 256], 1)
    mapping = _group(built).mapping
    assert mapping.kind is MappingKind.STRIDED_ROWS
    assert (mapping.rows, mapping.row_length) == (16 * 256, 512)
    # a sector of rows (8 float32) per warp step, 128 threads on each row of 512: 4 each
    assert mapping.rows_per_block == 8 and mapping.threads_per_row == 128
    (kernel,) = analyze(verify.compile_model(built, "stitch")).kernels
    assert kernel.block == (8, 128, 1)
    # the warp's 32 loads at a step are 128 neighbouring bytes: sectors as bytes
    assert kernel.traffic.global_bytes == 16 * 512 * 256 * 4 + 16 * 256 * 4
    assert kernel.traffic.sector_ratio == pytest.approx(1.0)


def test_a_contiguous_row_keeps_its_threads_along_the_row() -> None:
    built = _reduce("ReduceSum", [16, 256, 512], 2)
    assert _group(built).mapping.kind is not MappingKind.STRIDED_ROWS


SHAPES = {
    "partial_last_block": ("ReduceSum", [3, 1000, 13], 1, 0),  # 39 rows, 32 per block
    "four_d": ("ReduceSum", [2, 64, 8, 128], 1, 0),
    "one_thread_per_row": ("ReduceMax", [16, 4, 512], 1, 1),
    "inner_of_four": ("ReduceMean", [2, 3, 300, 7], 2, 1),
    "above_65536": ("ReduceMin", [8, 96, 130], 1, 0),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_strided_rows_match_onnxruntime(name: str) -> None:
    op, shape, axis, keepdims = SHAPES[name]
    built = _reduce(op, shape, axis, keepdims)
    assert _group(built).mapping.kind is MappingKind.STRIDED_ROWS
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_float16_strided_rows_match_onnxruntime() -> None:
    built = _reduce("ReduceSum", [4, 256, 64], 1, elem=TensorProto.FLOAT16)
    assert _group(built).mapping.kind is MappingKind.STRIDED_ROWS
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_choices_keep_the_rows_on_the_lanes_and_refuse_vectors() -> None:
    (task,) = extract_tasks(import_model(_reduce("ReduceSum", [16, 512, 256], 1)),
                            "cuda:sm_90")
    chosen = decide(task.func, task.group, task.rows, task.target,
                    Choices(threads_per_row=8, rows_per_block=32))
    assert chosen.group.mapping.kind is MappingKind.STRIDED_ROWS
    assert chosen.group.mapping.threads_per_block == 256
    for arch in ("sm_80", "sm_90"):
        (used,) = ptxas_resources(chosen.lowered.source(), arch).values()
        assert used.spill_store_bytes == used.stack_bytes == 0, (arch, used)
    with pytest.raises(Unstitchable, match="one element per access"):
        decide(task.func, task.group, task.rows, task.target, Choices(vector=4))
