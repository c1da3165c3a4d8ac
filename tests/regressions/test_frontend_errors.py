"""Errors of TVM's ONNX importer should name the node, like the front end's own refusals.
Owner: frontend/onnx.py (import_model wraps the importer's exception without the node)."""

from __future__ import annotations

import pytest
from onnx import helper
from regression_models import model

from tvm_stitch.frontend.onnx import ModelError, import_model


def test_importer_failure_names_the_node() -> None:
    bad = model([helper.make_node("Softmax", ["x"], ["y"], axis=5, name="scores_softmax")],
                {"x": [4, 8]}, {"y": [4, 8]})
    with pytest.raises(ModelError, match="scores_softmax"):
        import_model(bad)
