"""The conftest's nvcc rule, on tests run by a pytest in a subprocess where ``find_nvcc`` finds
none: a test marked ``nvcc`` and one that needs nvcc without saying so are skipped with
find_nvcc's message, and both fail with ``CI=true``; a test that needs no nvcc is untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Loaded with -p, before the conftest's pytest_configure wraps ptxas.find_nvcc: this machine
# has nvcc, so the probe's session gets a find_nvcc that finds none.
HIDE_NVCC = '''
from tvm_stitch.analysis import ptxas


def find_nvcc() -> str:
    raise ptxas.PtxasError("nvcc not found: hidden by the test")


ptxas.find_nvcc = find_nvcc
'''

PROBE = '''
import pytest

from tvm_stitch.analysis import ptxas


@pytest.mark.nvcc
def test_marked() -> None:
    raise AssertionError("a marked test ran without nvcc")


def test_needs_nvcc_and_fails() -> None:
    ptxas.ptxas_resources("", "sm_90")


def test_needs_nvcc_and_passes() -> None:
    try:  # as check_model does: the resource stage's error is recorded, not raised
        ptxas.ptxas_resources("", "sm_90")
    except ptxas.PtxasError:
        pass


def test_needs_no_nvcc() -> None:
    pass
'''


def _run_probe(tmp_path: Path, ci: bool) -> str:
    """pytest's verbose output on PROBE without nvcc (a copy of pyproject.toml for the
    project's markers and options; -p conftest for the rules under test, the probe being
    outside tests/)."""
    shutil.copy(TESTS.parent / "pyproject.toml", tmp_path)
    (tmp_path / "hide_nvcc.py").write_text(HIDE_NVCC)
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["COLUMNS"] = "500"  # verbose lines with their whole reason
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(TESTS), env.get("PYTHONPATH"))))
    if ci:
        env["CI"] = "true"
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "hide_nvcc",
           "-p", "conftest", "test_probe.py"]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == (1 if ci else 0), output
    return output


def _outcome(output: str, test: str) -> str:
    """What the verbose output says of ``test``: its outcome and reason."""
    (line,) = [ln for ln in output.splitlines() if ln.startswith(f"test_probe.py::{test} ")]
    return line.split(" ", 1)[1].split("[")[0].strip()


def test_without_nvcc_tests_that_need_it_skip_saying_why(tmp_path: Path) -> None:
    output = _run_probe(tmp_path, ci=False)
    skipped = "SKIPPED (needs nvcc: nvcc not found: hidden by the test)"
    for test in ("test_marked", "test_needs_nvcc_and_fails", "test_needs_nvcc_and_passes"):
        assert _outcome(output, test) == skipped, output
    assert _outcome(output, "test_needs_no_nvcc") == "PASSED", output


def test_without_nvcc_tests_that_need_it_fail_in_ci(tmp_path: Path) -> None:
    output = _run_probe(tmp_path, ci=True)
    assert _outcome(output, "test_marked") == "ERROR", output
    assert _outcome(output, "test_needs_nvcc_and_fails") == "FAILED", output
    assert _outcome(output, "test_needs_nvcc_and_passes") == "FAILED", output
    assert _outcome(output, "test_needs_no_nvcc") == "PASSED", output
    assert output.count("CI=true: CI must have nvcc") >= 3, output
