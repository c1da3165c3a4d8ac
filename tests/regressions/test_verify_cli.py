"""verify on a model whose input has a symbolic dimension. Owner: verify.py."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify


def test_symbolic_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "dynamic.onnx"
    onnx.save(model([helper.make_node("Softmax", ["x"], ["y"])], {"x": ["n", 8]},
                    {"y": ["n", 8]}), path)
    assert verify.main([str(path)]) == 2
    assert "'x'" in capsys.readouterr().err
