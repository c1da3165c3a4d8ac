"""Fixtures pointing the model cache at temporary directories, never at the user's cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from tvm_stitch.workloads import models


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache for this test."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def _session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture
def shared_cache(_session_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache shared by the tests of one session, so each model is exported once."""
    monkeypatch.setenv(models.CACHE_ENV, str(_session_cache_dir))
    return _session_cache_dir
