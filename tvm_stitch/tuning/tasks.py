"""The tuning tasks of a model: its stitched groups as the stitch pass decides them, keyed by
workload (the structural hash of the group's fused PrimFunc) and target."""

from __future__ import annotations

import json
from collections.abc import Iterator

import tvm_ffi
from tvm.ir import IRModule
from tvm.target import Target

from .. import pipeline
from ..schedule.decisions import Decided
from ..schedule.decisions.choosing import Chooser, Task, choosing
from ..target import parse_target


def workload_key(task: Task) -> str:
    """The key of ``task``'s workload: the structural hash of its fused PrimFunc and its row
    count. Identical layers share one key, so they are tuned once and stitched alike."""
    return f"{tvm_ffi.structural_hash(task.func):016x}-{task.rows}"


def target_key(target: Target | None) -> str:
    """The key of a target in a database: its kind, arch and the limits a plan depends on.
    Records for one target are never applied to another."""
    if target is None:
        return "none"
    attrs = target.attrs
    fields = {"kind": target.kind.name, "arch": str(attrs.get("arch", "")),
              "max_shared_memory_per_block": int(attrs.get("max_shared_memory_per_block", 0)),
              "max_num_threads": int(attrs.get("max_num_threads", 0))}
    return json.dumps(fields, sort_keys=True)


class _Recorder(Chooser):
    """Offers nothing; notes every task the stitch pass decides."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def preferred(self, task: Task) -> Iterator[Decided]:
        """Record ``task``; the rules decide."""
        self.tasks[workload_key(task)] = task
        return iter(())


def extract_tasks(mod: IRModule, target: str | Target) -> list[Task]:
    """The tasks of ``mod`` for ``target``: one per distinct workload that the stitch pass
    decides (identical layers once), in the order the pass meets them."""
    recorder = _Recorder()
    with choosing(recorder):
        pipeline.lower(mod, parse_target(target), flow="stitch")
    return list(recorder.tasks.values())
