"""A cross-thread reduction's write-back keeps its block's guard (TVM 0.27 drops a one-clause
predicate there: ``schedule.reduction_guards``): rows packed into blocks that do not divide
them, a static or a symbolic row count, write their results and nothing past the end."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from tvm_stitch import analysis, pipeline, verify
from tvm_stitch.analysis.report import lowered_reports
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.workloads import micro


def _row_sum(rows: int | str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    graph = helper.make_graph([node], "row_sum", [x], [y], [axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


TARGET = "cuda:sm_90"
PACKED = Choices(threads_per_row=8, rows_per_block=24)


def _output_writes(reports) -> tuple[int, int]:
    (kernel,) = reports
    out = [b for b in kernel.traffic.buffers.values() if b.write_bytes]
    assert len(out) == 1 and kernel.traffic.exact
    return out[0].write_bytes, out[0].size_bytes


def test_a_partial_last_block_of_a_static_row_count() -> None:
    model = micro.row_sum((2000, 32))
    (task,) = extract_tasks(import_model(model), TARGET)
    decided = decide(task.func, task.group, task.rows, task.target, PACKED)
    assert decided.group.mapping.rows_per_block == 24 and decided.group.mapping.blocks == 84
    assert _output_writes(lowered_reports(decided.lowered)) == (2000 * 4, 2000 * 4)
    with choosing(FixedChoices(PACKED)):
        scheduled = pipeline.lower(import_model(model), TARGET, "stitch")
    assert StitchPlan.of_module(scheduled).groups[0].choices == PACKED
    assert _output_writes(analysis.analyze(scheduled).kernels) == (2000 * 4, 2000 * 4)
    assert verify.run_simt(scheduled, model).ok


@pytest.mark.parametrize("rows", [1, 37, 100])
def test_a_symbolic_row_count(rows: int) -> None:
    model = _row_sum("n")
    (task,) = extract_tasks(import_model(model), TARGET)
    decided = decide(task.func, task.group, task.rows, task.target)
    assert decided.group.mapping.rows_expr and decided.group.mapping.rows_per_block > 1
    reports = analysis.analyze_primfunc(decided.scheduled, [(rows, 32), (rows, 1)],
                                        target=TARGET)
    assert _output_writes(reports) == (rows * 4, rows * 4)
    scheduled = pipeline.lower(import_model(model), TARGET, "stitch")
    assert verify.run_simt(scheduled, model, dims={"n": rows}).ok
