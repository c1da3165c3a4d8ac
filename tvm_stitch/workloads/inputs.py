"""Seeded random inputs for a model's graph inputs, with per-input value ranges.

A workload that needs something other than standard-normal floats (token ids below the vocabulary
size, positive variances, padding masks) records a :class:`Dist` for that input in the model's
``metadata_props``, so the range travels with the ``ModelProto``, including one loaded from the
model cache, and :func:`inputs` needs nothing but the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import helper

METADATA_PREFIX = "tvm_stitch."
_INPUT_KEY = METADATA_PREFIX + "input."

DistKind = Literal["normal", "uniform", "integers", "prefix"]


@dataclass(frozen=True)
class Dist:
    """How to draw one input's values.

    - ``normal``: standard normal (``low``/``high`` unused).
    - ``uniform``: uniform in ``[low, high)``.
    - ``integers``: integers in ``[low, high)``.
    - ``prefix``: a padding mask along the last axis: ``high`` on a prefix of random length
      (at least 1, at most the axis length) of every row, ``low`` after it.
    """

    kind: DistKind = "normal"
    low: float = 0.0
    high: float = 1.0

    def sample(
        self, rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        """Draw an array of ``shape`` and ``dtype`` from this distribution."""
        if self.kind == "normal":
            values = rng.standard_normal(shape)
        elif self.kind == "uniform":
            values = rng.uniform(self.low, self.high, shape)
        elif self.kind == "integers":
            values = rng.integers(int(self.low), int(self.high), shape)
        elif self.kind == "prefix":
            if not shape or shape[-1] < 1:
                raise ValueError(f"a prefix mask needs a non-empty last axis, got shape {shape}")
            lengths = rng.integers(1, shape[-1] + 1, shape[:-1])
            inside = np.arange(shape[-1]) < lengths[..., None]
            values = np.where(inside, self.high, self.low)
        else:
            raise ValueError(f"unknown distribution kind {self.kind!r}")
        return np.asarray(values).astype(dtype)

    def encode(self) -> str:
        """The text form stored in model metadata, e.g. ``integers:0:30522``."""
        return f"{self.kind}:{self.low!r}:{self.high!r}"

    @classmethod
    def decode(cls, text: str) -> Dist:
        """Parse :meth:`encode`'s output."""
        kind, low, high = text.split(":")
        if kind not in ("normal", "uniform", "integers", "prefix"):
            raise ValueError(f"unknown distribution kind {kind!r} in {text!r}")
        return cls(kind, float(low), float(high))  # type: ignore[arg-type]


def normal() -> Dist:
    """Standard normal values (the default for float inputs)."""
    return Dist("normal")


def uniform(low: float, high: float) -> Dist:
    """Uniform values in ``[low, high)``, e.g. positive scales."""
    return Dist("uniform", low, high)


def integers(low: int, high: int) -> Dist:
    """Integers in ``[low, high)``, e.g. token ids or class targets."""
    return Dist("integers", low, high)


def prefix(outside: float, inside: float) -> Dist:
    """A padding mask: ``inside`` on a random-length non-empty prefix of the last axis."""
    return Dist("prefix", outside, inside)


def set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    """Set ``metadata_props[key] = value`` in place, replacing an existing entry."""
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def get_metadata(model: onnx.ModelProto, key: str) -> str | None:
    """The value of ``metadata_props[key]``, or None."""
    return next((p.value for p in model.metadata_props if p.key == key), None)


def set_input_dists(model: onnx.ModelProto, dists: dict[str, Dist]) -> None:
    """Record value ranges for the named graph inputs in the model's metadata."""
    declared = {i.name for i in model.graph.input}
    for name, dist in dists.items():
        if name not in declared:
            raise ValueError(f"model has no graph input {name!r} (inputs: {sorted(declared)})")
        set_metadata(model, _INPUT_KEY + name, dist.encode())


def input_dists(model: onnx.ModelProto) -> dict[str, Dist]:
    """The value ranges recorded in the model's metadata, by input name."""
    return {
        p.key[len(_INPUT_KEY) :]: Dist.decode(p.value)
        for p in model.metadata_props
        if p.key.startswith(_INPUT_KEY)
    }


def _default_dist(dtype: np.dtype) -> Dist:
    if np.issubdtype(dtype, np.floating):
        return normal()
    # Without a declared range the only index valid for every axis is 0; 0/1 keeps masks and
    # booleans meaningful.
    return integers(0, 2)


def input_signature(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and numpy dtype of every graph input that is not an initializer.

    Raises ValueError on a symbolic or unknown dimension: workloads use static shapes only.
    """
    initializers = {t.name for t in model.graph.initializer}
    signature = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        if not tensor.HasField("shape") or any(d < 0 for d in dims):
            raise ValueError(f"input {value.name!r} has a non-static shape; give static shapes")
        signature[value.name] = (dims, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    return signature


def inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random values for every graph input of ``model``, from its declared types.

    Floats are standard normal and integers 0 or 1 unless the model's metadata gives the input a
    :class:`Dist` (see :func:`set_input_dists`). The same model and seed give the same arrays.
    """
    rng = np.random.default_rng(seed)
    dists = input_dists(model)
    return {
        name: dists.get(name, _default_dist(dtype)).sample(rng, shape, dtype)
        for name, (shape, dtype) in input_signature(model).items()
    }
