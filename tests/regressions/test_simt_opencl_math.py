"""Inverse trigonometric ops on the SIMT runner: TVM's OpenCL code generator calls the C
library's float names (``acosf``, ``asinhf``, ...), which OpenCL C does not have (it overloads
``acos``), so PoCL refuses to build the kernel, for every flow. Found by ONNX's node tests
(test_acos, test_acosh, test_asin, test_asinh, test_atan, test_atanh, test_tan). Fixed: the
runner maps the names before building (``simt.kernel._opencl_math_names``)."""

from __future__ import annotations

import pytest
from onnx import helper
from regression_models import model

from tvm_stitch.testing.differential import check_model


@pytest.mark.parametrize("op", ["Acos", "Asin", "Atan", "Acosh", "Asinh", "Atanh", "Tan"])
def test_inverse_trig_runs_on_the_simt_runner(op: str) -> None:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node(op, ["s"], ["y"])]
    if op == "Acosh":  # defined from 1 up
        nodes = [helper.make_node("Exp", ["x"], ["s"]), helper.make_node(op, ["s"], ["y"])]
    outcome = check_model(model(nodes, {"x": [4, 8]}, {"y": [4, 8]}), "baseline",
                          resources=False)
    assert outcome.kind == "ok", outcome.error
