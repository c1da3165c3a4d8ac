"""Every output of a multi-output ONNX op is computed right (against onnxruntime, or ONNX's own
expected values) or refused with a ModelError naming the node and the output
(``tvm_stitch.frontend.outputs``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

from tvm_stitch.frontend.onnx import ModelError, import_model
from tvm_stitch.frontend.outputs import MULTI_OUTPUT_OPS, OutputHandling
from tvm_stitch.testing.differential import check_model
from tvm_stitch.testing.node import case_named, prepare, run_case


def test_every_multi_output_op_tvm_converts_is_handled() -> None:
    schemas = onnx.defs.get_all_schemas_with_history()
    multi = {s.name for s in schemas if s.domain in ("", "ai.onnx") and s.max_output > 1}
    assert multi & set(_get_convert_map()) == set(MULTI_OUTPUT_OPS)


# One or two ONNX node tests per op, each reading more than one output of it.
COMPUTED = {
    "LayerNormalization": ["test_layer_normalization_3d_axis1_epsilon",
                           "test_layer_normalization_4d_axis_negative_2"],
    "Dropout": ["test_dropout_default_mask"],
    "BatchNormalization": ["test_batchnorm_example_training_mode",
                           "test_batchnorm_epsilon_training_mode"],
    "Split": ["test_split_1d_uneven_split_opset18"],
    "TopK": ["test_top_k", "test_top_k_smallest"],
    "Unique": ["test_unique_sorted_with_axis", "test_unique_not_sorted_without_axis"],
    "DynamicQuantizeLinear": ["test_dynamicquantizelinear"],
}
REFUSED = {
    "MaxPool": ("test_maxpool_with_argmax_2d_precomputed_pads", "output 'z'"),
    "Attention": ("test_attention_4d_with_qk_matmul", "com.microsoft"),
    "Dropout": ("test_training_dropout_mask", "training_mode"),
}


def test_cases_cover_the_table() -> None:
    for op, (handling, _) in MULTI_OUTPUT_OPS.items():
        assert op in (COMPUTED if handling is not OutputHandling.REFUSED else REFUSED), op


@pytest.mark.parametrize("name", sorted(n for names in COMPUTED.values() for n in names))
def test_imported_outputs_match_onnx(name: str) -> None:
    """The imported module, built for the CPU by TVM (this checks the import, whatever the
    flow; TopK's kernel is beyond the SIMT runner), gives ONNX's expected outputs."""
    model, feeds, expected = prepare(case_named(name))
    ex = tvm.compile(import_model(model), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    outputs = list(result) if isinstance(result, tvm.ir.Array) else [result]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["test_layer_normalization_3d_axis1_epsilon",
                                  "test_dropout_default_mask", "test_unique_sorted_with_axis",
                                  "test_batchnorm_epsilon_training_mode"])
def test_outputs_through_the_stitch_flow(name: str) -> None:
    result = run_case(case_named(name), "stitch")
    assert result.status == "passed", result.reason


@pytest.mark.parametrize("op", sorted(REFUSED))
def test_refused_outputs_name_the_node(op: str) -> None:
    name, why = REFUSED[op]
    result = run_case(case_named(name), "stitch")
    assert result.status == "skipped" and "ModelError" in result.reason, result.reason
    assert f"({op})" in result.reason and why in result.reason, result.reason


def _layer_norm_training(dtype: int, axis: int) -> onnx.ModelProto:
    """A LayerNormalization whose Mean and InvStdDev feed the rest of the graph, as in torch's
    autograd exports (the backward reads both)."""
    shape = [2, 6, 48]
    norm = shape[axis:]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"],
                         name="ln", axis=axis, epsilon=1e-3),
        helper.make_node("Cast", ["y"], ["y32"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mean", "inv"], ["m"]),
        helper.make_node("Add", ["y32", "m"], ["out"]),
    ]
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(
        rng.normal(size=norm).astype(helper.tensor_dtype_to_np_dtype(dtype)), n)
        for n in ("g", "b")]
    graph = helper.make_graph(
        nodes, "ln_train", [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("inv", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
@pytest.mark.parametrize("dtype,axis", [(TensorProto.FLOAT, -1), (TensorProto.FLOAT, 1),
                                        (TensorProto.FLOAT16, -1)])
def test_layer_norm_statistics_feed_a_graph(flow: str, dtype: int, axis: int) -> None:
    outcome = check_model(_layer_norm_training(dtype, axis), flow, resources=False)
    assert outcome.kind == "ok", outcome.error


def test_layer_norm_of_unknown_rank_names_the_node() -> None:
    model = _layer_norm_training(TensorProto.FLOAT, -1)
    graph = model.graph
    del graph.value_info[:]
    graph.input.append(helper.make_tensor_value_info("s", TensorProto.INT64, ["n"]))
    graph.node.insert(0, helper.make_node("Reshape", ["x", "s"], ["xr"]))
    graph.node[1].input[0] = "xr"  # the rank of a reshape to a shape of unknown length
    with pytest.raises(ModelError, match=r"node ln \(LayerNormalization\).*rank"):
        import_model(model)


def _batch_norm_training(shape: list[int], dtype: int = TensorProto.FLOAT,
                         training: int = 1) -> onnx.ModelProto:
    """A BatchNormalization in training mode (``training``) whose running statistics and
    ReLU'd Y are graph outputs, as in a conv net's training graph."""
    channels = shape[1]
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    stats = {n: rng.random(channels).astype(np_type) + (n == "var") for n in
             ("scale", "bias", "mean", "var")}
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                              ["y", "running_mean", "running_var"], name="bn",
                              training_mode=training, momentum=0.8, epsilon=1e-3),
             helper.make_node("Relu", ["y"], ["r"])]
    graph = helper.make_graph(
        nodes, "bn_train", [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("r", dtype, shape),
         helper.make_tensor_value_info("running_mean", dtype, [channels]),
         helper.make_tensor_value_info("running_var", dtype, [channels])],
        [onnx.numpy_helper.from_array(v, n) for n, v in stats.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
@pytest.mark.parametrize("shape,dtype", [([4, 16, 10, 10], TensorProto.FLOAT),
                                         ([64, 24], TensorProto.FLOAT),
                                         ([2, 8, 6, 5, 3], TensorProto.FLOAT),
                                         ([8, 32, 14, 14], TensorProto.FLOAT16)])
def test_batch_norm_in_training_mode_is_computed(flow: str, shape: list[int], dtype: int
                                                 ) -> None:
    # TVM's importer normalised with the running statistics given and returned them
    # unchanged: both flows were wrong, and the front end refused the attribute
    outcome = check_model(_batch_norm_training(shape, dtype), flow, resources=False)
    assert outcome.kind == "ok", outcome.error


def test_batch_norm_running_statistics_in_inference_mode_name_the_node() -> None:
    with pytest.raises(ModelError, match=r"node bn \(BatchNormalization\).*training_mode"):
        import_model(_batch_norm_training([4, 16, 10, 10], training=0))
