"""The fuzz loop behind ``scripts/fuzz.py``: N random graphs through one flow, failures kept.

Graph ``i`` of seed ``S`` is ``graphs.graph_from_seed(f"{S}:{i}")``, so any single graph can be
rebuilt without running the others. Each graph is checked (``differential.check_model``) in a
worker process, so that a hang (a deadlocked barrier) or a segfault in TVM or PoCL costs that
graph only: it counts as a crash and the worker is replaced.

A failing graph is written to ``out/<flow>-s<seed>-g<i>/`` (``model.onnx`` and ``model.json``),
then shrunk (``choices.shrink``: replays of smaller choice sequences that fail the same way),
and the minimal graph is written next to it and, with ``regressions``, saved as a regression
case (``<name>.onnx`` + ``<name>.json``, see ``tests/regressions/test_fuzz_cases.py``), which
fails until the bug is fixed. Only the
first failure of each kind (signature and message) in a run is shrunk; later ones are written
as found. Other failures met while shrinking are written as ``aside-<n>``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import onnx

from ..graph.grouping import NOTHING_TO_STITCH
from .choices import ReplayChooser, shrink
from .differential import Outcome, check_model, normalised
from .graphs import GraphConfig, describe, graph_from_seed, random_graph

SHRINK_TIMEOUT = 60.0
"""Seconds per candidate while shrinking a hang (a graph that passes takes a few)."""


@dataclass
class Options:
    """What one fuzz run does."""

    graphs: int = 100
    seed: int = 0
    start: int = 0  # index of the first graph (``start=97, graphs=1`` replays graph 97)
    flow: str = "stitch"
    target: str = "cuda:sm_90"
    out: Path | None = None
    regressions: Path | None = None
    resources: bool = True
    timeout: float = 300.0  # seconds per graph; 0 checks in this process, without a limit
    shrink_budget: int = 60  # replays per failure; 0 keeps failures unshrunk
    jobs: int = 1  # graphs checked at once, each in its own worker process
    cost: bool = True  # compare kernels and global bytes with TVM's flow (``check_model``)
    config: GraphConfig = field(default_factory=GraphConfig)


@dataclass
class Summary:
    """Counts of a fuzz run; ``line()`` is the last line ``scripts/fuzz.py`` prints."""

    graphs: int = 0
    mismatches: int = 0
    crashes: int = 0
    fallbacks: int = 0
    genuine_fallbacks: int = 0  # graphs that leave ops to TVM for a reason that costs
    tvm_crashes: int = 0
    resource_violations: int = 0
    tvm_resource_violations: int = 0
    costlier: int = 0  # graphs needing more kernels or bytes than TVM's flow (not failures)
    failures: list[str] = field(default_factory=list)
    fallback_reasons: Counter[str] = field(default_factory=Counter)
    tvm_errors: Counter[str] = field(default_factory=Counter)  # the excused crashes, by error

    def add(self, outcome: dict) -> None:
        """Count one graph's outcome."""
        self.graphs += 1
        self.mismatches += outcome["kind"] == "mismatch"
        self.crashes += outcome["kind"] == "crash"
        self.tvm_crashes += outcome["kind"] == "tvm_crash"
        if outcome["kind"] == "tvm_crash":
            self.tvm_errors[f"{outcome['stage']}, {outcome['raised_at']}: "
                            f"{_normalise(outcome['error'])}"] += 1
        self.fallbacks += bool(outcome["fallbacks"])
        reasons = {f.split(": ", 1)[-1] for f in outcome["fallbacks"]}
        self.genuine_fallbacks += bool(reasons - set(NOTHING_TO_STITCH))
        self.fallback_reasons.update({_normalise(r) for r in reasons})
        self.resource_violations += bool(outcome["violations"])
        self.tvm_resource_violations += bool(outcome["tvm_violations"])
        self.costlier += bool(outcome.get("costlier"))

    @property
    def failed(self) -> bool:
        """True when the run found wrong numbers, crashes of ours or resource violations."""
        return bool(self.mismatches or self.crashes or self.resource_violations)

    def line(self) -> str:
        """``graphs=N mismatches=M crashes=C fallbacks=F`` and the extra counts after them."""
        return (f"graphs={self.graphs} mismatches={self.mismatches} crashes={self.crashes} "
                f"fallbacks={self.fallbacks} tvm_crashes={self.tvm_crashes} "
                f"resource_violations={self.resource_violations} "
                f"tvm_resource_violations={self.tvm_resource_violations} "
                f"genuine_fallbacks={self.genuine_fallbacks} costlier={self.costlier}")


