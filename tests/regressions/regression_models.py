"""Small ONNX models of the regressions (opset 18, built with onnx.helper), and a mark for
the regressions that need the stitch flow."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch.pipeline import available_flows

needs_stitch = pytest.mark.skipif("stitch" not in available_flows(),
                                  reason="the stitch flow is not available")


def model(nodes: list[onnx.NodeProto], inputs: dict[str, list], outputs: dict[str, list],
          constants: dict[str, np.ndarray] | None = None,
          elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A checked opset-18 model; shapes by name, one element type for inputs and outputs."""
    graph = helper.make_graph(
        nodes, "regression",
        [helper.make_tensor_value_info(n, elem_type, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, elem_type, s) for n, s in outputs.items()],
        initializer=[numpy_helper.from_array(v, n) for n, v in (constants or {}).items()])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    built.ir_version = 8
    onnx.checker.check_model(built)
    return built


def global_bytes(built: onnx.ModelProto, flow: str) -> int:
    """Global bytes all kernels of ``built`` compiled with ``flow`` move (from their TIR)."""
    from tvm_stitch import verify
    from tvm_stitch.analysis import analyze
    return sum(k.traffic.global_bytes for k in analyze(verify.compile_model(built, flow)).kernels)
