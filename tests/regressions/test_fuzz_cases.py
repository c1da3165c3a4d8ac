"""Minimal failing graphs saved by scripts/fuzz.py (``--regressions tests/regressions/cases``)
and by tests/fuzz/test_differential.py, each replayed through the flows it failed with.

A case is ``cases/<name>.onnx`` plus ``cases/<name>.json``: ``flows``, the input ``seed``,
``found_by``, the readable ``graph``, the ``outcome`` seen, and a ``note`` on the fix, or
``open`` while the bug is open: the case then fails (CI does not land it green), and whoever
fixes the bug replaces ``open`` with a ``note``. Cases run in a worker process
(``fuzz.Checker``), so one that hangs or kills its process fails alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from tvm_stitch.pipeline import available_flows
from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.testing.fuzz import Checker

CASES = Path(__file__).parent / "cases"
CASE_TIMEOUT = 120.0  # seconds; a case takes a few, so more is a hang


def _params() -> list:
    params = []
    for meta_path in sorted(CASES.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        for flow in meta["flows"]:
            params.append(pytest.param(meta_path, flow, id=f"{meta_path.stem}[{flow}]"))
    return params


@pytest.fixture(scope="module")
def checkers() -> Iterator[dict[str, Checker]]:
    """One worker per flow, shared by the cases of this module."""
    made: dict[str, Checker] = {}
    yield made
    for checker in made.values():
        checker.close()


@pytest.mark.nvcc  # resources are checked in worker processes, out of the conftest's sight
@pytest.mark.parametrize(("meta_path", "flow"), _params())
def test_saved_case(meta_path: Path, flow: str, checkers: dict[str, Checker]) -> None:
    if flow not in available_flows():
        pytest.skip(f"flow {flow!r} is not available")
    meta = json.loads(meta_path.read_text())
    checker = checkers.setdefault(flow, Checker(flow, DEFAULT_TARGET, True, CASE_TIMEOUT,
                                                triage=False))
    outcome = checker(onnx.load(CASES / meta["model"]), meta.get("seed", 0))
    assert outcome["kind"] == "ok" and not outcome["violations"], (
        f"{meta.get('open', '')}\n{outcome['kind']} {outcome['stage']} {outcome['error']} "
        f"{outcome['violations']}\n" + "\n".join(meta["graph"]))
