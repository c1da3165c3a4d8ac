"""Attributes TVM's ONNX importer ignores, so both flows compute different numbers than ONNX
specifies, silently. The front end refuses these (a ModelError naming the node) or rewrites the
node into ops the importer gets right (a BatchNormalization in training mode,
``frontend.outputs``). Found by ONNX's node tests (each case's name is given).
Owner: frontend/onnx.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from regression_models import model

from tvm_stitch.testing.differential import check_model, default_flow


def _isinf_negative_only() -> onnx.ModelProto:  # test_isinf_negative
    built = model([helper.make_node("IsInf", ["x"], ["y"], detect_positive=0)], {"x": [6]},
                  {"y": [6]})
    built.graph.output[0].type.tensor_type.elem_type = TensorProto.BOOL
    return built


def _batchnorm_training() -> onnx.ModelProto:  # test_batchnorm_example_training_mode
    stats = {n: np.ones(3, np.float32) for n in ("scale", "bias", "mean", "var")}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                            ["y", "running_mean", "running_var"], training_mode=1)
    return model([node], {"x": [2, 3, 4]}, {"y": [2, 3, 4], "running_mean": [3],
                                           "running_var": [3]}, stats)


CASES = {"IsInf detect_positive=0": _isinf_negative_only,
         "BatchNormalization training_mode=1": _batchnorm_training}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_or_right(case: str) -> None:
    built = CASES[case]()
    feeds = {"x": np.array([-1.5, np.inf, -np.inf, 2.0, 3.5, -4.0], np.float32)} if (
        case.startswith("IsInf")) else None
    outcome = check_model(built, default_flow(), resources=False, triage=False, feeds=feeds)
    refused = outcome.stage == "import" and outcome.error.startswith("ModelError")
    assert outcome.kind == "ok" or refused, f"{outcome.kind}: {outcome.error}"
