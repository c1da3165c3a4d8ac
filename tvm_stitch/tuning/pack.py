"""Tuning for a GPU this machine cannot reach: a pack of built candidates, measured there.

``export_pack`` (``tvm-stitch tune MODEL --export PACK``) builds, for every task, the
candidates that ``tune`` would measure: the rules' kernel first, then the cost model's best,
``trials`` in all (ranked once: with no measurements here, the model learns nothing between
rounds). ``pack_runner.py``, copied into the pack, times them on the GPU machine and writes a
results file; ``import_results`` (``tvm-stitch tune --import RESULTS --db DIR``) appends one
record per timed candidate to a database, as if ``tune`` had measured it.

Layout of a pack::

    manifest.json       what the pack holds (below)
    kernels/<id>.so     a CUDA pack (runner ``local``): each candidate's library, for
                        ``tvm.runtime.load_module`` (``measure.build_cuda``, exported; its CUDA
                        source is compiled when it is loaded on the GPU)
    kernels/<id>.json   a SIMT pack (runner ``simt``, the CPU self-test of the whole loop):
                        each candidate's kernel serialised (``measure.serialize``)
    pack_runner.py      the runner: ``python PACK/pack_runner.py PACK RESULTS``

The manifest (``pack_runner.PACK_FORMAT``) holds the target's key (``tasks.target_key``) and
arch, the runner kind, the tvm-stitch and TVM versions, the date, the entry function and the
seed of the arguments, and per candidate: its id, workload key, operators, plan entry (as a
database record holds it), artifact (relative to the pack), the dtype and shape of every
buffer parameter, the positions of the parameters that must start zeroed (the grid
barrier's state, ``measure.zeroed_params``), and its cost-model features by name
(``cost.features``: what a model trains on once the times come back). A candidate that
does not build is listed under ``build_errors`` instead.

The results file (``pack_runner.RESULTS_FORMAT``) carries the manifest, the machine, the
timing settings and per candidate its seconds or its error, so importing needs it alone.
"""

from __future__ import annotations

import datetime
import json
import math
import shutil
from pathlib import Path
from typing import Any

import tvm
from tvm.ir import IRModule
from tvm.target import Target

from .. import __version__
from ..plan import StitchPlan
from ..schedule.decisions.choosing import Task
from ..schedule.rows import Unstitchable
from ..target import parse_target
from . import measure
from .cost import FEATURES, CostModel, features
from .database import Database, DatabaseError, Record
from .kinds import RunnerKind
from .pack_runner import PACK_FORMAT, RESULTS_FORMAT
from .space import Candidate, candidates
from .tasks import extract_tasks, target_key, workload_key
from .tuner import BATCH, POOL_FACTOR

MANIFEST = "manifest.json"
"""The manifest file of a pack."""

KERNELS = "kernels"
"""The folder of a pack's artifacts."""

RUNNER = Path(__file__).with_name("pack_runner.py")
"""The runner script, copied into every pack."""

PACK_RUNNERS = (RunnerKind.LOCAL, RunnerKind.SIMT)
"""The runners a pack is for: a CUDA GPU's, or the SIMT runner's."""

ENTRY = "main"
"""The function of every artifact that the runner times (``measure.kernel_module``)."""

ERROR_CHARS = 2000
"""How much of a build error the manifest keeps."""


def chosen_candidates(task: Task, trials: int, model: CostModel, seed: int = 0
                      ) -> list[Candidate]:
    """The candidates of ``task`` a pack holds: of the ``tune`` pool (``space.candidates``,
    ``POOL_FACTOR`` times ``trials``), the rules' kernel, then ``model``'s best; ``trials``
    in all; none for a task that does not stitch."""
    try:
        pool = candidates(task, max(trials * POOL_FACTOR, BATCH), seed)
    except Unstitchable:
        return []
    rest = model.rank(pool[1:])[:trials - 1] if len(pool) > 1 else []
    return [pool[0], *rest]


def _argument_specs(func: tvm.tirx.PrimFunc) -> list[dict[str, Any]]:
    return [{"dtype": str(p.dtype), "shape": [int(d) for d in p.shape]} for p in func.params]


