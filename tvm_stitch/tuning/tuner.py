"""The auto-tuner: per task, the cost model ranks the candidates, the best few are built and
measured, the records go to the database, and the model retrains between rounds.

The rules' kernel is always measured first, so a task's best record is never slower than
the default plan on the runner that measured it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm
from tvm.ir import IRModule
from tvm.target import Target

from ..plan import Choices
from ..schedule.decisions.choosing import Task
from ..schedule.rows import Unstitchable
from ..target import parse_target
from .cost import CostModel, XGBoostModel
from .database import Database, Record
from .measure import MeasureInput, Runner
from .space import Candidate, candidates
from .tasks import extract_tasks, target_key, workload_key

BATCH = 4
"""Candidates measured per round of a task, between two trainings of the model."""

POOL_FACTOR = 4
"""Candidates built per task: this many times its trials (the model ranks them all)."""


@dataclass
class TaskResult:
    """What tuning did for one task: its candidates measured (seconds, None for a failed
    measurement) and the best of them."""

    workload: str
    ops: tuple[str, ...]
    measured: list[tuple[Candidate, float | None]] = field(default_factory=list)

    @property
    def default_seconds(self) -> float | None:
        """The rules' kernel's time."""
        return next((s for c, s in self.measured if c.choices == Choices()), None)

    @property
    def best(self) -> tuple[Candidate, float] | None:
        """The fastest candidate measured, and its time."""
        timed = [(c, s) for c, s in self.measured if s is not None]
        return min(timed, key=lambda cs: cs[1], default=None)

    @property
    def speedup(self) -> float | None:
        """Default time over best time."""
        best, default = self.best, self.default_seconds
        return None if best is None or not default else default / best[1]


def tune(mod: IRModule, target: str | Target, *, trials: int, database: Database,
         runner: Runner, model: CostModel | None = None, seed: int = 0,
         progress: bool | None = None, log: Callable[[str], None] | None = None
         ) -> list[TaskResult]:
    """Tune every task of ``mod`` on ``target``: at most ``trials`` measured candidates per
    task, in rounds of ``BATCH``, ranked by ``model`` (an ``XGBoostModel`` trained as it
    goes, by default); every measurement is recorded in ``database``. ``progress`` shows a
    bar (default: when on a terminal); ``log`` gets a line per task."""
    target = parse_target(target)
    model = model if model is not None else XGBoostModel()
    tasks = extract_tasks(mod, target)
    results = []
    bar = tqdm(total=trials * len(tasks), unit="trial", desc="tuning",
               disable=None if progress is None else not progress)  # None: on a terminal
    try:
        for task in tasks:
            result = _tune_task(task, target, trials, database, runner, model, seed, bar)
            results.append(result)
            if log is not None:
                log(_summary(result))
    finally:
        bar.close()
    return results


def _tune_task(task: Task, target: Target, trials: int, database: Database, runner: Runner,
               model: CostModel, seed: int, bar: tqdm) -> TaskResult:
    key = workload_key(task)
    result = TaskResult(key, task.group.ops)
    try:
        pool = candidates(task, max(trials * POOL_FACTOR, BATCH), seed)
    except Unstitchable:
        bar.update(trials)
        return result
    rest = pool[1:]
    while len(result.measured) < min(trials, len(pool)):
        batch = [] if result.measured else [pool[0]]  # the rules' kernel first
        take = min(BATCH, trials - len(result.measured)) - len(batch)
        rest = model.rank(rest) if rest else rest
        batch, rest = batch + rest[:take], rest[take:]
        timed = _measure(batch, target, runner)
        for cand, seconds in timed:
            result.measured.append((cand, seconds))
            if seconds is not None:
                database.add(Record(key, target_key(target), cand.choices, cand.group,
                                    seconds, runner.kind))
        ok = [(c, s) for c, s in timed if s is not None]
        if ok:
            model.update([[c for c, _ in ok]], [[s for _, s in ok]])
        best = result.best
        bar.update(len(batch))
        bar.set_postfix_str(f"{','.join(task.group.ops)[:24]} best "
                            f"{best[1] * 1e6:.1f} us" if best else "")
    bar.update(trials - len(result.measured))
    return result


def _measure(batch: Sequence[Candidate], target: Target, runner: Runner
             ) -> list[tuple[Candidate, float | None]]:
    inputs = [MeasureInput(str(i), c.decided.scheduled, target) for i, c in enumerate(batch)]
    results = runner.measure(inputs)
    return [(c, r.seconds if r.seconds is not None and math.isfinite(r.seconds) else None)
            for c, r in zip(batch, results, strict=True)]


def _summary(result: TaskResult) -> str:
    best, default = result.best, result.default_seconds
    if best is None:
        return f"{', '.join(result.ops)}: nothing measured"
    speed = f", {result.speedup:.2f}x the default plan" if result.speedup else ""
    base = f"default {default * 1e6:.1f} us, " if default else ""
    return (f"{', '.join(result.ops)}: {len(result.measured)} measured, {base}"
            f"best {best[1] * 1e6:.1f} us ({best[0].choices}){speed}")
