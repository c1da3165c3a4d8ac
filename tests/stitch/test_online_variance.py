"""Online variance (``transform.online_variance``): a row's sum and its sum of squares about
the mean as one reduction of (squares, mean, count) triples, so a row split over several
blocks is read once for both and its partials combined after one grid barrier.

A LayerNorm over the last three axes of a transposed (8, 64, 56, 56) tensor (fuzz graph
12017:395, while shrinking) split its rows of 25088 over two blocks of 1024 threads and
took three phases, a grid barrier after the partial sums and another after the partial
squares; its permuted addresses then wanted more than the 64 registers a thread of 1024
may use, and spilled 16 B on sm_90. Online: two phases, one barrier, no spill. A GroupNorm
(2, 320, 64, 64) in 32 groups drops a grid barrier the same way. A batch norm's column
mean and variance over (16384, 1024) read the input three times in five phases (four grid
barriers); online, each row tile's partial triples are combined in one column phase: the
input read twice, two barriers. Rows on chip keep their two passes (no memory to save)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from stitch_helpers import assert_matches, compiled_choosing, reference, single_task

from tvm_stitch.analysis import analyze
from tvm_stitch.plan import Choices
from tvm_stitch.schedule.blocks import prepare
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.simt import SimtModule
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform.online_variance import VarianceTriple, find_variance_triples
from tvm_stitch.tuning.space import choice_space
from tvm_stitch.workloads import get, micro


def _compiled(model: onnx.ModelProto, online: bool | None = None):
    return compiled_choosing(model, None if online is None else Choices(online_variance=online))


def _model(nodes: list, shape: list[int], initializers: list, out_shape=None
           ) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or shape)
    graph = helper.make_graph(nodes, "g", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _layer_norm(shape: list[int], axis: int = -1) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    normalised = shape[axis:]
    scale = numpy_helper.from_array(
        (1 + 0.1 * rng.standard_normal(normalised)).astype("float32"), "g")
    shift = numpy_helper.from_array((0.1 * rng.standard_normal(normalised)).astype("float32"),
                                    "b")
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axis)
    return _model([node], shape, [scale, shift])


def _variance(square: str, divisor: float | None = None) -> onnx.ModelProto:
    """mean((x - mean(x))^2) over rows of 64, the square as ``Mul`` or ``Pow``; the mean
    divided by ``divisor`` (a Div node) instead of a ReduceMean when given."""
    axes = numpy_helper.from_array(np.array([1], "int64"), "axes")
    two = numpy_helper.from_array(np.array(2, "float32"), "two")
    inits = [axes, two]
    if divisor is None:
        nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1)]
    else:
        inits.append(numpy_helper.from_array(np.array(divisor, "float32"), "n"))
        nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
                 helper.make_node("Div", ["s", "n"], ["m"])]
    nodes.append(helper.make_node("Sub", ["x", "m"], ["d"]))
    nodes.append(helper.make_node("Mul", ["d", "d"], ["q"]) if square == "Mul"
                 else helper.make_node("Pow", ["d", "two"], ["q"]))
    nodes.append(helper.make_node("ReduceMean", ["q", "axes"], ["y"], keepdims=1))
    return _model(nodes, [8, 64], inits, [8, 1])


def test_the_triples_of_a_layer_norm_a_group_norm_and_a_batch_norm() -> None:
    (ln,) = find_variance_triples(prepare(single_task(micro.layer_norm((8, 256))).func))
    assert ln == VarianceTriple("x_sum", "x_mean", "x_var_sum", "x_dev_sum")
    (bn,) = find_variance_triples(prepare(single_task(micro.batchnorm_train((64, 32))).func))
    assert bn.deviations == ""
    for square in ("Mul", "Pow"):
        (triple,) = find_variance_triples(prepare(single_task(_variance(square)).func))
        assert triple.deviations == ""


def test_no_triple_without_a_mean() -> None:
    """Squares about a sum divided by another count than the row's, or an RMSNorm's plain
    mean of squares, are no variance."""
    assert find_variance_triples(prepare(single_task(_variance("Mul", 65.0)).func)) == []
    assert len(find_variance_triples(prepare(single_task(_variance("Mul", 64.0)).func))) == 1
    assert find_variance_triples(prepare(single_task(micro.rms_norm((8, 256))).func)) == []


@functools.cache
def _transposed_layer_norm():
    """Fuzz graph 12017:395's LayerNorm: over the last three axes of Transpose(x, [1, 2, 3,
    0]) of (8, 64, 56, 56), with a Tanh of the same transpose."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((56, 56, 8)).astype("float32"), n)
             for n in ("g", "b")]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 3, 0]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["y"], axis=-3),
             helper.make_node("Tanh", ["t"], ["z"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64, 56, 56])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 56, 56, 8])
            for n in ("y", "z")]
    graph = helper.make_graph(nodes, "g", [x], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_split_layer_norm_takes_one_grid_barrier_and_fits_its_registers() -> None:
    model = _transposed_layer_norm()
    _, plan = _compiled(model)
    (group,) = plan.groups
    assert group.online_variance == ("x_sum",) and group.row_split == 2, str(plan)
    assert group.grid_barriers == 1, str(plan)
    assert "online variance: x_sum" in str(plan)
    _, two_pass = _compiled(model, online=False)
    assert two_pass.groups[0].grid_barriers == 2, str(two_pass)
    outcome = check_model(model, "stitch", cost=True)
    assert outcome.kind == "ok" and not outcome.violations, outcome


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_split_rows_match_onnxruntime_with_constant_rows(offset: float) -> None:
    """Rows of 65536 split over blocks, far from zero or not: each block's (squares, mean,
    count) combined after one barrier. A row of one repeated value normalises to exactly
    the shift, as in onnxruntime (and in the corrected two passes): an empty partial's
    mean is replaced, never averaged."""
    model = _layer_norm([4, 65536])
    scheduled, plan = _compiled(model)
    (group,) = plan.groups
    assert group.online_variance and group.row_split > 1 and group.grid_barriers == 1, \
        str(plan)
    rng = np.random.default_rng(0)
    x = (offset + rng.standard_normal((4, 65536))).astype("float32")
    x[1] = np.float32(offset + 0.1)
    (out,) = SimtModule(scheduled)(x)
    (ref,) = reference(model, {"x": x})
    shift = numpy_helper.to_array(model.graph.initializer[1])
    np.testing.assert_array_equal(out[1], shift)
    if offset == 0.0:
        assert_matches([out], [ref])
    else:  # x - mean loses the low bits of x near 1000 in float32, as in the two passes
        two_pass, _ = _compiled(model, online=False)
        (base,) = SimtModule(two_pass)(x)
        assert np.abs(out - ref).max() <= 2 * np.abs(base - ref).max() + 1e-6


def test_rows_on_chip_keep_two_passes() -> None:
    _, plan = _compiled(micro.layer_norm((64, 768)))
    assert plan.groups[0].online_variance == (), str(plan)


@pytest.mark.parametrize("offset", [0.0, 100.0])
def test_a_batch_norm_reads_its_input_twice(offset: float) -> None:
    """The column mean and variance of (4096, 512): the partial triples of each row tile
    kept in shared memory, written out and combined per column in registers; the mean
    staged for the output phase."""
    model = micro.batchnorm_train((4096, 512))
    scheduled, plan = _compiled(model)
    (group,) = plan.groups
    assert group.online_variance == ("x_red",), str(plan)
    assert [p.kind.value for p in group.phases] == ["rows", "columns", "rows"], str(plan)
    (kernel,) = analyze(scheduled).kernels
    x = kernel.traffic.buffers["x"]
    assert x.read_bytes == 2 * x.size_bytes
    _, two_pass = _compiled(model, online=False)
    assert len(two_pass.groups[0].phases) == 5, str(two_pass)
    rng = np.random.default_rng(0)
    x = (offset + rng.standard_normal((4096, 512))).astype("float32")
    outs = SimtModule(scheduled)(x)
    if offset == 0.0:
        assert_matches(outs, reference(model, {"x": x}))
        return
    # far from zero a float32 mean of 4096 values is some ulps off in every flow
    # (onnxruntime's too): against float64, the online kernel errs no more than the two
    # passes on the output, and its variance stays within 1e-4
    exact = x.astype("float64")
    mean, var = exact.mean(0), exact.var(0)
    twice = SimtModule(_compiled(model, online=False)[0])(x)
    assert np.abs(outs[0] - _normalised(model, exact, mean, var)).max() <= 2 * np.abs(
        twice[0] - _normalised(model, exact, mean, var)).max()
    np.testing.assert_allclose(outs[2][0], var, rtol=1e-4)


def _normalised(model: onnx.ModelProto, x: np.ndarray, mean: np.ndarray, var: np.ndarray
                ) -> np.ndarray:
    params = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return (x - mean) / np.sqrt(var + micro.EPS) * params["gamma"] + params["beta"]


def test_online_variance_is_a_choice_refused_without_a_variance() -> None:
    task = single_task(_layer_norm([4, 65536]))
    rules = decide(task.func, task.group, task.rows, task.target).group
    assert Choices(online_variance=False) in choice_space(rules, 1024)
    softmax = single_task(micro.softmax((8, 1000)))
    with pytest.raises(Unstitchable, match="sum and sum of squares"):
        decide(softmax.func, softmax.group, softmax.rows, softmax.target,
               Choices(online_variance=True))


@pytest.mark.parametrize("name", ["layer_norm", "add_layer_norm", "group_norm_silu"])
def test_chosen_online_variance_on_chip_matches_onnxruntime(name: str) -> None:
    """Chosen where the rules keep two passes, with rows on chip: the triples are combined
    across a block's threads (warp shuffles, then shared memory)."""
    model = get(name).model("ci")
    scheduled, plan = _compiled(model, online=True)
    assert plan.groups[0].online_variance, str(plan)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in
                                          i.type.tensor_type.shape.dim]).astype("float32")
             for i in model.graph.input}
    outs = SimtModule(scheduled)(*feeds.values())
    assert_matches(outs, reference(model, feeds))


def test_a_float16_layer_norm_of_one_row_runs_on_the_simt_runner() -> None:
    """Fuzz graph 4242:1236's float16 LayerNorm over one row of 2048, then a float32
    softmax: in one pass, one block. Its count of one element was declared with
    decl_buffer's default layout, a scalar that TVMScript printed as ``X.source[i]`` and
    the SIMT runner's float16 retyping could not parse back (as the split variance's
    copies once were, ``task_split.combine_per_reader``)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 2048).astype("float16"), "g"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, 2048).astype("float16"), "b")]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=1),
             helper.make_node("Cast", ["n"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Softmax", ["c"], ["s"], axis=1),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT16)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 2048])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2048])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    _, plan = _compiled(model)
    assert plan.groups[0].online_variance == ("x_sum",), str(plan)
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
