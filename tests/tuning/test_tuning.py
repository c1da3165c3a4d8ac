"""The tuner end to end without a GPU: candidates measured on the SIMT runner (CPU times,
which test the machinery), a database a compile reproduces, cost models that rank, and the
RPC path on loopback."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from tvm_stitch import cli, pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, ChoiceSource, StitchPlan
from tvm_stitch.target import parse_target
from tvm_stitch.tuning.cost import (
    AnalyticModel,
    XGBoostModel,
    kendall_tau,
    load_model,
)
from tvm_stitch.tuning.database import Database, DatabaseError, same_plan, use_database
from tvm_stitch.tuning.measure import MeasureInput, RPCRunner, SimtRunner
from tvm_stitch.tuning.space import candidates
from tvm_stitch.tuning.tasks import extract_tasks, target_key, workload_key
from tvm_stitch.tuning.tuner import tune
from tvm_stitch.workloads import micro

TARGET = "cuda:sm_90"


def _softmax() -> onnx.ModelProto:
    return micro.softmax((64, 256))


@functools.cache
def _tuned(tmp: str) -> tuple[Path, list]:
    db = Path(tmp) / "db"
    with SimtRunner() as runner:
        results = tune(import_model(_softmax()), TARGET, trials=4, database=Database(db),
                       runner=runner, progress=False)
    return db, results


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """A database from a SIMT tuning of a softmax, and the tuner's results."""
    return _tuned(str(tmp_path_factory.mktemp("tuned")))


