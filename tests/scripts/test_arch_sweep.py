"""scripts/arch_sweep.py: architectures beyond the zoo, exported small, compiled with both
flows and checked against onnxruntime."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sweep = importlib.import_module("arch_sweep")


def test_a_model_is_exported_compiled_and_checked(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("transformers")
    assert sweep.main(["resnet", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("resnet: stitch: ") and line.endswith("check ok"), line
    assert onnx.load(tmp_path / "resnet.onnx").graph.output[0].name == "y"


def test_an_unknown_architecture_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        sweep.main(["resnet", "nope"])
    assert "unknown architectures: nope" in capsys.readouterr().err
