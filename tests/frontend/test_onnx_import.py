"""Bad models fail with a message that names the node or value, before TVM sees them."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_stitch.frontend.onnx import ModelError, graph_inputs, import_model, load


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _vi(name: str, elem: int = TensorProto.FLOAT, shape=(4, 8)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def test_unknown_operator_names_the_node() -> None:
    m = _model([helper.make_node("FooBar", ["x"], ["y"], name="weird_node")],
               [_vi("x")], [_vi("y")])
    with pytest.raises(ModelError, match=r"weird_node.*FooBar"):
        load(m)


def test_custom_domain_is_refused() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")],
               [_vi("x")], [_vi("y")])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(ModelError, match=r"node r .*custom domain"):
        load(m)


def test_malformed_graph_is_refused() -> None:
    m = _model([helper.make_node("Relu", ["missing"], ["y"], name="dangling")],
               [_vi("x")], [_vi("y")])
    with pytest.raises(ModelError, match="malformed"):
        load(m)


def test_unsupported_dtype_names_the_value() -> None:
    m = _model([helper.make_node("Identity", ["x"], ["y"])],
               [_vi("x", TensorProto.COMPLEX64)], [_vi("y", TensorProto.COMPLEX64)])
    with pytest.raises(ModelError, match="'x'.*COMPLEX64"):
        load(m)


def test_unreadable_file(tmp_path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a protobuf at all \xff\xfe")
    with pytest.raises(ModelError, match="broken.onnx"):
        load(path)


def test_import_keeps_weights_as_constants() -> None:
    w = onnx.numpy_helper.from_array(np.ones((4, 8), np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x"), _vi("w")], [_vi("y")],
               [w])
    assert [v.name for v in graph_inputs(m)] == ["x"]
    mod = import_model(m)
    assert len(mod["main"].params) == 1
