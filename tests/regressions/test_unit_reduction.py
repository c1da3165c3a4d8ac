"""A reduction over an axis of extent 1 followed by element-wise ops gave wrong numbers in
both flows (fuzz case g350: ``Pow(Abs(ReduceMean(Reshape(x (2, 1) -> (1, 2, 1)), axes=[0]))
+ 0.5, 2)``): FuseOps and FuseTIR make a correct kernel of the mean and its epilogue, but
dlight's default schedule inlines the epilogue into the reduction block, whose unit
reduction loop is gone, so it applies it to the accumulator (init and update). The stitch
flow now rewrites such reductions into reshapes before legalisation
(``transform.UnitReduction``); TVM's own flow stays wrong. Owner:
transform/unit_reduction.py."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from regression_models import global_bytes, model, needs_stitch
from tvm import relax

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.plan import StitchPlan
from tvm_stitch.simt import SimtModule
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform.unit_reduction import UnitReduction

pytestmark = needs_stitch

REDUCERS = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max,
            "ReduceMin": np.min, "ReduceProd": np.prod}


def _reduce_then_square(op: str, keepdims: int) -> tuple:
    """``(|op(reshape(x), axis 0)| + 0.5) ** 2`` of x (2, 1) reshaped to (1, 2, 1), as in g350."""
    out = [1, 2, 1] if keepdims else [2, 1]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node(op, ["r", "axes"], ["m"], keepdims=keepdims),
             helper.make_node("Abs", ["m"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("Pow", ["b", "two"], ["y"])]
    return model(nodes, {"x": [2, 1]}, {"y": out},
                 {"shape": np.array([1, -1, 1], np.int64), "axes": np.array([0], np.int64),
                  "half": np.array(0.5, np.float32), "two": np.array(2.0, np.float32)}), out


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", sorted(REDUCERS))
def test_a_reduction_over_a_unit_axis_then_element_wise_ops(op: str, keepdims: int) -> None:
    built, out = _reduce_then_square(op, keepdims)
    x = np.array([[0.125], [-0.25]], np.float32)
    expected = (np.abs(REDUCERS[op](x.reshape(1, 2, 1), axis=0)) + 0.5) ** 2
    (y,) = SimtModule(verify.compile_model(built, "stitch"))(x)
    np.testing.assert_allclose(y, expected.reshape(out), rtol=1e-6)


@pytest.mark.xfail(strict=True, reason="TVM's: dlight inlines the epilogue of a reduction "
                   "over a unit axis into the reduction block (applied to the accumulator)")
def test_tvm_default_flow_is_wrong_on_the_same_graph() -> None:
    built, _ = _reduce_then_square("ReduceMean", 0)
    x = np.array([[0.125], [-0.25]], np.float32)
    (y,) = SimtModule(verify.compile_model(built, "baseline"))(x)
    np.testing.assert_allclose(y, (np.abs(x) + 0.5) ** 2, rtol=1e-6)


def _rewritten(op, shape: list[int], **attrs) -> relax.Function:
    """``main`` after UnitReduction of ``op`` (a relax.op reduction) on a tensor of ``shape``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(op(x, **attrs))
        bb.emit_func_output(y)
    return UnitReduction()(bb.get())["main"]


def _ops(func: relax.Function) -> list[str]:
    return [b.value.op.name for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call)]


@pytest.mark.parametrize("op", [relax.op.sum, relax.op.mean, relax.op.max, relax.op.min,
                                relax.op.prod])
def test_unit_reductions_become_reshapes(op) -> None:
    assert _ops(_rewritten(op, [1, 4, 1], axis=[0, 2])) == ["relax.reshape"]
    assert _ops(_rewritten(op, [1, 1])) == ["relax.reshape"]  # all axes, to a scalar
    # kept dimensions: the result is the input itself
    assert _ops(_rewritten(op, [4, 1], axis=[-1], keepdims=True)) == []
    assert _ops(_rewritten(op, [4, 2], axis=[1])) == [f"relax.{op.__name__}"]


