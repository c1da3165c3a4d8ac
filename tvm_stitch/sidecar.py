"""The sidecar of a deployed library: what feeding and reading it takes, and how it was built.

``tvm-stitch compile MODEL.onnx -o model.so`` writes the library and ``model.json`` beside it
(``sidecar_path``): the inputs in the order ``main`` takes them and the outputs in the order it
returns them (ONNX names, shapes with symbolic dimensions by name, dtypes), the symbolic
dimensions with the size each was compiled for as a hint (or null), the compile flow, the
target in TVM's JSON form, the stitch plan, the tuning database used, and the versions of
tvm-stitch, TVM and tvm-ffi. ``Sidecar.arguments`` checks arrays against it before a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SIDECAR_FORMAT = 1
"""Version of the sidecar's layout; a reader refuses any other."""

LIBRARY_SUFFIX = ".so"


class SidecarError(ValueError):
    """A sidecar that is missing or malformed, or arrays that do not match it."""


def sidecar_path(library: str | os.PathLike) -> Path:
    """The sidecar of ``library``: ``model.so`` -> ``model.json``. Raises SidecarError unless
    the library's name ends in ``.so`` (TVM links it as a shared library)."""
    path = Path(library)
    if path.suffix != LIBRARY_SUFFIX:
        raise SidecarError(f"library {path}: the name must end in {LIBRARY_SUFFIX} (its "
                           "sidecar is the same name ending in .json)")
    return path.with_suffix(".json")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor ``main`` takes or returns: its ONNX name, its shape (a dimension is its size,
    or the name of a symbolic dimension; an output may have an expression of them), its dtype."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        """A TensorSpec from its plain-data form (``dataclasses.asdict``)."""
        return cls(str(data["name"]), tuple(data["shape"]), str(data["dtype"]))


@dataclass(frozen=True)
class Sidecar:
    """What ``tvm-stitch compile`` records beside a library (see the module docstring).

    ``dims`` maps each symbolic dimension of the inputs to its size hint, None without one.
    ``plan`` is the stitch plan (``StitchPlan.to_dict``), None for the baseline flow.
    ``dim_max`` maps symbolic dimensions to the upper bounds declared for them (``--dim-max``
    or the model's metadata): the library serves larger sizes too, re-reading rows it would
    stage within the bounds.
    """

    model: str
    flow: str
    target: dict[str, Any]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dims: dict[str, int | None]
    plan: dict[str, Any] | None
    database: str | None
    versions: dict[str, str]
    dim_max: dict[str, int] = field(default_factory=dict)
    cost_model: str | None = None  # the model that picked the groups the database lacks

    @property
    def arch(self) -> str | None:
        """The CUDA architecture the library was compiled for (``sm_90``), or None."""
        arch = self.target.get("arch")
        return None if arch is None else str(arch)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, JSON-ready."""
        return {"format": SIDECAR_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sidecar:
        """Inverse of ``to_dict``; raises SidecarError on another format or missing fields."""
        if data.get("format") != SIDECAR_FORMAT:
            raise SidecarError(f"sidecar format {data.get('format')!r}; this tvm-stitch reads "
                               f"format {SIDECAR_FORMAT}")
        try:
            return cls(
                model=str(data["model"]),
                flow=str(data["flow"]),
                target=dict(data["target"]),
                inputs=tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
                outputs=tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
                dims=dict(data["dims"]),
                plan=data["plan"],
                database=data["database"],
                versions=dict(data["versions"]),
                dim_max=dict(data.get("dim_max", {})),
                cost_model=data.get("cost_model"),
            )
        except (KeyError, TypeError) as err:
            raise SidecarError(f"malformed sidecar: {type(err).__name__} {err}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the sidecar as indented JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Sidecar:
        """Read the sidecar at ``path``; SidecarError naming the file when it is missing or
        malformed."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SidecarError(f"no sidecar {path}: tvm-stitch compile writes one beside the "
                               "library") from None
        except (OSError, json.JSONDecodeError) as err:
            raise SidecarError(f"cannot read sidecar {path}: {err}") from None
        if not isinstance(data, dict):
            raise SidecarError(f"sidecar {path}: not a JSON object")
        try:
            return cls.from_dict(data)
        except SidecarError as err:
            raise SidecarError(f"sidecar {path}: {err}") from None

    def arguments(self, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The arrays for ``main``, in its order, from ``arrays`` by input name.

        Raises SidecarError naming the input when one is missing, one is extra, or a dtype, a
        rank or a static dimension differs, or a symbolic dimension has two sizes."""
        names = [spec.name for spec in self.inputs]
        missing = [n for n in names if n not in arrays]
        extra = [n for n in arrays if n not in names]
        if missing or extra:
            raise SidecarError(
                f"the inputs are {', '.join(names)}; "
                + "; ".join(f"{what} {', '.join(which)}" for what, which in
                            (("missing", missing), ("not an input", extra)) if which))
        sizes: dict[str, tuple[int, str]] = {}
        out = []
        for spec in self.inputs:
            array = np.asarray(arrays[spec.name])
            if str(array.dtype) != spec.dtype:
                raise SidecarError(f"input {spec.name}: dtype {array.dtype}, expected "
                                   f"{spec.dtype}")
            if array.ndim != len(spec.shape):
                raise SidecarError(f"input {spec.name}: shape {array.shape}, expected rank "
                                   f"{len(spec.shape)} {_shape_text(spec.shape)}")
            for want, got in zip(spec.shape, array.shape, strict=True):
                if isinstance(want, int) and want != got:
                    raise SidecarError(f"input {spec.name}: shape {array.shape}, expected "
                                       f"{_shape_text(spec.shape)}")
                if isinstance(want, str) and want in self.dims:
                    size, first = sizes.setdefault(want, (got, spec.name))
                    if size != got:
                        raise SidecarError(f"symbolic dimension {want} is {size} in input "
                                           f"{first} and {got} in input {spec.name}")
            out.append(np.ascontiguousarray(array))
        return out


def _shape_text(shape: tuple[int | str, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
