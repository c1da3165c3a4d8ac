"""Cost models that rank a task's candidates, behind one interface.

``AnalyticModel`` is the roofline estimate of the candidate's kernels from their scheduled
TIR (``analysis.roofline``): the default, needing no data. ``XGBoostModel`` learns from
measured records; its features are the plan's (waves, occupancy, threads, packing, vectors,
staging, barriers, phases) joined with the candidate's counted traffic and the analytic
estimate (``features``). It regresses the logarithm of a candidate's time relative to its
task's mean, so that tasks of very different sizes train one model and only the order
within a task matters. Why xgboost on these features rather than MetaSchedule's
``XGBModel`` over ``PerStoreFeature``: see ``docs/tuning.md``.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xgboost
from scipy.stats import kendalltau

from ..analysis.report import lowered_reports
from ..analysis.roofline import kernel_time_us
from ..plan import MappingKind, StorageLevel
from ..schedule.occupancy import device_of
from .kinds import ModelKind
from .space import Candidate


class CostModel(ABC):
    """Ranks candidates: ``predict`` gives each a score, lower meaning faster."""

    kind: ModelKind

    @abstractmethod
    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """One score per candidate, lower meaning faster; comparable within a task."""

    @abstractmethod
    def update(self, tasks: Sequence[Sequence[Candidate]],
               seconds: Sequence[Sequence[float]]) -> None:
        """Learn from measured candidates, grouped by task (``seconds[i][j]`` of
        ``tasks[i][j]``)."""

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the model to the directory ``path`` (``load_model`` reads it back)."""

    def rank(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """``candidates`` best first (stable for equal scores)."""
        scores = self.predict(candidates)
        return [candidates[i] for i in np.argsort(scores, kind="stable")]


def analytic_us(candidate: Candidate) -> float:
    """The roofline estimate of ``candidate``'s kernels, in microseconds (its lowered
    kernels' counted traffic on the target's GPU)."""
    lowered = candidate.decided.lowered
    if lowered is None:
        raise ValueError("the analytic model needs candidates built for a target")
    gpu = device_of(lowered.target)
    return sum(kernel_time_us(gpu, r.work) for r in lowered_reports(lowered))


class AnalyticModel(CostModel):
    """The roofline estimate (``analytic_us``)."""

    kind = ModelKind.ANALYTIC

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """Estimated microseconds of each candidate."""
        return np.array([analytic_us(c) for c in candidates])

    def update(self, tasks: Sequence[Sequence[Candidate]],
               seconds: Sequence[Sequence[float]]) -> None:
        """Nothing to learn: the estimate is fixed."""

    def save(self, path: str | Path) -> None:
        """Write the model's kind alone."""
        _write_kind(Path(path), self.kind)


FEATURES = (
    "log_analytic_us", "log_global_bytes", "log_accesses", "log_step_accesses",
    "log_blocks", "waves", "threads_per_block", "threads_per_row", "rows_per_block",
    "row_steps", "vector", "flat", "block_per_row", "blocks_per_sm", "max_registers",
    "shared_bytes", "staged", "reread", "inlined", "phases", "grid_barriers", "row_split",
    "column_tiles", "log_row_length", "log_rows", "row_walk",
)
"""The features of a candidate, in order."""


def features(candidate: Candidate) -> list[float]:
    """``FEATURES`` of ``candidate``."""
    group = candidate.group
    mapping, launch = group.mapping, group.launch
    reports = lowered_reports(candidate.decided.lowered) if candidate.decided.lowered else []
    traffic = [r.traffic for r in reports]
    blocks = sum(r.blocks for r in reports)
    row = dict(
        log_analytic_us=math.log1p(analytic_us(candidate)) if reports else 0.0,
        log_global_bytes=math.log1p(sum(t.global_bytes for t in traffic)),
        log_accesses=math.log1p(sum(t.accesses for t in traffic)),
        log_step_accesses=math.log1p(sum(t.step_accesses for t in traffic)),
        log_blocks=math.log1p(blocks),
        waves=launch.waves if launch is not None and launch.grid else 0.0,
        threads_per_block=mapping.threads_per_block if mapping else 0,
        threads_per_row=mapping.threads_per_row if mapping else 0,
        rows_per_block=mapping.rows_per_block if mapping else 0,
        row_steps=mapping.row_steps if mapping else 0,
        vector=mapping.vector if mapping else 0,
        flat=float(mapping is not None and mapping.kind is MappingKind.FLAT),
        block_per_row=float(mapping is not None and mapping.kind is MappingKind.BLOCK_PER_ROW),
        blocks_per_sm=launch.blocks_per_sm if launch else 0,
        max_registers=launch.max_registers if launch else 0,
        shared_bytes=group.shared_bytes,
        staged=len(group.staged),
        reread=sum(b.level is StorageLevel.GLOBAL for b in group.buffers),
        inlined=len(group.inlined),
        phases=len(group.phases),
        grid_barriers=group.grid_barriers,
        row_split=group.row_split,
        column_tiles=max((p.column_tiles for p in group.phases), default=1),
        log_row_length=math.log1p(mapping.row_length) if mapping else 0.0,
        log_rows=math.log1p(mapping.rows) if mapping else 0.0,
        row_walk=float(mapping is not None and mapping.kind is MappingKind.ROW_WALK),
    )
    return [float(row[name]) for name in FEATURES]


XGB_PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.1,
              "min_child_weight": 1, "subsample": 0.8, "colsample_bytree": 0.8,
              "verbosity": 0, "seed": 0}
