"""Row reductions over a symbolic length (a sequence known only at run time): the row is
walked in a loop of run-time extent, guarded, and what cannot be sized is re-read from global
memory or recomputed. One compile serves every length, matches onnxruntime on the SIMT
runner, and never needs more kernels or bytes than TVM's fusion at the same size."""

from __future__ import annotations

import functools

import onnx
import pytest
import stitch_patterns as patterns
from stitch_helpers import compile_cuda, lower_stitch, spills, stack_frames, stitched_functions

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.lowering import lower
from tvm_stitch.plan import MappingKind, StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions.choosing import choosing
from tvm_stitch.target import cuda_target
from tvm_stitch.tuning.space import Sampling


def named_dims(model: onnx.ModelProto, names: dict[int, str], inputs: dict[str, dict[int, str]]
               | None = None) -> onnx.ModelProto:
    """``model`` with dimension ``i`` of every graph output, and of every input not listed
    in ``inputs``, named ``names[i]`` (an ONNX dim_param); ``inputs`` names other dimensions
    for the inputs it lists (a mask's broadcast axes stay 1)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in (*out.graph.input, *out.graph.output):
        dims = value.type.tensor_type.shape.dim
        for i, name in (inputs or {}).get(value.name, names).items():
            dims[i].dim_param = name
    onnx.checker.check_model(out)
    return out


def _softmax() -> onnx.ModelProto:
    return named_dims(patterns.softmax(16, 64)[0], {1: "length"})


def _attention() -> onnx.ModelProto:
    """Scores (batch, 2, seq, seq) scaled, masked by (batch, 1, 1, seq) and softmaxed: every
    dimension that a model exported with dynamic axes leaves symbolic."""
    return named_dims(patterns.scale_mask_softmax(2, 2, 16)[0],
                      {0: "batch", 2: "seq", 3: "seq"}, {"mask": {0: "batch", 3: "seq"}})


def _log_softmax() -> onnx.ModelProto:
    base, _ = patterns.log_softmax_nll(16, 32)
    model = onnx.ModelProto()
    model.CopyFrom(base)
    del model.graph.node[1:]  # the log-softmax alone: its output is (n, classes)
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(
        "lp", onnx.TensorProto.FLOAT, [16, "classes"]))
    del model.graph.input[1:]
    del model.graph.initializer[:]
    return named_dims(model, {1: "classes"})


CASES = {
    # name: (model, the sizes each compiled module runs at)
    "softmax": (_softmax, [{"length": n} for n in (1, 7, 64, 300, 5003)]),
    "attention": (_attention, [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 13},
                               {"batch": 3, "seq": 64}, {"batch": 1, "seq": 200}]),
    "log_softmax": (_log_softmax, [{"classes": n} for n in (2, 31, 1000)]),
}


@functools.cache
def _compiled(case: str, flow: str):
    model = {**CASES, **MIDDLE_AXIS}[case][0]()
    return model, pipeline.lower(import_model(model), cuda_target(), flow)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_symbolic_row_length_is_one_stitched_kernel(case: str) -> None:
    _, scheduled = _compiled(case, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and len(plan.groups) == 1, str(plan)
    mapping = plan.groups[0].mapping
    assert mapping.length_expr and mapping.kind is MappingKind.BLOCK_PER_ROW
    assert "(symbolic, mapped for" in str(plan)
    assert not any(b.level is StorageLevel.SHARED for b in plan.groups[0].buffers), str(plan)


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_compile_serves_every_length(case: str) -> None:
    _serves_every_size(case, CASES[case][1])


def _serves_every_size(case: str, sizes: list[dict[str, int]]) -> None:
    """The stitched compile of ``case`` matches onnxruntime at each of ``sizes``, with no more
    kernels or global bytes than TVM's fusion there."""
    model, stitched = _compiled(case, "stitch")
    _, baseline = _compiled(case, "baseline")
    for dims in sizes:
        ours = verify.summarize(stitched, model, dims=dims)
        tvms = verify.summarize(baseline, model, dims=dims)
        assert ours["ok"], (dims, ours)
        assert ours["kernels"] <= tvms["kernels"], (dims, ours, tvms)
        assert ours["global_bytes"] <= tvms["global_bytes"], (dims, ours, tvms)


def test_staged_inputs_are_reread_and_intermediates_recomputed() -> None:
    plan = StitchPlan.of_module(_compiled("softmax", "stitch")[1])
    (group,) = plan.groups
    (x,) = [b for b in group.buffers if b.name == "x"]
    assert x.level is StorageLevel.GLOBAL and "symbolic row length" in x.note
    assert group.inlined and not group.demotions


def test_a_symbolic_length_is_not_split_over_blocks() -> None:
    """16 rows fill few SMs, but a row of unknown length is not split into sub-rows."""
    plan = StitchPlan.of_module(_compiled("softmax", "stitch")[1])
    assert plan.groups[0].row_split == 1 and not plan.groups[0].phases


def _attention_pooling() -> onnx.ModelProto:
    """DIEN's attention pooling: a softmax over the sequence of (batch, seq) scores weighs
    (batch, seq, 32) behaviours, summed over the sequence (a middle axis)."""
    axes = onnx.helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [1])
    last = onnx.helper.make_tensor("last", onnx.TensorProto.INT64, [1], [2])
    nodes = [onnx.helper.make_node("Softmax", ["scores"], ["w"], axis=-1),
             onnx.helper.make_node("Unsqueeze", ["w", "last"], ["w3"]),
             onnx.helper.make_node("Mul", ["w3", "values"], ["weighted"]),
             onnx.helper.make_node("ReduceSum", ["weighted", "axes"], ["out"], keepdims=0)]
    vi = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        nodes, "attention_pooling",
        [vi("scores", onnx.TensorProto.FLOAT, ["batch", "seq"]),
         vi("values", onnx.TensorProto.FLOAT, ["batch", "seq", 32])],
        [vi("out", onnx.TensorProto.FLOAT, ["batch", 32])], [axes, last])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


