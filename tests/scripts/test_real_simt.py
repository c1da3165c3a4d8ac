"""scripts/real_simt.py: zoo models on the SIMT runner against onnxruntime, one line each."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
real_simt = importlib.import_module("real_simt")


def test_a_model_is_checked_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert real_simt.main(["dien_block", "--size", "ci"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("dien_block") and " ok max_abs_err=" in line


def test_a_mismatch_fails_the_run(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    # a fault injected after the real run: its outputs off by 1.0
    original = real_simt.verify.run_simt
    monkeypatch.setattr(real_simt.verify, "run_simt", lambda *a, **k: real_simt.verify.Check(
        original(*a, **k).max_abs_err + 1.0, False))
    assert real_simt.main(["dien_block", "--size", "ci"]) == 1
    assert "MISMATCH" in capsys.readouterr().out