"""xgboost's training parameters: shallow trees on row and feature samples, because a
tuning round trains on tens of candidates per task. On the SIMT runner's times of three
tasks' 24 candidates, trained on one half and ranking the other, these held-out Kendall taus
averaged 0.34 (no split under 0.25) against 0.18 for depth 6 with 200 rounds of 0.2."""

XGB_ROUNDS = 100
"""Boosting rounds per training."""


class XGBoostModel(CostModel):
    """xgboost on ``features``, trained on measured times (``update``); before any data it
    ranks as the analytic model does."""

    kind = ModelKind.XGBOOST

    def __init__(self) -> None:
        self.booster: xgboost.Booster | None = None
        self.rows: list[list[float]] = []
        self.labels: list[float] = []

    def update(self, tasks: Sequence[Sequence[Candidate]],
               seconds: Sequence[Sequence[float]]) -> None:
        """Add the measured candidates to the training data and retrain on all of it."""
        self.fit([[features(c) for c in cands] for cands in tasks], seconds)

    def fit(self, rows: Sequence[Sequence[Sequence[float]]],
            seconds: Sequence[Sequence[float]]) -> None:
        """``update`` for candidates given by their ``features``, task by task."""
        for task_rows, secs in zip(rows, seconds, strict=True):
            if not task_rows:
                continue
            logs = np.log(np.asarray(secs, dtype=float))
            self.rows += [[float(v) for v in row] for row in task_rows]
            self.labels += list(logs - logs.mean())
        if self.rows:
            data = xgboost.DMatrix(np.array(self.rows), label=np.array(self.labels),
                                   feature_names=list(FEATURES))
            self.booster = xgboost.train(XGB_PARAMS, data, XGB_ROUNDS)

    def predict(self, candidates: Sequence[Candidate]) -> np.ndarray:
        """Predicted log time relative to the task's mean (the analytic estimate before
        training)."""
        if self.booster is None:
            return AnalyticModel().predict(candidates)
        return self.predict_rows([features(c) for c in candidates])

    def predict_rows(self, rows: Sequence[Sequence[float]]) -> np.ndarray:
        """``predict`` for candidates given by their ``features`` (a trained model)."""
        if self.booster is None:
            raise ValueError("an untrained xgboost model predicts from candidates only")
        data = xgboost.DMatrix(np.array(rows, dtype=float), feature_names=list(FEATURES))
        return self.booster.predict(data)

    def save(self, path: str | Path) -> None:
        """Write the model (booster and training data) to the directory ``path``."""
        path = Path(path)
        _write_kind(path, self.kind)
        if self.booster is not None:
            self.booster.save_model(str(path / "booster.json"))
        (path / "training.json").write_text(json.dumps(
            {"features": list(FEATURES), "rows": self.rows, "labels": self.labels}))

    @classmethod
    def load(cls, path: str | Path) -> XGBoostModel:
        """The model ``save`` wrote to ``path``; a ValueError for one of other features."""
        path = Path(path)
        data = json.loads((path / "training.json").read_text())
        if data.get("features") != list(FEATURES):
            raise ValueError(f"{path}: a cost model of other features ({data.get('features')})")
        model = cls()
        model.rows, model.labels = data["rows"], data["labels"]
        if (path / "booster.json").exists():
            model.booster = xgboost.Booster()
            model.booster.load_model(str(path / "booster.json"))
        return model


def model_of(kind: ModelKind) -> CostModel:
    """A fresh cost model of ``kind``."""
    return AnalyticModel() if kind is ModelKind.ANALYTIC else XGBoostModel()


MODEL_FILE = "model.json"
"""The file of a saved model's directory that names its kind."""


def _write_kind(path: Path, kind: ModelKind) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / MODEL_FILE).write_text(json.dumps({"format": "tvm-stitch-cost-model/1",
                                               "kind": kind.value}))


SHIPPED = Path(__file__).with_name("trained")
"""Models trained on GPU measurements that ship with the package, one folder each, named for
the GPU (``h200``); each folder's ``trained_on.json`` says how it was made."""


def shipped_models() -> dict[str, Path]:
    """The shipped models by name."""
    return {d.name: d for d in sorted(SHIPPED.iterdir()) if (d / MODEL_FILE).is_file()} \
        if SHIPPED.is_dir() else {}


def load_model(path: str | Path) -> CostModel:
    """The cost model saved in the directory ``path``, or the shipped model of that name; a
    ValueError naming the file for anything else."""
    path = shipped_models().get(str(path), Path(path))
    try:
        meta = json.loads((path / MODEL_FILE).read_text())
        kind = ModelKind(meta["kind"])
        if meta.get("format") != "tvm-stitch-cost-model/1":
            raise ValueError(f"format {meta.get('format')!r}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path / MODEL_FILE}: not a tvm-stitch cost model ({err})") from err
    return AnalyticModel() if kind is ModelKind.ANALYTIC else XGBoostModel.load(path)


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Kendall's tau between predicted scores and measured times (1: the same order)."""
    tau = kendalltau(predicted, measured).statistic
    return 0.0 if math.isnan(tau) else float(tau)