def test_reductions_over_unit_and_longer_axes_reduce_the_longer_ones() -> None:
    # a unit reduction iterator sat among the block's rows: the group fell back with
    # "block lv2_red does not iterate over the 1 rows first" (fuzz graph 4242:4)
    for op, attrs in ((relax.op.sum, {"axis": [0, 1]}), (relax.op.mean, {})):
        func = _rewritten(op, [1, 4], **attrs)
        assert _ops(func) == [f"relax.{op.__name__}", "relax.reshape"]
        (reduce, _) = [b.value for block in func.body.blocks for b in block.bindings]
        assert [int(a) for a in reduce.attrs.axis] == [1] and reduce.attrs.keepdims


def test_reductions_over_longer_or_symbolic_axes_stay() -> None:
    assert _ops(_rewritten(relax.op.sum, [2, 4], axis=[0, 1])) == ["relax.sum"]
    n = tvm.tirx.Var("n", "int64")
    assert _ops(_rewritten(relax.op.max, [n, 4], axis=[0])) == ["relax.max"]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", sorted(REDUCERS))
def test_a_reduction_over_a_unit_and_a_long_axis_stitches(op: str, keepdims: int) -> None:
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node(op, ["a", "axes"], ["m"], keepdims=keepdims),
             helper.make_node("Tanh", ["x"], ["t"])]
    out = [1, 1] if keepdims else []
    built = model(nodes, {"x": [1, 1024]}, {"m": out, "t": [1, 1024]},
                  {"axes": np.array([0, 1], np.int64)})
    scheduled = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert all("single injective" in f.reason for f in plan.fallbacks), plan.fallbacks
    x = np.random.default_rng(0).uniform(0.95, 1.05, (1, 1024)).astype(np.float32)
    m, t = SimtModule(scheduled)(x)
    np.testing.assert_allclose(m, REDUCERS[op](np.abs(x)).reshape(out), rtol=1e-5)
    np.testing.assert_allclose(t, np.tanh(x), rtol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", [([1, 100], 0), ([128, 1], 1)])
def test_a_softmax_over_a_unit_axis_is_one_or_zero(op: str, shape: list[int], axis: int) -> None:
    # fuzz graphs 4242:73 (large 0.05), LogSoftmax over axis 0 of (1, 100): "keeps a spatial
    # axis inside its reduction"; and :54, over the last axis of a (128, 1) mean: "does not
    # iterate over the 1 rows first". Both fell back.
    built = model([helper.make_node("Abs", ["x"], ["a"]),
                   helper.make_node(op, ["a"], ["y"], axis=axis)], {"x": shape}, {"y": shape})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert all("single injective" in f.reason for f in plan.fallbacks), plan.fallbacks
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok", outcome.error


@pytest.mark.parametrize("a,b,dtype", [([4, 1], [1, 64], np.float32),
                                       ([2, 4, 1], [2, 1, 8], np.float32),
                                       ([257, 1], [1, 16], np.float16)])
def test_a_matmul_over_an_inner_dimension_of_one_is_a_multiply(a: list[int], b: list[int],
                                                                dtype: type) -> None:
    # fuzz graph 4242:1010 (large 0.05), shrunk: MatMul (4, 1) x (1, 64) -> Abs -> Add 0.5 ->
    # Pow 2 was wrong in both flows (max error 0.61): dlight applied the epilogue to the
    # accumulator of a reduction loop of extent 1. Fuzz graph 7321:865: the same over float16,
    # which the importer multiplies in float32 (max error 1.15)
    out = [*a[:-1], b[-1]]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Abs", ["m"], ["p"]),
             helper.make_node("Add", ["p", "half"], ["q"]),
             helper.make_node("Pow", ["q", "two"], ["y"])]
    built = model(nodes, {"x": a}, {"y": out},
                  {"w": np.linspace(-1.0, 1.0, int(np.prod(b)), dtype=dtype).reshape(b),
                   "half": np.array(0.5, dtype), "two": np.array(2.0, dtype)},
                  elem_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.compute, plan  # no matmul kernel: a multiply, stitched with its epilogue
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok", outcome.error


@pytest.mark.parametrize("shape,axis", [([8, 125, 1], -1), ([1, 1], -1), ([1, 255], -2),
                                        ([4, 1, 96], -2)])
def test_a_layer_norm_over_unit_axes_stitches(shape: list[int], axis: int) -> None:
    # fuzz graphs 4242:152, :204 (a LayerNorm over a last axis of 1: its sum "does not
    # iterate over the 1000 rows first") and 4242:210 (over (1, 255) with axis -2)
    norm = shape[axis:]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=axis),
             helper.make_node("Abs", ["n"], ["y"])]
    built = model(nodes, {"x": shape}, {"y": shape},
                  {"g": np.linspace(0.5, 1.5, int(np.prod(norm)), dtype=np.float32)
                   .reshape(norm),
                   "b": np.linspace(-0.5, 0.5, int(np.prod(norm)), dtype=np.float32)
                   .reshape(norm)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not [f for f in plan.fallbacks if "nothing to stitch" not in f.reason], plan
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "LayerNormalization"])
def test_a_reduction_over_a_unit_axis_of_an_infinite_value_is_nan(op: str) -> None:
    # exp(x - x) of an infinite x is NaN (onnxruntime's softmax too); written as x - x, TVM's
    # simplifier folded it to 0, and the stitch flow gave 1 (0 for the log-softmax, beta for
    # the layer norm, written x * 0 * gamma + beta)
    node = (helper.make_node(op, ["a", "g", "b"], ["y"], axis=1) if op == "LayerNormalization"
            else helper.make_node(op, ["a"], ["y"], axis=1))
    built = model([helper.make_node("Abs", ["x"], ["a"]), node], {"x": [8, 1]}, {"y": [8, 1]},
                  {"g": np.array([1.5], np.float32), "b": np.array([0.25], np.float32)}
                  if op == "LayerNormalization" else None)
    x = np.array([[1.0], [-2.0], [np.inf], [-np.inf], [np.nan], [0.0], [3.0], [1e30]],
                 np.float32)
    outcome = check_model(built, "stitch", triage=False, feeds={"x": x}, resources=False)
    assert outcome.kind == "ok", outcome.error