# Checking in a worker process ----------------------------------------------------------------

def _serve(conn: Connection) -> None:
    """Worker loop: receive a model (as bytes) and the arguments of ``check_model``, send the
    outcome; ``None`` ends the loop. Runs in a scratch directory: PoCL's kernel compiler drops
    debug files (``broken.dot``) into the working directory when it fails."""
    os.chdir(tempfile.mkdtemp(prefix="tvm_stitch_worker_"))
    while True:
        task = conn.recv()
        if task is None:
            return
        data, kwargs = task
        conn.send(check_model(onnx.load_from_string(data), **kwargs).to_dict())


class Checker:
    """Checks models in a worker process with a time limit, replacing the worker after a
    timeout or a crash of the process itself. ``timeout=0`` checks in this process;
    ``triage`` and ``cost`` as for ``check_model``."""

    def __init__(self, flow: str, target: str, resources: bool, timeout: float,
                 triage: bool = True, cost: bool = False) -> None:
        self.flow, self.target, self.resources, self.timeout = flow, target, resources, timeout
        self.triage, self.cost = triage, cost
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        if self._conn is None:
            ctx = mp.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve, args=(child,), daemon=True)
            self._proc.start()
            child.close()
        return self._conn

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None

    def close(self) -> None:
        """Stop the worker."""
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
        self._stop()

    def __call__(self, model: onnx.ModelProto, seed: int = 0,
                 feeds: dict[str, np.ndarray] | None = None,
                 expected: list[np.ndarray] | None = None) -> dict:
        """The outcome of ``model`` (``Outcome.to_dict()``); ``feeds`` and ``expected`` as
        for ``check_model``."""
        kwargs = {"flow": self.flow, "target": self.target, "seed": seed,
                  "resources": self.resources, "triage": self.triage, "feeds": feeds,
                  "expected": expected, "cost": self.cost}
        if self.timeout <= 0:
            return check_model(model, **kwargs).to_dict()
        conn = self._start()
        conn.send((model.SerializeToString(), kwargs))
        try:
            if conn.poll(self.timeout):
                return conn.recv()
            error = f"TimeoutError: no result within {self.timeout:g} s (hang or deadlock)"
        except (EOFError, ConnectionError):
            if self._proc is not None:
                self._proc.join(timeout=10)
            code = self._proc.exitcode if self._proc else None
            killed = f" ({signal.Signals(-code).name})" if code is not None and code < 0 else ""
            error = f"WorkerDied: exit code {code}{killed}"
        self._stop()
        return Outcome(self.flow, kind="crash", stage="worker", error=error).to_dict()


# The loop ----------------------------------------------------------------------------------

def _normalise(message: str) -> str:
    """A message without its numbers and addresses, shortened: groups failures by cause."""
    return normalised(message)[:80]


def signature(outcome: dict) -> tuple:
    """What a shrunk graph must reproduce: the kind, the stage and the exception type of a
    crash, or that resource limits are broken."""
    error_type = outcome["error"].split(":", 1)[0] if outcome["stage"] else ""
    return outcome["kind"], outcome["stage"], error_type, bool(outcome["violations"])


def is_failure(outcome: dict) -> bool:
    """True for anything but a clean pass (TVM's own crashes included: they are kept too)."""
    return outcome["kind"] != "ok" or bool(outcome["violations"])


