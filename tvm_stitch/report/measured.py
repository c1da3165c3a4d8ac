"""Measured times for a report: one workload's entry of ``scripts/gpu_check.py``'s results.

The results JSON (``OUT/results.json``, ``docs/results/*.json``) holds per workload the
median time of one call of each flow (``measured_us``) and a status per flow; it holds no
per-kernel times, so the report shows measured times per workload only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..workloads.inputs import get_metadata
from ..workloads.registry import SIZE_KEY, WORKLOAD_KEY


class MeasuredError(ValueError):
    """A results file that is not ``gpu_check.py``'s results JSON."""


@dataclass(frozen=True)
class Measured:
    """The measured times of one workload, or why the results file has none for the model."""

    source: str
    machine: str
    date: str
    workload: str
    times_us: dict[str, float]  # flow (or torch column) -> median microseconds per call
    statuses: dict[str, str]
    missing: str = ""  # why no times: no entry for the model, or one of another size


def model_key(model: onnx.ModelProto, path: str | os.PathLike | None) -> tuple[str, str | None]:
    """The workload name and size to look the model up by: the zoo's metadata tags, else the
    file's stem and no size."""
    name = get_metadata(model, WORKLOAD_KEY)
    if name is not None:
        return name, get_metadata(model, SIZE_KEY)
    return (Path(path).stem if path is not None else model.graph.name), None


def load_measured(path: str | os.PathLike, workload: str, size: str | None) -> Measured:
    """The entry of ``workload`` (at ``size`` when known) in the results JSON at ``path``.

    MeasuredError when the file is not such results JSON; an entry that is missing, or only
    there at another size, gives no times and says so in ``missing``."""
    try:
        doc = json.loads(Path(path).read_text())
        entries = doc["workloads"]
        machine = str(doc.get("machine", {}).get("hostname", "?"))
        date = str(doc.get("date", "?"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise MeasuredError(f"{path}: not a results JSON of scripts/gpu_check.py ({err})") from err
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e
                                                for e in entries):
        raise MeasuredError(f"{path}: 'workloads' is not a list of named entries")
    named = [e for e in entries if e["name"] == workload]
    matching = [e for e in named if size is None or e.get("size") == size]
    common = (str(path), machine, date, workload)
    if not matching:
        why = (f"no entry for {workload!r} in {path}" if not named else
               f"{path} measured {workload!r} at size {named[0].get('size')!r}, "
               f"not at {size!r}")
        return Measured(*common, {}, {}, why)
    entry = matching[0]
    times = {str(k): float(v) for k, v in (entry.get("measured_us") or {}).items()
             if isinstance(v, int | float)}
    statuses = {str(k): str(v) for k, v in (entry.get("status") or {}).items()}
    return Measured(*common, times, statuses,
                    "" if times else f"the entry of {workload!r} has no measured time")


__all__ = ["Measured", "MeasuredError", "load_measured", "model_key"]
