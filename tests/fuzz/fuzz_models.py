"""Small ONNX model builders shared by the differential tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def make_model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[list, int]],
               outputs: dict[str, tuple[list, int]], constants: dict[str, np.ndarray] | None = None,
               opset: int = 18, check: bool = True) -> onnx.ModelProto:
    """An opset-18 model; ``inputs``/``outputs`` map names to (shape, ONNX element type)."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in outputs.items()],
        initializer=[numpy_helper.from_array(v, n) for n, v in (constants or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    return model
