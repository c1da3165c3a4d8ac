"""Shared pytest set-up.

- ``--runslow`` enables tests marked ``slow`` (real sizes, model export).
- nvcc is found by ``tvm_stitch.analysis.ptxas.find_nvcc`` and nothing else. Without it, a test
  marked ``nvcc`` is skipped, saying why, and so is a test that needs nvcc without being marked
  (through ``check_resources``, ``check_model(..., resources=True)``, ``analyze(resources=True)``):
  each call of ``find_nvcc`` that finds none is noted for the test being set up or run, and such
  a test is reported as skipped whether it failed or passed, since what it meant to check did
  not run (``check_model`` records the resource stage's error in its outcome, so a test may
  still pass). With ``CI=true`` both fail instead: CI must have nvcc.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import pytest

from tvm_stitch.analysis import ptxas

_NVCC_MISSES = pytest.StashKey[list[str]]()
_RECORDER = pytest.StashKey["_NvccMisses"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


class _NvccMisses:
    """Replaces ``ptxas.find_nvcc`` for the session by a wrapper that behaves the same and notes
    each "nvcc not found" in the stash of the test being set up or run."""

    def __init__(self) -> None:
        self.current: list[str] | None = None
        self.find = ptxas.find_nvcc

        @functools.wraps(self.find)
        def find_nvcc() -> str:
            try:
                return self.find()
            except ptxas.PtxasError as exc:
                if self.current is not None:
                    self.current.append(str(exc))
                raise

        ptxas.find_nvcc = find_nvcc

    def restore(self) -> None:
        ptxas.find_nvcc = self.find

    @contextlib.contextmanager
    def recording(self, item: pytest.Item) -> Iterator[None]:
        self.current = item.stash.setdefault(_NVCC_MISSES, [])
        try:
            yield
        finally:
            self.current = None


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _missing_nvcc() -> str | None:
    """Why there is no nvcc (``find_nvcc``'s message), or None when there is one."""
    try:
        ptxas.find_nvcc()
    except ptxas.PtxasError as exc:
        return str(exc)
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RECORDER] = _NvccMisses()


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_RECORDER].restore()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("nvcc") is not None:
        missing = _missing_nvcc()
        if missing is not None:
            if _in_ci():
                pytest.fail(f"needs nvcc: {missing} (CI=true: CI must have nvcc)", pytrace=False)
            item.add_marker(pytest.mark.skip(reason=f"needs nvcc: {missing}"))  # at the test
    with item.config.stash[_RECORDER].recording(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with item.config.stash[_RECORDER].recording(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    report = yield
    misses = item.stash.get(_NVCC_MISSES, [])
    if call.when == "teardown" or not misses or report.skipped:
        return report
    reason = f"needs nvcc: {misses[0]}"
    if not _in_ci():
        path, line, _ = item.location
        report.outcome = "skipped"
        report.longrepr = (path, None if line is None else line + 1, f"Skipped: {reason}")
    elif report.passed:
        report.outcome = "failed"
        report.longrepr = f"{reason} (CI=true: CI must have nvcc)"
    else:
        report.sections.append(("nvcc", f"{reason} (CI=true: CI must have nvcc)"))
    return report


@pytest.fixture
def columns_as_global(monkeypatch: pytest.MonkeyPatch) -> None:
    """Column reductions of few rows stitched by Global stitching, not read as strided rows
    of a transposed view (``mixed_reduction._strided_columns`` finds none), for tests of
    the Global machinery (column tiles of one row tile, partial sums that fit nowhere
    whole) on a column reduction alone over a parameter, which the stitch flow reads as
    strided rows. The machinery serves the same reductions of what element-wise ops make,
    or beside rows of their input (``test_column_tiles_wave``'s means beside rows)."""
    from tvm_stitch.transform import mixed_reduction
    monkeypatch.setattr(mixed_reduction, "_strided_columns", lambda func: set())


@pytest.fixture
def global_at_any_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Global groups stitched whatever the estimate (``yardstick.TIME_MARGIN`` and
    ``ONE_KERNEL_MARGIN`` unbounded), for tests of the Global machinery on shapes small
    enough for the SIMT runner: at those, a Global kernel whose ops TVM runs in one kernel
    is estimated slower and falls back
    (``stitch_fuse._worse``; tested in ``tests/regressions/test_small_global_tiles.py``)."""
    from tvm_stitch.transform import yardstick
    monkeypatch.setattr(yardstick, "TIME_MARGIN", float("inf"))
    monkeypatch.setattr(yardstick, "ONE_KERNEL_MARGIN", float("inf"))
