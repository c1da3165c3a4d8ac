"""The partial sums of a Global group's column reductions at real widths live in registers.

A LayerNorm backward over rows of 4608 (dgamma and dbeta: 2 x 4608 x 4 B = 36,864 B of
partial sums per block), three column sums over 4608 columns (55,296 B) and torch's MLP
backward at real size (18,432 B: the bias gradient of the 3072-wide FFN and the LayerNorm's
weight gradients) fell back: partial sums above a quarter of the 48 KB shared budget were
refused ("needs tiles of columns"). A row phase gives column ``c`` of every row of its tile
to thread ``c % P``, so each thread now sums its ``ceil(width / P)`` columns in registers and
writes them out once per tile. Owner: schedule/decisions/global_stitch.py (``decide_global``),
schedule/emit.py (``_hold_partial_sums``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import BufferRole, DemotionKind, StitchPlan, StorageLevel
from tvm_stitch.testing.differential import check_model
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.workloads import micro, models

TOO_LARGE = "partial sums of the column reductions need"


def _column_sums(rows: int, width: int) -> onnx.ModelProto:
    """Sum, sum of squares and sum of magnitudes of each column of ``x``."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, width])
    nodes = [onnx.helper.make_node(op, ["x", "axes"], [out], keepdims=0)
             for op, out in (("ReduceSum", "s"), ("ReduceSumSquare", "q"), ("ReduceL1", "a"))]
    outputs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [width])
               for n in ("s", "q", "a")]
    graph = onnx.helper.make_graph(nodes, "column_sums", [x], outputs,
                                   [onnx.numpy_helper.from_array(np.array([0]), "axes")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])


def _accumulators(plan: StitchPlan) -> list:
    (group,) = plan.groups
    return [b for b in group.buffers if b.role is BufferRole.ACCUMULATOR]


def _lower(model: onnx.ModelProto, flow: str = "stitch"):
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", flow)
    return scheduled, StitchPlan.of_module(scheduled)


def test_layernorm_backward_at_a_real_width_is_one_kernel_within_the_baseline() -> None:
    model = micro.layernorm_backward((8192, 4608))
    scheduled, plan = _lower(model)
    assert not plan.fallbacks
    (group,) = plan.groups
    # 1024 threads per row: 5 of the 4608 columns per thread, for dgamma and for dbeta
    assert [(b.level, b.registers, b.shared_bytes) for b in _accumulators(plan)] == [
        (StorageLevel.REGISTER, 5, 0)] * 2
    assert group.shared_bytes <= group.shared_budget
    assert StitchPlan.from_json(plan.to_json()) == plan  # the slots survive the module attr
    stitched = analyze(scheduled)
    baseline = analyze(_lower(model, "baseline")[0])
    assert len(stitched.kernels) == 1 <= len(baseline.kernels)
    # a stitched kernel is memory-intensive, though its register copies drop the row index
    assert stitched.mem_kernels == 1
    assert stitched.global_bytes <= baseline.global_bytes


@pytest.mark.parametrize("model", [micro.layernorm_backward((1024, 4608)),
                                   micro.layernorm_backward((64, 8192)),
                                   _column_sums(2048, 4603)],
                         ids=["layernorm_backward", "layernorm_backward_8192",
                              "three_column_sums"])
def test_partial_sums_in_registers_match_onnxruntime_within_the_resources(
        model: onnx.ModelProto) -> None:
    _, plan = _lower(model)
    assert not plan.fallbacks
    assert {b.level for b in _accumulators(plan)} == {StorageLevel.REGISTER}
    outcome = check_model(model, "stitch")
    # nvcc/ptxas for sm_80 and sm_90: no spill, no stack frame, every array in the budget
    assert outcome.kind == "ok", outcome.error
    assert not outcome.violations


