"""A node whose output TVM's importer leaves without a shape, where ONNX infers one, is refused
with the node named (``frontend.lost_shapes``): TVM cannot prove a symbolic dimension equal
to a static one the op needs, and without the check the compile crashed far from the node
("CodeGenVM cannot emit this Relax operator") in both flows."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import ModelError, import_model


def _model(x_shape: list, node: str) -> object:
    """``node`` (LayerNormalization or Add) of x and a (64,) weight, x of ``x_shape``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)
    weights = [numpy_helper.from_array(np.linspace(0.5, 1.5, 64, dtype=np.float32), "scale"),
               numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32), "bias")]
    inputs = ["x", "scale", "bias"] if node == "LayerNormalization" else ["x", "scale"]
    nodes = [helper.make_node("Neg", ["x"], ["n"], name="neg0"),
             helper.make_node(node, ["n", *inputs[1:]], ["y"], name="meets_weights")]
    graph = helper.make_graph(nodes, "g", [x], [y], weights[:len(inputs) - 1])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(("node", "inferred"), [("LayerNormalization", "(8, d)"),
                                              ("Add", "(8, 64)")])
def test_a_symbolic_dimension_meeting_a_static_weight_names_the_node(node: str, inferred: str
                                                                     ) -> None:
    with pytest.raises(ModelError) as err:
        import_model(_model([8, "d"], node))
    text = str(err.value)
    assert text.startswith(f"node meets_weights ({node}): TVM's importer loses the shape of "
                           f"output 'y', which ONNX infers as {inferred}"), text
    assert "scale (64,)" in text


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
def test_the_same_model_with_static_sizes_compiles(flow: str) -> None:
    model = _model([8, 64], "LayerNormalization")
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", flow)
    assert verify.run_simt(scheduled, model).ok


def test_a_symbolic_row_count_keeps_its_shape() -> None:
    """The weights meet the static row length; the symbolic row count is kept."""
    main = import_model(_model(["n", 64], "LayerNormalization"))["main"]
    assert 'R.Tensor((n, 64), dtype="float32")' in main.script()


def test_a_shape_that_depends_on_data_is_not_refused() -> None:
    """NonZero's output length is known only at run time: ONNX infers no shape for it
    either, so there is nothing TVM loses."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, None])
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"], name="nz")], "g",
                              [x], [y])
    import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
