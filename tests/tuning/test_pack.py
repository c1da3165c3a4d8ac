"""Tuning for a GPU this machine cannot reach: ``tune --export PACK``, the pack's runner, and
``tune --import RESULTS``; the whole loop on the CPU with a SIMT pack, a CUDA pack built (and
run only where there is a GPU), and results that are not ours refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm

from tvm_stitch import cli, pipeline
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, ChoiceSource, StitchPlan
from tvm_stitch.schedule.grid_barrier import CUDA_DEFINITION
from tvm_stitch.target import parse_target
from tvm_stitch.tuning import pack_runner
from tvm_stitch.tuning.cost import FEATURES, XGBoostModel, load_model, shipped_models
from tvm_stitch.tuning.database import Database, same_plan, use_database
from tvm_stitch.tuning.kinds import RunnerKind
from tvm_stitch.tuning.measure import arguments, deserialize
from tvm_stitch.tuning.pack import MANIFEST, RUNNER
from tvm_stitch.tuning.space import candidates
from tvm_stitch.tuning.tasks import extract_tasks, target_key, workload_key
from tvm_stitch.tuning.training import read_timed
from tvm_stitch.workloads import all_workloads, micro

TARGET = "cuda:sm_90"
RUNNER_TIMEOUT_S = 300

# The CUDA pack's runner as the GPU machine runs it, checking that it never imports tvm_stitch
_WITHOUT_STITCH = """
import sys
sys.path.insert(0, sys.argv[1])
import pack_runner
code = pack_runner.main(sys.argv[1:])
assert "tvm_stitch" not in sys.modules, "the CUDA pack's runner imported tvm_stitch"
sys.exit(code)
"""


def _saved(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def _export(model: Path, pack: Path, db: Path, trials: int, runner: RunnerKind) -> dict:
    assert cli.main(["tune", str(model), "--target", TARGET, "--trials", str(trials),
                     "--runner", runner.value, "--db", str(db), "--export", str(pack)]) == 0
    return json.loads((pack / MANIFEST).read_text())


def test_a_simt_pack_runs_and_its_results_import_into_a_database(tmp_path: Path,
                                                                  capsys) -> None:
    model = _saved(micro.softmax((64, 256)), tmp_path / "softmax.onnx")
    pack, results, db = tmp_path / "pack", tmp_path / "results.json", tmp_path / "db"
    manifest = _export(model, pack, db, 3, RunnerKind.SIMT)
    assert "a SIMT pack" in capsys.readouterr().out
    assert (pack / RUNNER.name).read_bytes() == RUNNER.read_bytes()
    (task,) = extract_tasks(import_model(onnx.load(model)), TARGET)
    entries = manifest["candidates"]
    assert [e["workload"] for e in entries] == [workload_key(task)] * 3
    groups = [StitchPlan.from_dict({"groups": [e["group"]]}).groups[0] for e in entries]
    assert groups[0].choices == Choices(), "the rules' kernel first"
    for entry in entries:  # the runner's arguments are those measure draws here
        func = deserialize((pack / entry["artifact"]).read_text())
        want = arguments(func)
        got = pack_runner.arguments(entry["args"], entry["zeroed"], manifest["seed"])
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))

    run = subprocess.run([sys.executable, pack / RUNNER.name, pack, results],
                         capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(results.read_text())
    assert doc["complete"] and doc["machine"]["gpu"] is None
    assert all(r["seconds"] > 0 and not r["error"] for r in doc["results"])

    assert cli.main(["tune", "--import", str(results), "--db", str(db)]) == 0
    assert "imported 3 records" in capsys.readouterr().out
    records = Database(db).records
    assert len(records) == 3
    assert {(r.workload, r.target, r.runner) for r in records} == {
        (workload_key(task), target_key(parse_target(TARGET)), RunnerKind.SIMT)}
    assert cli.main(["tune", "--import", str(results), "--db", str(db)]) == 0
    assert "imported 0 records" in capsys.readouterr().out, "imported twice, recorded once"
    with use_database(db):
        scheduled = pipeline.lower(import_model(onnx.load(model)), TARGET, flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.source is ChoiceSource.DATABASE
    best = Database(db).best(workload_key(task), target_key(parse_target(TARGET)))
    assert same_plan(group, best.group)


def test_a_cuda_pack_holds_a_library_per_candidate(tmp_path: Path) -> None:
    model = _saved(micro.layernorm_backward((256, 128)), tmp_path / "lnb.onnx")
    pack, results, db = tmp_path / "pack", tmp_path / "results.json", tmp_path / "db"
    manifest = _export(model, pack, db, 2, RunnerKind.LOCAL)
    assert manifest["runner"] == "local" and manifest["arch"] == "sm_90"
    assert manifest["versions"]["tvm"] == tvm.__version__
    assert len(manifest["candidates"]) == 2 and not manifest["build_errors"]
    for entry in manifest["candidates"]:
        library = (pack / entry["artifact"]).read_bytes()
        assert entry["artifact"].endswith(".so") and library.startswith(b"\x7fELF")
        assert CUDA_DEFINITION.strip().encode() in library, "the grid barrier is defined"
        assert entry["args"][0] == {"dtype": "float32", "shape": [256, 128]}
        (state,) = entry["zeroed"]  # the Global-stitched kernel's grid-barrier state
        assert entry["args"][state]["dtype"] == "uint32"
        assert list(entry["features"]) == list(FEATURES), "what a model trains on"
        assert entry["features"]["grid_barriers"] >= 1

    run = subprocess.run([sys.executable, "-c", _WITHOUT_STITCH, pack, results],
                         capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
    if not tvm.cuda(0).exist:
        assert run.returncode == 2 and "error:" in run.stderr, run.stdout + run.stderr
        return
    assert run.returncode == 0, run.stdout + run.stderr
    assert cli.main(["tune", "--import", str(results), "--db", str(db)]) == 0
    assert {r.runner for r in Database(db).records} == {RunnerKind.LOCAL}


def test_results_that_are_not_ours_and_misused_flags_are_refused(tmp_path: Path,
                                                                 capsys) -> None:
    db = tmp_path / "db"
    for name, text in (("foreign.json", '{"format": "something else"}'),
                       ("corrupt.json", "not json"),
                       ("broken.json", json.dumps({"format": pack_runner.RESULTS_FORMAT}))):
        (tmp_path / name).write_text(text)
        assert cli.main(["tune", "--import", str(tmp_path / name), "--db", str(db)]) == 2
        assert str(tmp_path / name) in capsys.readouterr().err
    model = _saved(micro.softmax((64, 256)), tmp_path / "softmax.onnx")
    for argv, why in (([], "give the MODEL"),
                      ([str(model), "--export", str(tmp_path / "p"), "--runner", "rpc"],
                       "rpc measures through its tracker"),
                      ([str(model), "--export", str(tmp_path)], "not an empty directory"),
                      ([str(model), "--import", str(tmp_path / "foreign.json")],
                       "--import takes no MODEL")):
        assert cli.main(["tune", *argv, "--db", str(db)]) == 2
        assert why in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["tune", str(model), "--export", "p", "--import", "r", "--db", str(db)])
    assert exit_.value.code == 2
    assert not Database(db).records


def test_a_model_trains_on_pack_results_and_is_scored_held_out(tmp_path: Path,
                                                                capsys) -> None:
    """``tune --train``: the xgboost model fits the times of two SIMT packs' results (their
    manifests carry every candidate's features), reports per results file the taus of the
    model trained on the other file and of the analytic estimate, and saves itself with
    what it was trained on; a pack without features is refused, naming the file."""
    results = []
    for name, model in (("softmax", micro.softmax((64, 256))),
                        ("rms_norm", micro.rms_norm((128, 256)))):
        path = _saved(model, tmp_path / f"{name}.onnx")
        pack, out = tmp_path / f"pack_{name}", tmp_path / f"{name}.json"
        _export(path, pack, tmp_path / "db", 3, RunnerKind.SIMT)
        run = subprocess.run([sys.executable, pack / RUNNER.name, pack, out],
                             capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
        assert run.returncode == 0, run.stdout + run.stderr
        results.append(out)
    capsys.readouterr()
    saved = tmp_path / "model"
    argv = ["tune", "--train", *map(str, results), "--save-model", str(saved), "--json"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sources"] == ["rms_norm", "softmax"] and summary["candidates"] == 6
    assert [s["source"] for s in summary["held_out"]] == ["rms_norm", "softmax"]
    assert all(-1 <= s["xgboost"] <= 1 and s["tasks"] == 1 for s in summary["held_out"])
    assert json.loads((saved / "trained_on.json").read_text()) == summary
    trained = load_model(saved)
    assert isinstance(trained, XGBoostModel) and len(trained.rows) == 6
    timed = read_timed(results)
    assert trained.predict_rows([list(t.features) for t in timed]).shape == (6,)
    assert [t.from_rules for t in timed] == [True, False, False] * 2

    doc = json.loads(results[0].read_text())
    for entry in doc["manifest"]["candidates"]:
        del entry["features"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert cli.main(["tune", "--train", str(tmp_path / "old.json"), "--save-model",
                     str(tmp_path / "m2")]) == 2
    assert "old.json" in capsys.readouterr().err
    for argv, why in ((["m.onnx", "--train", str(results[0])], "--train takes no MODEL"),
                      (["--train", str(results[0])], "--train needs --save-model"),
                      (["m.onnx"], "required: --db")):
        assert cli.main(["tune", *argv]) == 2
        assert why in capsys.readouterr().err


def test_the_shipped_h200_model_loads_by_name_and_ranks() -> None:
    """``--model h200``: the xgboost model trained on the H200's measured candidates ships
    with the package with what it was trained on."""
    assert "h200" in shipped_models()
    model = load_model("h200")
    assert isinstance(model, XGBoostModel) and model.booster is not None
    trained_on = json.loads((shipped_models()["h200"] / "trained_on.json").read_text())
    assert trained_on["candidates"] == len(model.rows) > 300
    assert trained_on["mean_tau"]["xgboost"] > trained_on["mean_tau"]["analytic"]
    (task,) = extract_tasks(import_model(micro.softmax((64, 256))), TARGET)
    ranked = model.rank(candidates(task, 4))
    assert len(ranked) == 4


def test_the_committed_h200_database_applies_to_the_workload_it_timed() -> None:
    """docs/results/tuning-h200-2026-12-04/db, imported from the H200's results: compiling
    bias_gelu at its `real` size with it gives the fastest kernel measured there (51.2 us
    against the rules' 71.5). (The LayerNorm records, 13.0 us against 18.7 for layer_norm,
    keyed kernels that the corrected LayerNorm of 762bc91 changed: they no longer apply.)"""
    db = Path(__file__).resolve().parents[2] / "docs/results/tuning-h200-2026-12-04/db"
    model = next(w for w in all_workloads() if w.name == "bias_gelu").model("real")
    with use_database(db):
        scheduled = pipeline.lower(import_model(model), TARGET, flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.source is ChoiceSource.DATABASE
    assert group.choices == Choices(row_steps=2, vector=4, walk_rows=True)
