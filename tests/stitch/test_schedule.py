"""Thread mapping choices, the shared-memory budget and its demotions, schedule fallbacks
(and the schedule of functions that dlight cannot schedule)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import stitch_patterns as patterns
import tvm
from onnx import TensorProto, helper, numpy_helper
from stitch_helpers import (
    assert_matches,
    kernel_count,
    lower_stitch,
    reference,
    run_simt,
    stitched_functions,
)
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T

import tvm_stitch.schedule.decisions as decide_module
from tvm_stitch import verify, workloads
from tvm_stitch.analysis import analyze
from tvm_stitch.lowering import lower
from tvm_stitch.plan import (
    BufferRole,
    Demotion,
    DemotionKind,
    MappingKind,
    StitchPlan,
    StorageLevel,
)
from tvm_stitch.schedule.mapping import DEFAULT_GPU, flat_mapping, row_mapping
from tvm_stitch.schedule.rule import default_rules, host_code, one_thread_kernels, schedule_func
from tvm_stitch.simt import SimtFunction
from tvm_stitch.target import DEFAULT_TARGET, cuda_target, parse_target
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.transform.yardstick import Yardstick
from tvm_stitch.workloads import micro


@pytest.mark.parametrize(("rows", "length", "kind", "rows_per_block", "threads"), [
    (8192, 768, MappingKind.BLOCK_PER_ROW, 1, 256),  # long rows: a block of ~4 elements/thread
    (8192, 4096, MappingKind.BLOCK_PER_ROW, 1, 1024),
    (128, 768, MappingKind.BLOCK_PER_ROW, 1, 1024),  # few rows: more threads per row
    (750000, 32, MappingKind.WARP_PER_ROW, 8, 32),  # short rows: a warp each, 8 per block
    (2000, 32, MappingKind.WARP_PER_ROW, 8, 32),
    (100000, 8, MappingKind.WARP_PER_ROW, 32, 8),  # a sub-warp per very short row
    (64, 256, MappingKind.BLOCK_PER_ROW, 1, 256),  # too few rows for a warp each
])
def test_row_mapping(rows: int, length: int, kind: MappingKind, rows_per_block: int,
                     threads: int) -> None:
    mapping = row_mapping(rows, length, rows)
    assert (mapping.kind, mapping.rows_per_block, mapping.threads_per_row) == (
        kind, rows_per_block, threads)
    assert mapping.threads_per_block <= 1024


@pytest.mark.parametrize(("length", "vector", "threads"), [
    (1024, 4, 64),  # 256 float4 vectors: four per thread
    (768, 4, 64),  # 192 vectors: three per thread, none idle
    (4096, 4, 256),
    (300, 4, 64),  # never fewer than two warps per block-per-row row
    (1024, 1, 256),  # scalar accesses: four elements per thread
])
def test_row_threads_follow_accesses_not_elements(length: int, vector: int,
                                                  threads: int) -> None:
    mapping = row_mapping(8192, length, 8192, vector=vector)
    assert (mapping.kind, mapping.threads_per_row) == (MappingKind.BLOCK_PER_ROW, threads)


@pytest.mark.parametrize(("length", "vector", "threads", "rows_per_block"), [
    (32, 4, 8, 16),  # 8 float4 accesses: 8 threads; 16 rows per block divide 16 x 46875
    (8, 4, 2, 16),  # two vectors, two threads
    (64, 8, 8, 16),  # float16 rows of 64: eight 8-lane vectors
    (30, 2, 16, 16),  # 15 float2 accesses on 16 threads, the last idle
    (128, 4, 32, 8),  # 32 vectors: a full warp, as before
])
def test_short_rows_get_a_thread_per_access(length: int, vector: int, threads: int,
                                            rows_per_block: int) -> None:
    # Rows of 32 float32 on 8 threads (one float4 of loads each) ran the 750000 x 32 row sum
    # in 34.3 us on the H200 against 48.5 us on a warp per row (scalar loads, one in flight).
    mapping = row_mapping(750000, length, 750000, vector=vector)
    assert (mapping.kind, mapping.threads_per_row, mapping.rows_per_block) == (
        MappingKind.WARP_PER_ROW, threads, rows_per_block)


def test_sub_warps_of_a_thread_per_vector_run_and_compile() -> None:
    # 40000 rows of 32 fill the GPU without more threads per row: 8 threads, one float4 each
    model, inputs = patterns.ln_softmax_add(40000, 32)
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert (group.mapping.kind, group.mapping.threads_per_row, group.mapping.vector) == (
        MappingKind.WARP_PER_ROW, 8, 4)
    assert not check_resources(scheduled).violations
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_float16_sub_warps_take_eight_halves_per_thread() -> None:
    # exp(x - max(x)) computes in float16 throughout (a softmax sums in float32 since
    # transform.Float32Reductions, so its widest element takes four lanes)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [40000, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [40000, 64])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Exp", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "shifted_exp_f16", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert (group.mapping.threads_per_row, group.mapping.vector) == (8, 8)
    assert not check_resources(scheduled).violations
    assert verify.summarize(scheduled, model)["ok"]  # onnxruntime, float16 tolerances


def test_packing_keeps_a_block_per_sm_and_divides_the_rows() -> None:
    sms = DEFAULT_GPU.sms
    assert row_mapping(sms * 2, 32, sms * 2).rows_per_block == 2
    assert row_mapping(3000, 32, 3).rows_per_block == 1  # 3000 rows = 3 x 1000: no 2 or 4


def test_flat_mapping() -> None:
    assert flat_mapping(1 << 20).rows_per_block == 256
    assert flat_mapping(40).rows_per_block == 64
    assert flat_mapping(1 << 20).vector == 4  # float4: 1024 blocks of 256 threads
    assert flat_mapping(1 << 20, element_bytes=2).vector == 8  # eight halves: 16 bytes
    assert flat_mapping(1 << 20, element_bytes=8).vector == 2
    assert flat_mapping(999 * 256).vector == 1  # 999 blocks: vectors would not divide
    assert flat_mapping(32768).vector == 1  # 128 blocks: vectors would leave SMs idle


def _small_target(shared: int, threads: int = 1024) -> tvm.target.Target:
    return tvm.target.Target({"kind": "cuda", "arch": "sm_80", "max_num_threads": threads,
                              "max_threads_per_block": threads, "thread_warp_size": 32,
                              "max_shared_memory_per_block": shared})


def test_over_budget_demotes_and_stays_correct() -> None:
    # a warp per row: x (24 elements per thread) is held in registers; gamma and beta are
    # (staged once per block) re-read from global memory and the exponentials recomputed,
    # all within the budget
    model, inputs = patterns.ln_softmax_add(16, 768)
    scheduled, plan = lower_stitch(model, _small_target(4096, threads=32))
    (group,) = plan.groups
    assert group.shared_budget == 4096 and group.shared_bytes <= 4096
    kinds = [(d.kind, d.subject) for d in group.demotions]
    assert kinds[0] == (DemotionKind.HELD_IN_REGISTERS, "x")
    assert (DemotionKind.BLOCK_INPUT_REREAD, "const1") in kinds
    assert any(kind is DemotionKind.RECOMPUTED for kind, _ in kinds)
    again = StitchPlan.from_json(plan.to_json()).groups[0]
    assert again == group and all(type(d) is Demotion for d in again.demotions)
    assert all(type(b.role) is BufferRole for b in again.buffers)
    levels = {b.name: b.level for b in group.buffers}
    assert (levels["x"], levels["const1"]) == (StorageLevel.REGISTER, StorageLevel.GLOBAL)
    assert not check_resources(scheduled).violations
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_a_row_over_budget_is_held_in_registers_and_read_once() -> None:
    # 768 elements over 1024 threads: one register each; x is read at several places (the
    # shared memory counted includes the scratch of the LayerNorm's three row sums)
    model, inputs = patterns.ln_softmax_add(16, 768)
    scheduled, plan = lower_stitch(model, _small_target(4096))
    (group,) = plan.groups
    assert group.demotions[0] == Demotion(DemotionKind.HELD_IN_REGISTERS, "x", used=16320,
                                          budget=4096)
    assert str(group.demotions[0]) == \
        "input x held in registers (16320 B of shared memory > 4096 B)"
    x = next(b for b in group.buffers if b.name == "x")
    assert (x.level, x.note) == (StorageLevel.REGISTER, "1 element(s) of the row per thread")
    (kernel,) = analyze(scheduled).kernels
    assert kernel.traffic.buffers["x"].read_bytes == 16 * 768 * 4  # once
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_log_softmax_row_over_budget_is_read_once_over_whole_steps() -> None:
    # 1000 logits per row over 1024 threads, 2 KB of shared memory: held in registers; the
    # copy runs over whole steps (24 clamped loads per row) instead of testing each one
    model = workloads.get("logsoftmax_nll").model("ci")
    scheduled, plan = lower_stitch(model, _small_target(2048))
    (group,) = plan.groups
    logits = next(b for b in group.buffers if b.name == "logits")
    assert logits.level is StorageLevel.REGISTER
    (kernel,) = analyze(scheduled).kernels
    assert kernel.traffic.buffers["logits"].read_bytes == 32 * (1024 + 1) * 4  # + the target
    assert verify.run_simt(scheduled, model).ok


def test_log_softmax_rows_of_16000_are_read_once_from_registers() -> None:
    # 64 KB rows, over the 48 KB budget: 16 registers per thread (16384 slots, 384 clamped)
    model = micro.logsoftmax_nll((64, 16000))
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    logits = next(b for b in group.buffers if b.name == "logits")
    assert (logits.level, logits.note) == (StorageLevel.REGISTER,
                                           "16 element(s) of the row per thread")
    (kernel,) = analyze(scheduled).kernels
    assert kernel.traffic.buffers["logits"].read_bytes == 64 * (16384 + 1) * 4
    assert verify.run_simt(scheduled, model).ok


def test_schedule_failure_falls_back_to_tvm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = decide_module.kernel

    def failing(func, group):
        if any("softmax" in op for op in group.ops):
            raise RuntimeError("no schedule for you")
        return real(func, group)

    monkeypatch.setattr(decide_module, "kernel", failing)
    model, inputs = patterns.ln_softmax_add(16, 64)
    scheduled, plan = lower_stitch(model)
    assert not plan.groups
    (fallback,) = plan.fallbacks
    assert fallback.ops == ("lv:layer_norm", "lv1:softmax", "gv:add")
    assert fallback.reason == "scheduling failed: no schedule for you"
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_broadcast_multiply_sum_is_stitched() -> None:
    # the attention-score pattern on which dlight's GEMV rule can assert
    model, inputs = patterns.broadcast_mul_sum()
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert group.ops == ("lv:multiply", "gv:sum")
    (func,) = stitched_functions(scheduled).items()
    assert kernel_count(func[1], func[0]) == 1
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_grouping_error_gives_up_stitching_not_the_compile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tvm_stitch.transform.stitch_fuse as stitch_fuse

    def broken(*_args, **_kwargs):
        raise RuntimeError("unexpected IR")

    monkeypatch.setattr(stitch_fuse, "draft_plan", broken)
    model, inputs = patterns.ln_softmax_add(16, 64)
    scheduled, plan = lower_stitch(model)
    assert not plan.groups
    assert plan.notes == ("stitching gave up (RuntimeError: unexpected IR): TVM's fusion only",)
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_reshaped_values_kept_in_registers_are_not_vectorised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # exp(x) kept in registers and read back through a reshape (an index divided by the row
    # length): a register copy for a vector of four would cover a box of rows, so the group
    # keeps one element per thread; the kernel stays countable and right. It reads x twice
    # where TVM's fusion reads it once, so the yardstick sends it back to TVM (checked last);
    # here the yardstick is set aside to see the kernel.
    shape = numpy_helper.from_array(np.array([64 * 4096], np.int64), "shape")
    nodes = [helper.make_node("Exp", ["x"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["b"]),
             helper.make_node("Reshape", ["x", "shape"], ["c"]),
             helper.make_node("Mul", ["b", "c"], ["d"]),
             helper.make_node("Add", ["d", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "reshaped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64 * 4096])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with monkeypatch.context() as patch:
        patch.setattr(Yardstick, "excess", lambda *_: None)
        scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert group.mapping.kind is MappingKind.FLAT and group.mapping.vector == 1
    assert any(b.level is StorageLevel.REGISTER for b in group.buffers)
    assert analyze(scheduled).traffic_ratio == pytest.approx(1.5)  # x read twice, not staged
    inputs = {"x": np.random.default_rng(0).standard_normal((64, 4096)).astype("float32")}
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))
    scheduled, plan = lower_stitch(model)
    assert not plan.groups and "TVM's fusion of the same ops" in plan.fallbacks[0].reason
    assert analyze(scheduled).traffic_ratio == pytest.approx(1.0)


def _cuda_source(scheduled: tvm.IRModule) -> str:
    return "\n".join(lower(func, name, cuda_target("sm_90")).source()
                     for name, func in stitched_functions(scheduled).items())


def _global_float4_stores(source: str) -> list[str]:
    return [name for name in re.findall(r"\*\(float4\*\)\((\w+)_ptr \+ [^;]*\) = ", source)
            if not name.endswith("_shared")]


@pytest.mark.parametrize("pattern", [patterns.softmax, patterns.layer_norm, patterns.rms_norm])
@pytest.mark.parametrize("length", [64, 768])  # 768 over 1024 threads: 192 vectors, the
def test_row_kernels_load_and_store_float4(pattern, length: int) -> None:  # rest idle
    model, inputs = pattern(16, length)
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    assert group.mapping.vector == 4 and "4 elements per access" in str(group.mapping)
    source = _cuda_source(scheduled)
    assert "*(float4*)(x_ptr + " in source
    assert _global_float4_stores(source)
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def test_odd_rows_and_misaligned_accesses_stay_scalar() -> None:
    model, inputs = patterns.softmax(16, 255)
    scheduled, plan = lower_stitch(model)
    assert plan.groups[0].mapping.vector == 1
    assert not re.search(r"\(float[24]\*\)", _cuda_source(scheduled))
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))
    # the row starts aligned but is read from its second element on: that read stays
    # scalar, a thread per element, the rest of the kernel (shared memory, the output) takes float4
    bounds = [numpy_helper.from_array(np.array([v], np.int64), n)
              for n, v in (("starts", 1), ("ends", 65), ("axes", 1))]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "sliced", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 68])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])], bounds)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    scheduled, plan = lower_stitch(model)
    assert plan.groups[0].mapping.vector == 4
    source = _cuda_source(scheduled)
    assert "x_ptr[" in source and "(float4*)(x_ptr" not in source
    assert "make_float4(x_ptr[" not in source  # not a vector read lane by lane
    assert _global_float4_stores(source)
    inputs = {"x": np.random.default_rng(0).standard_normal((16, 68)).astype("float32")}
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


@T.prim_func(private=True, s_tir=True)
def _mean_to_scalar(x: T.Buffer((1, 8), "float32"), y: T.Buffer((), "float32")):
    x_red = T.sblock_alloc_buffer(())
    for k0, k1 in T.grid(1, 8):
        with T.sblock("x_red"):
            v_k0, v_k1 = T.axis.remap("RR", [k0, k1])
            with T.init():
                x_red[()] = T.float32(0)
            x_red[()] = x_red[()] + x[v_k0, v_k1]
    with T.sblock("y"):
        y[()] = x_red[()] / T.float32(8)


def test_a_rule_that_leaves_host_loops_is_skipped() -> None:
    """dlight's GeneralReduction binds a reduction to a scalar inside serial loops (a kernel
    launch per element from the host); such a schedule does not count (fuzz seeds 2, 3, 5)."""
    target = parse_target(DEFAULT_TARGET)
    assert "loop" in host_code(dl.gpu.GeneralReduction().apply(_mean_to_scalar, target,
                                                                False).mod["main"])
    assert schedule_func(_mean_to_scalar, target, [dl.gpu.GeneralReduction()]) is None
    assert not host_code(schedule_func(_mean_to_scalar, target, default_rules()))


def test_one_thread_kernels_run_any_function() -> None:
    scheduled = one_thread_kernels(_mean_to_scalar)
    assert not host_code(scheduled)
    f = SimtFunction.from_primfunc(scheduled, "mean")
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    y = np.zeros((), np.float32)
    f(x, y)
    np.testing.assert_allclose(y, x.mean(), rtol=1e-6)


def test_a_fallback_no_rule_schedules_runs_and_the_plan_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tvm_stitch.schedule.rule as rule
    import tvm_stitch.transform.passes as passes

    monkeypatch.setattr(rule, "default_rules", lambda: [dl.gpu.GeneralReduction()])
    # without UnitReduction the mean over (1, 8) falls back (its unit reduction iterator
    # sits among the rows), and GeneralReduction alone leaves a host loop for it
    monkeypatch.setattr(passes, "UnitReduction", lambda: tvm.transform.module_pass(
        lambda mod, _ctx: mod, opt_level=0, name="NoUnitReduction"))
    model = helper.make_model(helper.make_graph(
        [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)], "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        initializer=[numpy_helper.from_array(np.array([0, 1], np.int64), "axes")]),
        opset_imports=[helper.make_opsetid("", 18)])
    scheduled, plan = lower_stitch(model)
    assert any("one thread per loop nest" in note for note in plan.notes), plan.notes
    inputs = {"x": np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)}
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))