def test_simt_tuning_writes_a_database_that_a_compile_reproduces(tuned) -> None:
    db, results = tuned
    (result,) = results
    assert len(result.measured) == 4
    assert result.measured[0][0].choices == Choices(), "the rules' kernel is measured first"
    best, seconds = result.best
    assert seconds <= result.default_seconds
    records = Database(db).records
    assert len(records) == 4 and all(r.seconds > 0 for r in records)
    with use_database(db):
        scheduled = pipeline.lower(import_model(_softmax()), TARGET, flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.source is ChoiceSource.DATABASE
    assert same_plan(group, Database(db).best(result.workload, target_key(
        parse_target(TARGET))).group)
    assert same_plan(group, best.group)
    assert "chosen by the database" in str(StitchPlan.of_module(scheduled))
    assert verify.run_simt(scheduled, _softmax()).ok


def test_records_of_one_target_are_never_applied_to_another(tuned) -> None:
    db, _ = tuned
    with use_database(db):
        scheduled = pipeline.lower(import_model(_softmax()), "cuda:sm_80", flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.source is ChoiceSource.HEURISTIC


def test_verify_applies_a_database(tuned, tmp_path: Path, capsys) -> None:
    db, _ = tuned
    path = tmp_path / "softmax.onnx"
    onnx.save(_softmax(), path)
    assert cli.main(["verify", str(path), "--pipeline", "stitch", "--target", TARGET,
                     "--db", str(db)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["groups_from_database"] == 1


def test_a_corrupt_or_foreign_database_is_a_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "records.jsonl").write_text('{"format": "something else"}\n')
    with pytest.raises(DatabaseError, match=r"records.jsonl, line 1: not a tvm-stitch"):
        Database(tmp_path)
    (tmp_path / "records.jsonl").write_text("not json at all\n")
    with pytest.raises(DatabaseError, match="line 1"):
        Database(tmp_path)
    model = tmp_path / "softmax.onnx"
    onnx.save(_softmax(), model)
    assert cli.main(["verify", str(model), "--pipeline", "stitch", "--db", str(tmp_path)]) == 2
    assert "not a tvm-stitch tuning record" in capsys.readouterr().err
    afile = tmp_path / "a_file"
    afile.write_text("")
    with pytest.raises(DatabaseError, match="is a directory"):
        Database(afile)


def _measured(model: onnx.ModelProto, limit: int) -> list[tuple[list, list[float]]]:
    """Per task of ``model``: its first ``limit`` candidates and their SIMT times."""
    out = []
    with SimtRunner() as runner:
        for task in extract_tasks(import_model(model), TARGET):
            cands = candidates(task, limit)
            results = runner.measure([MeasureInput(str(i), c.decided.scheduled,
                                                   parse_target(TARGET))
                                      for i, c in enumerate(cands)])
            timed = [(c, r.seconds) for c, r in zip(cands, results, strict=True) if r.seconds]
            out.append(([c for c, _ in timed], [s for _, s in timed]))
    return out


def test_xgboost_ranks_held_out_candidates_better_than_chance(tmp_path: Path) -> None:
    start = time.monotonic()
    tasks = [task for model in (micro.softmax((64, 1024)), micro.layer_norm((128, 512)),
                                micro.rms_norm((256, 256)))
             for task in _measured(model, 24)]
    train = [(c[::2], s[::2]) for c, s in tasks]
    held = [(c[1::2], s[1::2]) for c, s in tasks]
    model = XGBoostModel()
    model.update([c for c, _ in train], [s for _, s in train])
    taus = [kendall_tau(model.predict(c), s) for c, s in held]
    analytic = [kendall_tau(AnalyticModel().predict(c), s) for c, s in held]
    print(f"held-out Kendall tau, xgboost: {np.round(taus, 2)}, analytic: "
          f"{np.round(analytic, 2)}; {sum(len(c) for c, _ in tasks)} candidates measured in "
          f"{time.monotonic() - start:.0f} s")
    assert np.mean(taus) > 0
    model.save(tmp_path / "model")
    loaded = load_model(tmp_path / "model")
    assert np.allclose(loaded.predict(held[0][0]), model.predict(held[0][0]))


def test_a_saved_model_of_other_features_or_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a tvm-stitch cost model"):
        load_model(tmp_path)
    XGBoostModel().save(tmp_path)
    data = json.loads((tmp_path / "training.json").read_text())
    (tmp_path / "training.json").write_text(json.dumps({**data, "features": ["other"]}))
    with pytest.raises(ValueError, match="other features"):
        load_model(tmp_path)


def test_a_cost_model_chooses_for_groups_the_database_lacks(tmp_path: Path) -> None:
    with use_database(tmp_path, AnalyticModel()):
        scheduled = pipeline.lower(import_model(micro.softmax((64, 1024))), TARGET,
                                   flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    if group.source is ChoiceSource.COST_MODEL:
        assert group.choices != Choices()
    else:  # the analytic model ranked the rules' kernel first
        assert group.source is ChoiceSource.HEURISTIC
    assert verify.run_simt(scheduled, micro.softmax((64, 1024))).ok


def test_tuning_through_rpc_on_loopback(simt_server, tmp_path: Path) -> None:
    tracker_port, key = simt_server
    start = time.monotonic()
    with RPCRunner("127.0.0.1", tracker_port, key, simt=True, number=2, max_workers=1,
                   session_timeout_sec=60, queue_timeout_sec=30) as runner:
        (result,) = tune(import_model(_softmax()), TARGET, trials=3,
                         database=Database(tmp_path), runner=runner, progress=False)
    assert [s is not None for _, s in result.measured] == [True] * 3
    (task,) = extract_tasks(import_model(_softmax()), TARGET)
    assert {r.workload for r in Database(tmp_path).records} == {workload_key(task)}
    assert time.monotonic() - start < 180


def test_verify_with_the_shipped_model_alone(tmp_path: Path, capsys) -> None:
    """``verify --model h200`` (no database): the model trained on the H200's times picks
    among each group's candidates; what it picks matches onnxruntime. A model that is none
    is a clear error."""
    path = tmp_path / "scale_mask_softmax.onnx"
    onnx.save(micro.scale_mask_softmax((8, 4, 64, 64)), path)
    assert cli.main(["verify", str(path), "--pipeline", "stitch", "--target", TARGET,
                     "--model", "h200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["groups_from_cost_model"] in (0, 1)
    assert "groups_from_database" not in out
    assert cli.main(["verify", str(path), "--pipeline", "stitch", "--model",
                     str(tmp_path / "nothing")]) == 2
    assert "not a tvm-stitch cost model" in capsys.readouterr().err
