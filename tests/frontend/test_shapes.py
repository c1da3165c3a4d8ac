"""Shape computations of models exported with dynamic axes keep their symbolic shapes
(``frontend.shapes``): ``Range(0, Shape(x)[1], 1)`` is ``arange(seq)``, of shape ``(seq,)``,
so what is computed from it broadcasts against ``x`` and the model compiles and runs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model


def _positions():
    """y = x + Cast(Range(0, Shape(x)[1], 1)), x of (batch, seq): the positions added to
    every row."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    consts = [numpy_helper.from_array(np.array(0, np.int64), "start"),
              numpy_helper.from_array(np.array(1, np.int64), "step")]
    nodes = [helper.make_node("Shape", ["x"], ["len1"], start=1, end=2),
             helper.make_node("Squeeze", ["len1"], ["len"]),
             helper.make_node("Range", ["start", "len", "step"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "posf"], ["y"])]
    graph = helper.make_graph(nodes, "positions", [x], [y], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_range_over_a_shape_value_has_that_length() -> None:
    main = import_model(_positions())["main"]
    text = main.script()
    assert "range_len" not in text and 'R.Tensor((batch, seq), dtype="float32")' in text


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
def test_one_compile_runs_at_every_length(flow: str) -> None:
    model = _positions()
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", flow)
    for dims in ({"batch": 1, "seq": 1}, {"batch": 3, "seq": 13}, {"batch": 2, "seq": 300}):
        assert verify.run_simt(scheduled, model, dims=dims).ok, dims


def _reshape_by_a_shape_value():
    """y = Reshape(x, Concat(Reshape(Shape(x)[0] * 2, [1]), [-1])) + 1, x of (batch, seq):
    a shape value reshaped to one element and concatenated into a shape, as GPT-2's export
    does for its key lengths; y is (2 * batch, seq / 2)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
    consts = [numpy_helper.from_array(np.array(2, np.int64), "two"),
              numpy_helper.from_array(np.array([1], np.int64), "one_dim"),
              numpy_helper.from_array(np.array([-1], np.int64), "rest"),
              numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [helper.make_node("Shape", ["x"], ["b1"], start=0, end=1),
             helper.make_node("Squeeze", ["b1"], ["b"]),
             helper.make_node("Mul", ["b", "two"], ["rows"]),
             helper.make_node("Reshape", ["rows", "one_dim"], ["rows1"]),
             helper.make_node("Concat", ["rows1", "rest"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Add", ["r", "one"], ["y"])]
    graph = helper.make_graph(nodes, "reshape_by_shape", [x], [y], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
def test_a_shape_value_reshaped_to_one_element_is_a_shape(flow: str) -> None:
    model = _reshape_by_a_shape_value()
    text = import_model(model)["main"].script()
    assert 'R.Tensor((batch * 2, 4), dtype="float32")' in text, text
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", flow)
    for batch in (1, 5):
        assert verify.run_simt(scheduled, model, dims={"batch": batch}).ok, batch
