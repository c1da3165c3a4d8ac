"""verify on a model whose input has a symbolic dimension. Owner: verify.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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
    assert "'x'" in (err := capsys.readouterr().err) and "--dim" in err


def _layer_norm_softmax(path: Path) -> str:
    """Softmax of a layer norm over rows of 64, with a symbolic batch ``n``."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1),
             helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    constants = {"g": np.full(64, 1.5, "float32"), "b": np.full(64, 0.5, "float32")}
    onnx.save(model(nodes, {"x": ["n", 64]}, {"y": ["n", 64]}, constants), path)
    return str(path)


@pytest.mark.parametrize("n", [1, 9])
def test_symbolic_dimension_sized_on_the_command_line(tmp_path: Path, n: int,
                                                      capsys: pytest.CaptureFixture) -> None:
    path = _layer_norm_softmax(tmp_path / "dynamic.onnx")
    assert verify.main([path, "--pipeline", "stitch", "--dim", f"n={n}", "--plan"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["ok"] and result["kernels"] == 1
    assert result["compulsory_bytes"] == 2 * n * 64 * 4 + 2 * 64 * 4
    assert "n (symbolic) rows" in captured.err


def test_bad_dim_argument_is_refused(tmp_path: Path) -> None:
    path = _layer_norm_softmax(tmp_path / "dynamic.onnx")
    with pytest.raises(SystemExit):
        verify.main([path, "--dim", "n"])
