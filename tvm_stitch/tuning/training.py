"""Cost models from the times a tuning pack's runner measured, and how well they rank.

A pack's manifest holds every candidate's features (``cost.features``, by name) and its
runner's results file holds the manifest with the times, so the files alone train a model:
no candidate is rebuilt. ``read_timed`` reads them; ``train`` fits an ``XGBoostModel`` on all
of them; ``held_out_taus`` says how well a model ranks what it did not see: for each source
(a results file: one workload), the xgboost model trained on the other sources and the
analytic estimate each rank that source's tasks, scored by Kendall's tau against the
measured times per task (tasks of fewer than ``MIN_RANKED`` timed candidates are left out).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cost import FEATURES, XGBoostModel, kendall_tau
from .database import DatabaseError
from .pack_runner import RESULTS_FORMAT

MIN_RANKED = 3
"""Fewest timed candidates of a task for its ranking to count."""

RULES_CANDIDATE = 0
"""The index of the rules' own kernel among a task's candidates in a pack (``g<t>c<c>``)."""


@dataclass(frozen=True)
class Timed:
    """One candidate a pack's runner timed."""

    source: str  # the results file's name without ".json": one workload's pack
    task: str  # the group's workload key
    ident: str  # its id in the pack, g<task>c<candidate>
    features: tuple[float, ...]  # in FEATURES order
    seconds: float

    @property
    def from_rules(self) -> bool:
        """Whether this is the rules' kernel (what compile picks without a database)."""
        return _candidate_index(self.ident) == RULES_CANDIDATE

    @property
    def analytic_us(self) -> float:
        """The analytic model's estimate, from its feature (``log1p`` of microseconds)."""
        return math.expm1(self.features[FEATURES.index("log_analytic_us")])


def _candidate_index(ident: str) -> int:
    found = re.fullmatch(r"g\d+c(\d+)", ident)
    if found is None:
        raise ValueError(f"candidate id {ident!r} is not g<task>c<candidate>")
    return int(found.group(1))


def read_timed(paths: Iterable[str | Path]) -> list[Timed]:
    """The timed candidates of the runner's results files at ``paths`` (failed ones left
    out); a DatabaseError naming the file for one that is not such results or whose pack
    recorded no features (a pack exported before they were)."""
    timed = []
    for path in map(Path, paths):
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != RESULTS_FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {RESULTS_FORMAT}")
            seconds = {r["id"]: r["seconds"] for r in doc["results"] if r.get("seconds")}
            for entry in doc["manifest"]["candidates"]:
                took = seconds.get(entry["id"])
                if took is None or not math.isfinite(float(took)) or float(took) <= 0:
                    continue
                if list(entry["features"]) != list(FEATURES):
                    raise ValueError(f"{entry['id']} has features {list(entry['features'])}")
                timed.append(Timed(path.name.removesuffix(".json"), str(entry["workload"]),
                                   str(entry["id"]), tuple(map(float,
                                                               entry["features"].values())),
                                   float(took)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise DatabaseError(f"{path}: not usable tuning results ({type(err).__name__}: "
                                f"{err})") from err
    return timed


def by_task(timed: Sequence[Timed]) -> dict[tuple[str, str], list[Timed]]:
    """``timed`` grouped by (source, task), in order."""
    tasks: dict[tuple[str, str], list[Timed]] = {}
    for t in timed:
        tasks.setdefault((t.source, t.task), []).append(t)
    return tasks


def train(timed: Sequence[Timed]) -> XGBoostModel:
    """An xgboost model trained on every task of ``timed``."""
    model = XGBoostModel()
    tasks = list(by_task(timed).values())
    model.fit([[list(t.features) for t in task] for task in tasks],
              [[t.seconds for t in task] for task in tasks])
    return model


@dataclass(frozen=True)
class HeldOut:
    """Kendall's tau of each model on one source's tasks, trained without that source."""

    source: str
    tasks: int  # tasks ranked (at least MIN_RANKED timed candidates)
    xgboost: float  # mean tau over those tasks
    analytic: float


def held_out_taus(timed: Sequence[Timed]) -> list[HeldOut]:
    """Per source with a task to rank: the taus of the xgboost model trained on the other
    sources and of the analytic estimate (leave one workload out)."""
    tasks = by_task(timed)
    scores = []
    for source in sorted({t.source for t in timed}):
        ranked = [task for (s, _), task in tasks.items()
                  if s == source and len(task) >= MIN_RANKED]
        others = [t for t in timed if t.source != source]
        if not ranked or not others:
            continue
        model = train(others)
        xgb = [kendall_tau(model.predict_rows([list(t.features) for t in task]),
                           [t.seconds for t in task]) for task in ranked]
        analytic = [kendall_tau([t.analytic_us for t in task], [t.seconds for t in task])
                    for task in ranked]
        scores.append(HeldOut(source, len(ranked), float(np.mean(xgb)),
                              float(np.mean(analytic))))
    return scores
