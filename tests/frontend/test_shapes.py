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