def test_partial_sums_within_a_quarter_of_the_budget_stay_in_shared_memory() -> None:
    _, plan = _lower(micro.layernorm_backward((8192, 768)))
    assert [(b.level, b.shared_bytes) for b in _accumulators(plan)] == [
        (StorageLevel.SHARED, 768 * 4)] * 2


def test_partial_sums_too_many_for_registers_fall_back_with_the_reason() -> None:
    # 32771 columns (a prime: no column tiles) over 1024 threads: 3 x 33 sums per thread,
    # more than the 64 registers
    _, plan = _lower(_column_sums(2048, 32771))
    (fallback,) = plan.fallbacks
    assert fallback.reason.startswith(TOO_LARGE)
    assert "in registers 99 per thread, which with the 0 elements" in fallback.reason
    assert fallback.reason.endswith("needs tiles of columns")


def test_partial_sums_of_column_tiles_hold_their_input_in_registers() -> None:
    # 16384 columns: 3 x 16 sums per thread in registers, and the 16 elements of x each
    # thread reads for all three did not fit beside them, so the loops that read x ran
    # rolled and read it three times (L2), as TVM's three kernels do. Each partial sum's
    # tile of 1024 columns now takes 4 KB of shared memory (no lanes: no slot per thread),
    # and a thread of a tile holds its one element of x per row in a register.
    model = _column_sums(1024, 16384)
    scheduled, plan = _lower(model)
    assert not plan.fallbacks
    (group,) = plan.groups
    assert group.phases[0].column_tiles == 16
    assert [(b.level, b.shared_bytes) for b in _accumulators(plan)] == [
        (StorageLevel.SHARED, 4096)] * 3
    assert not check_resources(scheduled).violations
    tvm_fusion = _lower(model, "baseline")[0]
    assert len(analyze(scheduled).kernels) == 1 < len(analyze(tvm_fusion).kernels) == 3
    (kernel,) = analyze(scheduled).kernels
    assert kernel.traffic.buffers["x"].read_bytes == 1024 * 16384 * 4
    # 16000 columns: no tile of 1024 divides them, and 48 sums per thread beside rolled
    # re-reads of x spilled 72 B; blocks narrow to 1000 threads, 16 tiles of 1000
    (group,) = _lower(_column_sums(1024, 16000))[1].groups
    assert (group.mapping.threads_per_block, group.phases[0].column_tiles) == (1000, 16)
    assert not check_resources(_lower(_column_sums(1024, 16000))[0]).violations
    # the same at a size the SIMT runner takes: x held, 22 row tiles x 10 column tiles
    small = _column_sums(528, 10240)
    (group,) = _lower(small)[1].groups
    assert DemotionKind.HELD_IN_REGISTERS in {d.kind for d in group.demotions}
    assert group.phases[0].column_tiles == 10
    outcome = check_model(small, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_layernorm_backward_at_width_8192_is_one_kernel_within_the_registers() -> None:
    # Llama-2-70B's hidden width: 16 partial sums per thread (dgamma, dbeta) and dy, gamma
    # and rstd read again per row. rstd is one element per row, kept in one register, and a
    # partial sum is one register with no address: it fell back, its 8 + 8 + 8 cached
    # elements and 16 sums counted at two registers each; ptxas: 64 registers, no spill.
    model = micro.layernorm_backward((4096, 8192))
    scheduled, plan = _lower(model)
    assert not plan.fallbacks
    assert [(b.level, b.registers) for b in _accumulators(plan)] == [
        (StorageLevel.REGISTER, 8)] * 2
    report = check_resources(scheduled)
    assert not report.violations, report.violations
    stitched = analyze(scheduled)
    baseline = analyze(_lower(model, "baseline")[0])
    assert len(stitched.kernels) == 1 < len(baseline.kernels)
    assert stitched.dram_bytes < baseline.dram_bytes / 2


@pytest.mark.slow
def test_mlp_backward_at_real_size_stitches_its_layernorm_backward() -> None:
    model = models.load_model("mlp_backward", "real", layers=1)
    scheduled, plan = _lower(model)
    assert not [f.reason for f in plan.fallbacks if f.reason.startswith(TOO_LARGE)]
    stitched = analyze(scheduled)
    baseline = analyze(_lower(model, "baseline")[0])
    assert len(stitched.kernels) <= len(baseline.kernels)
    assert stitched.global_bytes <= baseline.global_bytes


def test_partial_sums_and_a_held_input_share_the_register_budget() -> None:
    # fuzz graph 1207:27 (large 0.5): min over the rows of Where(x <= c, x, y) on (64, 30000).
    # Each thread kept 30 partial minima in registers, and x (read twice) was also held in
    # registers, 30 elements more: 96-144 B of spills and a stack frame on sm_80 and sm_90.
    # An input is held only in what the partial sums leave; x is now re-read instead.
    from tvm_stitch.workloads.graph import GraphBuilder

    g = GraphBuilder("min_where")
    x = g.input("x", (64, 30000))
    picked = g.op("Where", g.op("LessOrEqual", x, g.constant(0.25)), x, g.input("y", (64, 1)))
    model = g.model([g.op("ReduceMin", picked, g.axes(0), keepdims=0)])
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []
    (group,) = StitchPlan.of_module(pipeline.lower(import_model(model), "cuda:sm_90",
                                                   flow="stitch")).groups
    assert not any(b.name == "x" and b.level is StorageLevel.REGISTER for b in group.buffers)


def test_a_reduction_over_one_value_per_row_keeps_its_partial_sum_in_shared_memory() -> None:
    # fuzz graph 7321:1656 (large 0.05): a softmax over the 7 rows of (7, 4097) float16 (its
    # column partials over a quarter of the budget, so in registers) beside a LayerNorm over
    # the 7 row maxima. The LayerNorm's sums have no columns, one partial sum per tile, and
    # holding them "per column" in registers failed an emitter assertion: the whole group
    # fell back ("scheduling failed: (7,)"). A column softmax of so few rows is strided rows
    # of a transposed view now (``mixed_reductions``): a column maximum subtracted and a column
    # sum (over a quarter of the budget together) stand in for it.
    from tvm_stitch.workloads.graph import GraphBuilder

    g = GraphBuilder("max_norm_column_softmax")
    x = g.input("x", (7, 4097), dtype=np.float16)
    top = g.op("ReduceMax", x, g.axes(1), keepdims=0)
    norm = g.op("LayerNormalization", top,
                g.constant(np.linspace(0.5, 1.5, 7), dtype=np.float16),
                g.constant(np.linspace(-0.5, 0.5, 7), dtype=np.float16), axis=0)
    model = g.model([norm, g.op("Sub", x, g.op("ReduceMax", x, g.axes(0), keepdims=1)),
                     g.op("ReduceSum", x, g.axes(0), keepdims=0)])
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []
    (group,) = StitchPlan.of_module(pipeline.lower(import_model(model), "cuda:sm_90",
                                                   flow="stitch")).groups
    levels = {b.name: b.level for b in group.buffers if b.role is BufferRole.ACCUMULATOR}
    columns = [level for name, level in levels.items()
               if name not in ("x_sum", "x_dev_sum", "x_var_sum")]
    assert len(columns) == 2 and set(columns) == {StorageLevel.REGISTER}, levels
    assert levels["x_sum"] is StorageLevel.SHARED


def test_column_sums_that_fit_nowhere_fall_back_alone_and_the_rows_stitch() -> None:
    # At width 32768 dgamma and dbeta's 64 partial sums per thread do not fit its registers,
    # even with every input re-read in rolled loops; the whole LayerNorm backward fell back
    # to TVM's 7 kernels. The column sums now fall back alone, and the row ops (dx) stitch:
    # 3 kernels.
    model = micro.layernorm_backward((512, 32768))
    scheduled, plan = _lower(model)
    (fallback,) = plan.fallbacks
    assert sorted(op.split(":")[1] for op in fallback.ops) == ["sum1", "sum1"]
    assert fallback.reason.startswith(TOO_LARGE)
    (group,) = plan.groups
    assert not group.phases  # the rows alone: no column phase
    stitched = analyze(scheduled)
    baseline = analyze(_lower(model, "baseline")[0])
    assert len(stitched.kernels) == 3 < len(baseline.kernels) == 7
    assert stitched.dram_bytes < baseline.dram_bytes
    assert not check_resources(scheduled).violations
    outcome = check_model(micro.layernorm_backward((64, 32768)), "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.parametrize("width", [10240, 12288, 16384])
def test_layernorm_backward_at_llm_widths_is_one_kernel_with_rolled_rereads(width: int) -> None:
    # dx's re-read inputs (dy, gamma, x) kept in registers did not fit beside dgamma and
    # dbeta's partial sums: 10240 gave its column sums back to TVM (3 kernels), 12288 and
    # 16384 (GPT-3, Llama-3-405B) fell back whole to TVM's 7. The loops that read them now
    # run rolled and read them again from L2: one kernel, and no spill.
    model = micro.layernorm_backward((1024, width))
    scheduled, plan = _lower(model)
    assert not plan.fallbacks
    (group,) = plan.groups
    assert any(d.kind is DemotionKind.ROLLED_REREADS for d in group.demotions)
    assert group.unrolled
    assert not check_resources(scheduled).violations
    stitched = analyze(scheduled)
    baseline = analyze(_lower(model, "baseline")[0])
    assert len(stitched.kernels) == 1 < len(baseline.kernels) == 7
    assert stitched.dram_bytes < baseline.dram_bytes
    outcome = check_model(micro.layernorm_backward((64, width)), "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_batch_norm_over_wide_channels_holds_its_online_variance_in_registers() -> None:
    # A batch norm in training over 2048 channels: the online variance's triple (squares,
    # mean, count) per column took registers for its first result alone, the mean and the
    # count accumulating in place in global memory at every row step, and the rules kept
    # two passes, x read three times (11.9 MB). Every result of a triple of 12 registers a
    # thread is held now: one pass over x and one to normalise, 10.0 MB.
    model = micro.batchnorm_train((256, 2048))
    scheduled, plan = _lower(model)
    (group,) = plan.groups
    assert group.online_variance
    assert [(b.level, b.held_results) for b in _accumulators(plan)] == [
        (StorageLevel.REGISTER, 3)]
    (kernel,) = analyze(scheduled).kernels
    x = kernel.traffic.buffers["x"]
    assert x.read_bytes == 2 * x.size_bytes
    assert kernel.traffic.global_bytes < 10.1e6
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def _column_log_softmax(width: int) -> onnx.ModelProto:
    """A log-softmax down the 2 rows of a row of ``width`` broadcast to them."""
    from tvm_stitch.workloads.graph import GraphBuilder

    g = GraphBuilder("column_log_softmax")
    row = g.op("Expand", g.input("x", (1, width)), g.constant(np.array([2, width]),
                                                              dtype=np.int64))
    return g.model([g.op("LogSoftmax", row, axis=0)])


@pytest.mark.parametrize(("width", "held"), [(12288, 2), (24576, 1)])
def test_online_softmax_pairs_in_registers_up_to_the_cap_of_held_results(
        width: int, held: int) -> None:
    # pairs of 12 columns a thread of 1024 (24 registers) are held whole; at 24 columns (48
    # registers) both spilled 192 B, and the sums of exponentials accumulate in global
    # memory (fuzz graph 12021:84)
    model = _column_log_softmax(width)
    _, plan = _lower(model)
    (accumulator,) = _accumulators(plan)
    assert (accumulator.level, accumulator.held_results) == (StorageLevel.REGISTER, held)
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
