"""Node test parameters: a curated sample by default, every selected case with --runslow
(collecting ONNX's cases takes seconds, so the full list is built only when it will run)."""

from __future__ import annotations

import pytest


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "all_case_name" not in metafunc.fixturenames:
        return
    if metafunc.config.getoption("--runslow"):
        from tvm_stitch.testing.node import node_cases

        names = [c.name for c in node_cases()]
    else:
        names = ["not-collected-without-runslow"]
    metafunc.parametrize("all_case_name", names)