def export_pack(mod: IRModule, target: str | Target, path: str | Path, *, trials: int,
                model: CostModel, runner_kind: RunnerKind, seed: int = 0) -> Path:
    """Write the pack of ``mod``'s tasks on ``target`` to the directory ``path`` (new, or
    empty): ``chosen_candidates`` of every task, built for ``runner_kind`` (``local``: CUDA
    libraries; ``simt``: serialised kernels), its manifest and the runner script (see the
    module's doc). Returns ``path``. A ValueError for a runner a pack is not for or fewer
    than one trial, a FileExistsError when ``path`` holds something."""
    runner_kind = RunnerKind(runner_kind)
    if runner_kind not in PACK_RUNNERS:
        raise ValueError(f"a pack is measured by the {' or '.join(PACK_RUNNERS)} runner, not "
                         f"{runner_kind.value}")
    if trials < 1:
        raise ValueError(f"a pack needs at least one trial per group, not {trials}")
    pack = Path(path)
    if pack.exists() and (not pack.is_dir() or any(pack.iterdir())):
        raise FileExistsError(f"{pack}: exists and is not an empty directory")
    (pack / KERNELS).mkdir(parents=True, exist_ok=True)
    target = parse_target(target)
    entries, build_errors = [], []
    for t, task in enumerate(extract_tasks(mod, target)):
        key = workload_key(task)
        for c, cand in enumerate(chosen_candidates(task, trials, model, seed)):
            ident, func = f"g{t}c{c}", cand.decided.scheduled
            if runner_kind is RunnerKind.SIMT:
                artifact = f"{KERNELS}/{ident}.json"
                (pack / artifact).write_text(measure.serialize(func))
            else:
                artifact = f"{KERNELS}/{ident}.so"
                try:
                    built = measure.build_cuda(measure.kernel_module(func), target)
                except (ValueError, RuntimeError) as err:
                    build_errors.append({"id": ident, "workload": key,
                                         "error": str(err)[:ERROR_CHARS]})
                    continue
                built.export_library(str(pack / artifact))
            entries.append({"id": ident, "workload": key, "ops": list(cand.group.ops),
                            "group": StitchPlan(groups=(cand.group,)).to_dict()["groups"][0],
                            "artifact": artifact, "args": _argument_specs(func),
                            "zeroed": list(measure.zeroed_indices(func)),
                            "features": dict(zip(FEATURES, features(cand), strict=True))})
    manifest = {
        "format": PACK_FORMAT, "target": target_key(target),
        "arch": str(target.attrs.get("arch", "")), "runner": runner_kind.value,
        "versions": {"tvm_stitch": __version__, "tvm": tvm.__version__},
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "entry": ENTRY, "seed": measure.SEED, "trials": trials,
        "candidates": entries, "build_errors": build_errors}
    (pack / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.copy2(RUNNER, pack / RUNNER.name)
    return pack


def _records(manifest: dict[str, Any], results: list[dict[str, Any]]) -> list[Record]:
    """The records of the timed candidates (finite, positive seconds)."""
    runner = RunnerKind(manifest["runner"])
    if runner not in PACK_RUNNERS:
        raise ValueError(f"a pack for the runner {runner.value}")
    seconds = {r["id"]: r["seconds"] for r in results if r.get("seconds") is not None}
    records = []
    for entry in manifest["candidates"]:
        took = seconds.get(entry["id"])
        if took is None or not math.isfinite(float(took)) or float(took) <= 0:
            continue
        group = StitchPlan.from_dict({"groups": [entry["group"]]}).groups[0]
        records.append(Record(str(entry["workload"]), str(manifest["target"]), group.choices,
                              group, float(took), runner))
    return records


def import_results(results_path: str | Path, database: Database) -> int:
    """Append to ``database`` a record of every candidate timed in the results file at
    ``results_path`` (``pack_runner.py``'s), with the pack's runner kind (``local`` for a
    CUDA pack, ``simt`` for a SIMT pack); returns how many. A record the database holds
    already (the same file imported again) is not added twice. A ``DatabaseError`` naming
    the file for one that is not such results, or corrupt."""
    path = Path(results_path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DatabaseError(f"{path}: cannot be read as tuning results: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != RESULTS_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise DatabaseError(f"{path}: not {RESULTS_FORMAT} results of a tuning pack's "
                            f"runner (format {found!r})")
    try:
        manifest = doc["manifest"]
        if manifest.get("format") != PACK_FORMAT:
            raise ValueError(f"the manifest's format is {manifest.get('format')!r}")
        records = _records(manifest, doc["results"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise DatabaseError(f"{path}: corrupt tuning results ({type(err).__name__}: {err})"
                            ) from err
    held = {r.to_json() for r in database.records}
    added = [r for r in records if r.to_json() not in held]
    for record in added:
        database.add(record)
    return len(added)
