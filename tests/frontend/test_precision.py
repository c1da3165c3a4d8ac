"""Half-precision matrix products accumulate in float32 (``frontend.precision``), as
onnxruntime's do: TVM's import accumulates a float16 MatMul in float16, which over 2048 terms
is off by far more than float16's own rounding."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm.relax.frontend.onnx import from_onnx

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.target import cuda_target

K = 2048


def _model(op: str) -> onnx.ModelProto:
    """x (16, K) float16 times a weight (K, 32) (Gemm: transposed, plus a bias), then a
    softmax over the 32 products (a group to stitch after them)."""
    rng = np.random.default_rng(0)
    weight = rng.uniform(-1, 1, (32, K) if op == "Gemm" else (K, 32)).astype(np.float16)
    inits = [numpy_helper.from_array(weight, "w")]
    if op == "Gemm":
        inits.append(numpy_helper.from_array(rng.uniform(-1, 1, 32).astype(np.float16), "b"))
        product = helper.make_node("Gemm", ["x", "w", "b"], ["p"], transB=1, alpha=0.5)
    else:
        product = helper.make_node("MatMul", ["x", "w"], ["p"])
    graph = helper.make_graph(
        [product, helper.make_node("Softmax", ["p"], ["y"], axis=-1)], "half_product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [16, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [16, 32]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT16, [16, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("flow", ["baseline", "stitch"])
def test_half_products_match_onnxruntime(op: str, flow: str) -> None:
    model = _model(op)
    check = verify.run_simt(pipeline.lower(import_model(model), cuda_target(), flow), model)
    assert check.ok, check


def test_tvm_alone_accumulates_in_half_precision() -> None:
    """The bug worked around: TVM's own import of the MatMul is off by over 0.1 here."""
    model = _model("MatMul")
    mod = from_onnx(model, keep_params_in_input=False)
    check = verify.run_simt(pipeline.lower(mod, cuda_target(), "baseline"), model)
    assert not check.ok and check.max_abs_err > 0.1, check