def minimise(offsets: list[int], check: Callable[[onnx.ModelProto], dict], target_sig: tuple,
             config: GraphConfig, budget: int,
             aside: Callable[[onnx.ModelProto, dict], None] | None = None
             ) -> tuple[onnx.ModelProto, dict]:
    """Shrink a failing graph's choices; the minimal model and its outcome. Candidates that
    fail differently (another crash) are passed to ``aside``, the first of each signature."""
    found: dict[tuple[int, ...], dict] = {}
    other: set[tuple] = {target_sig}

    def fails(candidate: list[int]) -> bool:
        model = random_graph(ReplayChooser(candidate), config)
        outcome = check(model)
        if is_failure(outcome) and signature(outcome) == target_sig:
            found[tuple(candidate)] = outcome
            return True
        if is_failure(outcome) and signature(outcome) not in other and aside is not None:
            other.add(signature(outcome))
            aside(model, outcome)
        return False

    best = shrink(offsets, fails, budget)
    model = random_graph(ReplayChooser(best), config)
    outcome = found.get(tuple(best)) or check(model)
    return model, outcome


def _write_case(directory: Path, name: str, model: onnx.ModelProto, outcome: dict,
                extra: dict, trace: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / f"{name}.onnx")
    report = {"model": f"{name}.onnx", "graph": describe(model).splitlines(), **extra,
              "outcome": {k: v for k, v in outcome.items() if k != "trace"}}
    (directory / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    if trace and outcome.get("trace"):
        (directory / f"{name}.trace.txt").write_text(outcome["trace"])


def regression_case(directory: Path, name: str, model: onnx.ModelProto, outcome: dict,
                    found_by: str) -> Path:
    """Save a minimal failure as a regression case: a failing test until someone fixes it
    (``open`` says what fails; whoever fixes it replaces it with a ``note``)."""
    parts = [] if outcome["kind"] == "ok" else [
        f"{outcome['kind']} ({outcome['stage'] or 'numbers'}): {outcome['error'][:300]}"]
    if outcome["violations"]:
        parts.append("resources: " + "; ".join(outcome["violations"][:3]))
    reason = "; ".join(parts)
    _write_case(directory, name, model, outcome,
                {"flows": [outcome["flow"]], "seed": 0, "found_by": found_by,
                 "open": f"found by fuzzing, not fixed yet: {reason}"}, trace=False)
    return directory / f"{name}.json"


def run(options: Options, log: Callable[[str], None] = print,
        done: Callable[[Summary], None] | None = None) -> Summary:
    """Run ``options.graphs`` graphs, ``options.jobs`` at a time (one worker process each);
    outcomes are counted in graph order, failures written, shrunk and saved as they come.
    ``done`` is called with the summary so far after each graph (a progress bar)."""
    summary = Summary()
    local = threading.local()
    checkers: list[Checker] = []

    def check(model: onnx.ModelProto) -> tuple[dict, float]:
        if not hasattr(local, "checker"):
            local.checker = Checker(options.flow, options.target, options.resources,
                                    options.timeout, cost=options.cost)
            checkers.append(local.checker)
        start = time.time()
        return local.checker(model), time.time() - start

    shrinker = Checker(options.flow, options.target, options.resources, options.timeout)
    shrunk: set[tuple] = set()
    pending: deque = deque()
    graphs = _graphs(options)
    try:
        with ThreadPoolExecutor(max_workers=options.jobs) as pool:
            while True:
                # a window of a few graphs per job keeps every worker busy, not all in memory
                for index, model, offsets in islice(graphs, 2 * options.jobs - len(pending)):
                    pending.append((index, model, offsets, pool.submit(check, model)))
                if not pending:
                    break
                index, model, offsets, future = pending.popleft()
                outcome, seconds = future.result()
                summary.add(outcome)
                if is_failure(outcome):
                    # Shrink the first failure of each kind only: the same bug tends to recur.
                    known = _bug_key(outcome)
                    _keep(options, index, model, offsets, outcome, shrinker, summary, log,
                          shrink_it=known not in shrunk)
                    shrunk.add(known)
                elif outcome["tvm_violations"]:
                    log(f"graph {index}: ok, but a kernel TVM scheduled breaks a limit: "
                        f"{outcome['tvm_violations'][0]}")
                elif outcome["costlier"]:
                    log(f"graph {index}: ok, but costlier than TVM's flow: "
                        f"{outcome['costlier']}")
                elif index % 50 == 0:
                    log(f"graph {index}: ok ({seconds:.1f} s) {summary.line()}")
                if done is not None:
                    done(summary)
    finally:
        for checker in [*checkers, shrinker]:
            checker.close()
    return summary


def _graphs(options: Options) -> Iterator[tuple[int, onnx.ModelProto, list[int]]]:
    for index in range(options.start, options.start + options.graphs):
        yield index, *graph_from_seed(f"{options.seed}:{index}", options.config)


def _what(outcome: dict) -> str:
    """One line saying how a check failed."""
    if outcome["kind"] == "ok":
        return f"resources: {outcome['violations'][0] if outcome['violations'] else 'ok'}"
    stage = f" at {outcome['stage']}" if outcome["stage"] else ""
    return f"{outcome['kind']}{stage}: {outcome['error'][:300]}"


def _bug_key(outcome: dict) -> tuple:
    """A failure's signature and the start of its message without numbers and addresses."""
    return (*signature(outcome), _normalise(outcome["error"]))


def _keep(options: Options, index: int, model: onnx.ModelProto, offsets: list[int],
          outcome: dict, checker: Checker, summary: Summary, log: Callable[[str], None],
          shrink_it: bool = True) -> None:
    """Report, write, shrink (``shrink_it``) and save one failing graph."""
    name = f"{options.flow}-s{options.seed}-g{index}"
    log(f"graph {index}: {_what(outcome)}"
        + (f" (baseline: {outcome['baseline']})" if outcome["baseline"] else "")
        + ("".join(f"\n  resources: {v}" for v in outcome["violations"][:5])))
    summary.failures.append(f"{name}: {_what(outcome)[:200]}")
    found_by = f"scripts/fuzz.py --seed {options.seed} --flow {options.flow}, graph {index}"
    if options.out is not None:
        _write_case(options.out / name, "model", model, outcome,
                    {"found_by": found_by, "choices": offsets})
    if options.shrink_budget <= 0 or not shrink_it:
        if not shrink_it:
            log("  (not shrunk: a failure like this one was shrunk earlier in this run)")
        return
    def aside(model: onnx.ModelProto, other: dict) -> None:
        what = _what(other)
        summary.failures.append(f"{name} (while shrinking): {what}")
        log(f"  while shrinking, another failure: {what}")
        if options.out is not None:
            _write_case(options.out / name, f"aside-{len(summary.failures)}", model, other,
                        {"found_by": found_by + " (while shrinking)"})

    # A hang costs the whole timeout per candidate: shrink hangs under a shorter one.
    full_timeout = checker.timeout
    if outcome["error"].startswith("TimeoutError"):
        checker.timeout = min(full_timeout, SHRINK_TIMEOUT)
    try:
        minimal, minimal_outcome = minimise(offsets, checker, signature(outcome),
                                            options.config, options.shrink_budget, aside)
    finally:
        checker.timeout = full_timeout
    log(f"  shrunk to {len(minimal.graph.node)} node(s):\n    "
        + describe(minimal).replace("\n", "\n    "))
    if options.out is not None:
        _write_case(options.out / name, "minimal", minimal, minimal_outcome,
                    {"found_by": found_by + " (shrunk)"})
    if options.regressions is not None:
        path = regression_case(options.regressions, name, minimal, minimal_outcome,
                               found_by + " (shrunk)")
        log(f"  regression case {path}")