MIDDLE_AXIS = {
    # name: (model, the sizes each compiled module runs at)
    "attention_pooling": (_attention_pooling, [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 13},
                                               {"batch": 2, "seq": 300}]),
    "middle_axis_sum": (lambda: named_dims(patterns.middle_axis_sum(4, 8, 16)[0], {},
                                           {"x": {1: "seq"}}),
                        [{"seq": n} for n in (1, 7, 61)]),
}


@pytest.mark.parametrize("case", sorted(MIDDLE_AXIS))
def test_a_sum_over_a_symbolic_middle_axis_is_a_stitched_row_reduction(case: str) -> None:
    """The sum reduces rows of a transposed view (``mixed_reductions``) walked with a run-time
    extent; the transposes that only move axes of extent 1 stay views of the rows."""
    plan = StitchPlan.of_module(_compiled(case, "stitch")[1])
    assert not plan.fallbacks, str(plan)
    sums = [g for g in plan.groups if any(op.endswith(":sum") for op in g.ops)]
    assert len(sums) == 1 and sums[0].mapping.length_expr == "seq", str(plan)
    _serves_every_size(case, MIDDLE_AXIS[case][1])


def test_a_column_reduction_over_a_symbolic_length_is_global_on_run_time_tiles() -> None:
    """A column mean over a run-time batch, subtracted from every row: the mean's partial
    sums per row tile of at least 8 rows, a grid barrier, the rows again; right from one row
    to more than a wave of tiles of 8 (4224 x 8 = 33792 rows)."""
    model = named_dims(patterns.column_mean_center(16, 64)[0], {0: "batch"})
    scheduled, plan = lower_stitch(model)
    assert not plan.fallbacks, str(plan)
    (group,) = plan.groups
    assert group.mapping.rows_expr == "batch" and group.mapping.row_tiles, str(plan)
    for batch in (1, 17, 40000):
        assert verify.summarize(scheduled, model, dims={"batch": batch})["ok"], batch


def test_a_column_phase_of_a_partial_task_over_run_time_tiles_falls_back() -> None:
    """Column sums of fewer columns than a block's threads (4 on 32) over a wave of
    run-time tiles: the traffic counter cannot bound the partial task's guard, and the
    group falls back, saying so. (Until the stores of register sums were guarded, such
    sums were summed in place in global memory, and fell back as that.)"""
    model = named_dims(patterns.column_mean_center(16, 4)[0], {0: "batch"})
    _, plan = lower_stitch(model)
    assert any("symbolic row count" in f.reason and "the last one partial" in f.reason
               for f in plan.fallbacks), str(plan)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", ["attention", "attention_pooling", "softmax"])
def test_symbolic_length_kernels_compile_without_spills(case: str, arch: str) -> None:
    scheduled = _compiled(case, "stitch")[1]
    for name, func in stitched_functions(scheduled).items():
        report = compile_cuda(lower(func, name, cuda_target(arch)).source(), arch)
        found = spills(report)
        assert found and all(s == (0, 0) for s in found), report
        assert all(frame == 0 for frame in stack_frames(report)), report


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_random_candidate_serves_every_length(seed: int) -> None:
    model = _attention()
    sampling = Sampling(seed=seed)
    with choosing(sampling):
        scheduled = pipeline.lower(import_model(model), cuda_target(), "stitch")
    assert [c for c in sampling.drawn.values() if c is not None], "no candidate drawn"
    plan = StitchPlan.of_module(scheduled)
    assert plan.groups[0].mapping.length_expr, str(plan)
    for dims in CASES["attention"][1]:
        assert verify.run_simt(scheduled, model, dims=dims).ok, (seed, dims, str(plan))


def test_a_broadcast_to_a_shape_that_no_input_of_the_group_gives_is_stitched() -> None:
    """``Expand(x, Shape(y))`` of a (batch, 1, 32) ``x`` to (batch, seq, 32), then exp and
    sigmoid: no tensor the group reads has ``seq`` in its shape (TVM binds it from the output
    it passes), so the group's function takes it as a shape value."""
    vi = onnx.helper.make_tensor_value_info
    nodes = [onnx.helper.make_node("Shape", ["y"], ["s"]),
             onnx.helper.make_node("Expand", ["x", "s"], ["e"]),
             onnx.helper.make_node("Exp", ["e"], ["ex"]),
             onnx.helper.make_node("Sigmoid", ["ex"], ["out"])]
    graph = onnx.helper.make_graph(
        nodes, "broadcast_to_shape",
        [vi("x", onnx.TensorProto.FLOAT, ["batch", 1, 32]),
         vi("y", onnx.TensorProto.FLOAT, ["batch", "seq", 32])],
        [vi("out", onnx.TensorProto.FLOAT, ["batch", "seq", 32])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    stitched = pipeline.lower(import_model(model), cuda_target(), "stitch")
    plan = StitchPlan.of_module(stitched)
    assert not plan.fallbacks and len(plan.groups) == 1 and plan.groups[0].inputs == ("x",), \
        str(plan)
    for dims in ({"batch": 1, "seq": 1}, {"batch": 3, "seq": 13}, {"batch": 2, "seq": 500}):
        assert verify.summarize(stitched, model, dims=dims)["ok"], dims
