"""Fixtures of the differential tests."""

from __future__ import annotations

import pytest

from tvm_stitch.testing.differential import default_flow


@pytest.fixture
def flow() -> str:
    """"stitch" when that flow is available, else "baseline"."""
    return default_flow()
