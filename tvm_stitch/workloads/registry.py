"""The registry of workloads: named ONNX models at a ``ci`` and a ``real`` size."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx

from .inputs import METADATA_PREFIX, inputs, set_metadata

Kind = Literal["micro", "model"]
KINDS: tuple[Kind, ...] = ("micro", "model")
SIZES = ("ci", "real")

WORKLOAD_KEY = METADATA_PREFIX + "workload"
SIZE_KEY = METADATA_PREFIX + "size"


@dataclass(frozen=True)
class Workload:
    """One workload of the zoo.

    ``sizes`` describes each size for people (``{"ci": "64x256", "real": "8192x768"}``); for
    micro patterns it is the shape of the first graph input. ``build`` makes the model for a size.
    """

    name: str
    kind: Kind
    description: str
    sizes: dict[str, str]
    build: Callable[[str], onnx.ModelProto] = field(repr=False, compare=False)

    def model(self, size: str = "ci") -> onnx.ModelProto:
        """The ONNX model at ``size``, tagged with the workload's name and size in its metadata."""
        if size not in self.sizes:
            raise ValueError(f"{self.name} has no size {size!r}; sizes: {', '.join(self.sizes)}")
        model = self.build(size)
        set_metadata(model, WORKLOAD_KEY, self.name)
        set_metadata(model, SIZE_KEY, size)
        return model

    def inputs(self, size: str = "ci", seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded random inputs for :meth:`model` at ``size`` (see :func:`inputs`)."""
        return inputs(self.model(size), seed)


_REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    """Add ``workload`` to the registry; a name may be registered once."""
    if workload.name in _REGISTRY:
        raise ValueError(f"workload {workload.name!r} is already registered")
    if workload.kind not in KINDS:
        raise ValueError(f"workload kind must be one of {KINDS}, got {workload.kind!r}")
    if tuple(workload.sizes) != SIZES:
        raise ValueError(f"workload {workload.name!r} must declare sizes {SIZES}")
    _REGISTRY[workload.name] = workload
    return workload


def get(name: str) -> Workload:
    """The workload called ``name``; KeyError naming the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(_REGISTRY)}") from None


def all_workloads() -> list[Workload]:
    """Every registered workload, micro patterns first, in registration order."""
    return list(_REGISTRY.values())


def names(kind: Kind | None = None) -> list[str]:
    """Names of the registered workloads, optionally only those of ``kind``."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}")
    return [w.name for w in _REGISTRY.values() if kind is None or w.kind == kind]
