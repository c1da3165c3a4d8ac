"""The tuning database: measured candidates of groups, keyed by workload and target, and the
chooser that applies the best of them when compiling.

A database is a directory with one JSON-lines file (``records.jsonl``), one record per
measured candidate: the workload key and target key (``tasks``), the choices, the plan entry
they gave, the measured seconds and the runner that measured them. Records are only ever
appended. A line that is not a record of ours is an error that names the file and line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..plan import Choices, ChoiceSource, Group, StitchPlan
from ..schedule.decisions import Decided, decide
from ..schedule.decisions.choosing import Chooser, Task, choosing
from ..schedule.rows import Unstitchable
from .kinds import RunnerKind
from .space import candidates
from .tasks import target_key, workload_key

if TYPE_CHECKING:
    from .cost import CostModel

RECORDS = "records.jsonl"
"""The records file of a database directory."""

FORMAT = "tvm-stitch-tuning-record/1"
"""The format tag of every record."""


class DatabaseError(ValueError):
    """A database directory or file that is not ours, or corrupt."""


@dataclass(frozen=True)
class Record:
    """One measured candidate: what it is for (``workload``, ``target``), how it was built
    (``choices``), the plan entry that gave (``group``), and its time."""

    workload: str
    target: str
    choices: Choices
    group: Group
    seconds: float
    runner: RunnerKind

    def to_json(self) -> str:
        """The record as one JSON line."""
        plan = StitchPlan(groups=(self.group,)).to_dict()
        return json.dumps({"format": FORMAT, "workload": self.workload, "target": self.target,
                           "choices": plan["groups"][0]["choices"],
                           "group": plan["groups"][0], "seconds": self.seconds,
                           "runner": self.runner.value}, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Record:
        """Inverse of ``to_json``; a ValueError (KeyError, TypeError) for anything else."""
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} record")
        group = StitchPlan.from_dict({"groups": [data["group"]]}).groups[0]
        return cls(str(data["workload"]), str(data["target"]), group.choices, group,
                   float(data["seconds"]), RunnerKind(data["runner"]))


class Database:
    """The records of the directory ``path`` (created if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise DatabaseError(f"{self.path}: a tuning database is a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        self.records: list[Record] = list(self._read())

    def _read(self) -> Iterator[Record]:
        file = self.path / RECORDS
        if not file.exists():
            return
        try:
            lines = file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise DatabaseError(f"{file}: cannot be read as a tuning database: {err}") from err
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_json(line)
            except (ValueError, KeyError, TypeError) as err:
                raise DatabaseError(f"{file}, line {number}: not a tvm-stitch tuning record "
                                    f"({type(err).__name__}: {err})") from err

    def add(self, record: Record) -> None:
        """Append ``record``."""
        self.records.append(record)
        with open(self.path / RECORDS, "a") as out:
            out.write(record.to_json() + "\n")

    def best(self, workload: str, target: str) -> Record | None:
        """The fastest record of ``workload`` on ``target``, or None."""
        matching = [r for r in self.records if r.workload == workload and r.target == target]
        return min(matching, key=lambda r: r.seconds, default=None)


class DatabaseChooser(Chooser):
    """Applies the best record of a group's workload on the compile's target; for the
    groups it has none of (all of them without a database), the candidate ``model`` ranks
    first (none without a model: the rules decide)."""

    def __init__(self, database: Database | None, model: CostModel | None = None,
                 limit: int = 16) -> None:
        self.database = database
        self.model = model
        self.limit = limit

    def preferred(self, task: Task) -> Iterator[Decided]:
        """The recorded kernel of ``task``, else the model's first candidate."""
        best = None if self.database is None else \
            self.database.best(workload_key(task), target_key(task.target))
        if best is not None:
            try:
                decided = decide(task.func, task.group, task.rows, task.target, best.choices)
            except Unstitchable:
                decided = None
            if decided is not None:
                yield replace(decided, group=replace(decided.group,
                                                     source=ChoiceSource.DATABASE))
                return
        if self.model is None:
            return
        try:
            found = candidates(task, self.limit)
        except Unstitchable:
            return
        first = self.model.rank(found)[0]
        if first.choices != Choices():
            yield replace(first.decided, group=replace(first.group,
                                                       source=ChoiceSource.COST_MODEL))


def add_database_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--db DIR`` and ``--model NAME|DIR`` arguments of the commands that compile
    (verify, compile, inspect)."""
    parser.add_argument("--db", metavar="DIR",
                        help="a tuning database (tvm-stitch tune): the stitch flow applies "
                             "its best record to every group it matches")
    parser.add_argument("--model", dest="cost_model", metavar="NAME|DIR",
                        help="a cost model picks the kernel of every group --db has no "
                             "record of, among its first 16 candidates: a shipped model "
                             "(h200: trained on an H200's measured times) or a saved one's "
                             "directory; without it the rules decide")


def database_or_none(path: str | Path | None, model: str | Path | None = None
                     ) -> contextlib.AbstractContextManager:
    """``use_database(path, model)``, or nothing when both are None. A DatabaseError for a
    ``model`` that is no cost model."""
    if path is None and model is None:
        return contextlib.nullcontext()
    if model is not None:
        from .cost import load_model  # xgboost loads only when a model is asked for

        try:
            model = load_model(model)
        except ValueError as err:
            raise DatabaseError(str(err)) from err
    return use_database(path, model)


@contextmanager
def use_database(path: str | Path | None, model: CostModel | None = None
                 ) -> Iterator[Database | None]:
    """Within the block, compiles with ``relax_pipeline="stitch"`` apply the best record of
    the database at ``path`` (none for None) to every group it matches, and ``model`` to the
    rest."""
    database = None if path is None else Database(path)
    with choosing(DatabaseChooser(database, model)):
        yield database


def same_plan(a: Group, b: Group) -> bool:
    """Whether two plan entries decide the same kernel (what chose them aside)."""
    return asdict(replace(a, source=ChoiceSource.HEURISTIC)) == \
        asdict(replace(b, source=ChoiceSource.HEURISTIC))
