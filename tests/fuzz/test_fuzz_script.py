"""scripts/fuzz.py: the summary line, the worker, shrinking and saved regression cases, and the
bounded sample CI runs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import re
import secrets
import time
from pathlib import Path

import onnx
import pytest
from fuzz_models import F32, make_model
from onnx import helper

from tvm_stitch.testing import fuzz
from tvm_stitch.testing.differential import Outcome, default_flow
from tvm_stitch.testing.fuzz import Checker, Options, Summary, minimise, run
from tvm_stitch.testing.graphs import LARGE_SHAPES, GraphConfig, graph_from_seed

SCRIPT = Path(__file__).parents[2] / "scripts" / "fuzz.py"
SUMMARY = re.compile(r"^graphs=(\d+) mismatches=(\d+) crashes=(\d+) fallbacks=(\d+) "
                     r"tvm_crashes=\d+ resource_violations=\d+ tvm_resource_violations=\d+ "
                     r"genuine_fallbacks=\d+ costlier=\d+$")
CI_SEED = 2024
CI_GRAPHS = 40


def _script():
    spec = importlib.util.spec_from_file_location("fuzz_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ok(**changes) -> dict:
    return Outcome("stitch", **changes).to_dict()


def _fails_on_exp(model: onnx.ModelProto) -> dict:
    if any(n.op_type == "Exp" for n in model.graph.node):
        return _ok(kind="mismatch", error="output 0: max abs error 1")
    return _ok()


def test_summary_line_and_exit_status() -> None:
    summary = Summary()
    summary.add(_ok(fallbacks=["x: reason"]))
    summary.add(_ok(kind="tvm_crash", stage="compile", error="E: x"))
    assert summary.line().startswith("graphs=2 mismatches=0 crashes=0 fallbacks=1 ")
    assert SUMMARY.match(summary.line()) and not summary.failed
    summary.add(_ok(costlier="1 kernels, 9 B; TVM's flow 2 kernels, 8 B"))
    assert summary.costlier == 1 and not summary.failed  # counted, never a failure
    summary.add(_ok(violations=["sm_90 f/k: spills 8 B"]))
    assert summary.failed and summary.resource_violations == 1


def test_shrinking_finds_a_minimal_graph() -> None:
    offsets = next(rec for i in range(200)
                   for model, rec in [graph_from_seed(f"exp:{i}")]
                   if len(model.graph.node) >= 6 and _fails_on_exp(model)["kind"] != "ok")
    minimal, outcome = minimise(offsets, _fails_on_exp, fuzz.signature(
        _fails_on_exp(fuzz.random_graph(fuzz.ReplayChooser(offsets), GraphConfig()))),
        GraphConfig(), budget=150)
    assert outcome["kind"] == "mismatch"
    ops = [n.op_type for n in minimal.graph.node]
    assert "Exp" in ops and len(ops) <= 3, ops


class FakeChecker:
    """Fails every graph with an Exp, after a random short while (so parallel jobs finish
    out of order)."""

    def __init__(self, *args, **kwargs) -> None:
        self.timeout = 0.0

    def __call__(self, model: onnx.ModelProto, seed: int = 0) -> dict:
        time.sleep(random.random() / 100)
        return _fails_on_exp(model)

    def close(self) -> None:
        pass


def test_failures_are_written_shrunk_and_saved(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "Checker", FakeChecker)
    options = Options(graphs=12, seed=4, out=tmp_path / "out", regressions=tmp_path / "cases",
                      shrink_budget=40)
    lines: list[str] = []
    summary = run(options, lines.append)
    assert summary.mismatches >= 1 and summary.failed
    (case, *_) = sorted((tmp_path / "cases").glob("*.json"))
    saved = json.loads(case.read_text())
    assert saved["open"].startswith("found by fuzzing") and saved["flows"] == ["stitch"]
    assert any("Exp" in line for line in saved["graph"])
    onnx.checker.check_model(onnx.load(case.with_suffix(".onnx")))
    first = tmp_path / "out" / case.stem
    assert (first / "model.onnx").exists() and (first / "minimal.json").exists()
    assert any("shrunk to" in line for line in lines)


def test_parallel_jobs_count_in_graph_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "Checker", FakeChecker)
    runs = {}
    for jobs in (1, 3):
        lines: list[str] = []
        summary = run(Options(graphs=40, seed=4, shrink_budget=0, jobs=jobs), lines.append)
        failed = [int(line.split()[1].rstrip(":")) for line in lines
                  if line.startswith("graph ") and "mismatch" in line]
        runs[jobs] = (summary.line(), summary.failures, failed)
    assert runs[3] == runs[1]
    assert runs[1][2] == sorted(runs[1][2]) and runs[1][2], runs[1]


def test_worker_times_out_and_recovers() -> None:
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], {"x": ([8], F32)},
                       {"y": ([8], F32)})
    checker = Checker(default_flow(), "cuda:sm_90", resources=False, timeout=0.001)
    try:
        hung = checker(model)
        assert (hung["kind"], hung["stage"]) == ("crash", "worker")
        assert hung["error"].startswith("TimeoutError")
        checker.timeout = 120
        assert checker(model)["kind"] == "ok"
    finally:
        checker.close()


def test_script_prints_the_summary_last(capsys: pytest.CaptureFixture) -> None:
    status = _script().main(["--graphs", "3", "--seed", "11", "--timeout", "0",
                             "--no-resources", "--max-nodes", "3"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert SUMMARY.match(last), last
    assert status == (0 if last.split()[1:3] == ["mismatches=0", "crashes=0"] else 1)


@pytest.mark.nvcc  # resources are checked in worker processes, out of the conftest's sight
def test_bounded_sample_is_clean(capsys: pytest.CaptureFixture) -> None:
    """The CI sample: 40 graphs on a fresh seed each run (``TVM_STITCH_FUZZ_SEED`` replays
    one), through the flow under test, resources checked; the seed is printed first, so a
    failure reproduces with the command it names."""
    seed = int(os.environ.get("TVM_STITCH_FUZZ_SEED") or secrets.randbelow(10**6))
    rerun = f"python scripts/fuzz.py --graphs {CI_GRAPHS} --seed {seed}"
    with capsys.disabled():
        print(f"\nfuzz sample: seed {seed} (rerun: {rerun})")
    status = _script().main(["--graphs", str(CI_GRAPHS), "--seed", str(seed), "--jobs", "2",
                             "--shrink-budget", "0"])
    out = capsys.readouterr().out
    assert f"graphs={CI_GRAPHS} " in out
    assert status == 0, f"seed {seed}: rerun with {rerun}\n{out}"


def test_bounded_large_shape_sample_is_clean(capsys: pytest.CaptureFixture) -> None:
    """The CI sample of the large-shape mode: graphs on model shapes of 10^5 to 10^7
    elements, resources checked (no spills, stack frames or thread-local arrays over the
    plan's budget)."""
    status = _script().main(["--graphs", "3", "--seed", str(CI_SEED), "--large", "1",
                             "--timeout", "0", "--shrink-budget", "0"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "graphs=3 mismatches=0 crashes=0" in out


def test_large_shape_mode_draws_model_shapes() -> None:
    config = GraphConfig(large=1.0)
    shapes = {tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
              for model, _ in (graph_from_seed(f"large:{i}", config) for i in range(12))}
    assert shapes <= set(LARGE_SHAPES) and len(shapes) > 3
    assert all(10**5 <= math.prod(s) <= 10**7 for s in LARGE_SHAPES)
    assert {len(s) for s in LARGE_SHAPES} == {2, 3, 4}


@pytest.mark.slow
@pytest.mark.nvcc  # resources are checked in worker processes, out of the conftest's sight
def test_large_sample_is_clean(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    status = _script().main(["--graphs", "200", "--seed", "7", "--out", str(tmp_path)])
    assert status == 0, capsys.readouterr().out