def test_a_reduction_rewritten_to_a_value_already_bound_stitches_with_its_reader() -> None:
    # fuzz graph 11003:403: a mean over both axes of a (1, 7) transpose is a mean over the 7,
    # bound to the mean's own name as an alias of it; grouping saw the alias as an op outside
    # every group, so the mean's result left its group, and the mean and its reader (Where)
    # were stitched apart: 3 kernels where TVM's flow runs 2 (``rewrite.without_aliases``)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("ReduceMean", ["t", "axes"], ["m"], keepdims=1),
             helper.make_node("Greater", ["x", "low"], ["c"]),
             helper.make_node("Where", ["c", "m", "y"], ["w"]),
             helper.make_node("Add", ["t", "z"], ["s"])]
    built = model(nodes, {"x": [7, 1], "y": [1], "z": [7]}, {"w": [7, 1], "s": [1, 7]},
                  {"axes": np.array([0, 1], np.int64), "low": np.array(-1.0, np.float32)})
    stitched = verify.compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(stitched).groups
    assert {"mean", "where"} <= {op.partition(":")[2] for op in group.ops}
    mine, tvms = (analyze(m) for m in (stitched, verify.compile_model(built, "baseline")))
    assert (len(mine.kernels), len(tvms.kernels)) == (1, 2)
    assert mine.global_bytes < tvms.global_bytes
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
def test_a_reduction_over_the_axes_an_expand_repeats_reduces_its_source(op: str) -> None:
    # fuzz graph 12039:299: a mean down the 2 rows of a (16, 2048) expanded to (2, 16, 2048),
    # in one kernel with the expand: 32 partial sums a thread of 1024 beside the loads nvcc
    # hoisted out of the row walk (they read the same row each time), 184 B spilled on
    # sm_90. Each repeated axis holds one value: the reduction reads the source (a sum
    # times the repeats), and no kernel expands it.
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]),
             helper.make_node(op, ["e", "axes"], ["r"], keepdims=0),
             helper.make_node(op, ["e", "both"], ["b"], keepdims=1)]
    built = model(nodes, {"x": [16, 2048]}, {"r": [16, 2048], "b": [1, 1, 2048]},
                  {"shape": np.array([2, 16, 2048], np.int64),
                   "axes": np.array([0], np.int64), "both": np.array([-3, -2], np.int64)})
    assert len(analyze(verify.compile_model(built, "stitch")).kernels) == 1
    assert global_bytes(built, "stitch") < global_bytes(built, "baseline") / 3
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
