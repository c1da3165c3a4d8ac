"""Decisions remembered within one stitch pass.

A model's identical layers give identical fused PrimFuncs (FuseTIR names their parameters,
buffers and blocks alike), and every round of the stitch pass decides again the groups that
stitched in the one before. Deciding the same function again gives the same decisions, so
within :func:`remembering` ``decide`` gives them at once: a group whose PrimFunc prints the
same, whose plan entry is the same but for its op and value names, with the same rows,
target and choices, gets the decisions of the first, under its own identity.

Only successes are remembered: a failure's reason may name the group.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import fields, is_dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from tvm import tirx
from tvm.target import Target

from ...plan import Choices, Group

if TYPE_CHECKING:
    from . import Decided

_IDENTITY = ("id", "function", "ops", "inputs", "outputs", "dominants", "edges")
"""The fields of a group that name it and its graph; the others are its decisions."""

_MEMO: ContextVar[dict[Hashable, Decided] | None] = ContextVar("tvm_stitch_decided",
                                                                default=None)


@contextmanager
def remembering() -> Iterator[None]:
    """Within the block, ``decide`` remembers what it decides and gives it again for the
    same function and group (see the module)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def key_of(func: tirx.PrimFunc, group: Group, rows: int | None, target: Target | None,
           choices: Choices) -> Hashable | None:
    """What ``decide``'s outcome depends on, with the group's op and value names replaced by
    their positions; None outside :func:`remembering`."""
    if _MEMO.get() is None:
        return None
    names = {n: i for i, n in enumerate(dict.fromkeys(group.ops + group.inputs +
                                                      group.outputs))}
    return (func.script(), rows, None if target is None else str(target), choices,
            _unnamed(replace(group, id=0, function=""), names))


def recalled(key: Hashable | None, group: Group) -> Decided | None:
    """The decisions remembered under ``key``, given ``group``'s identity; None if none."""
    memo = _MEMO.get()
    if key is None or memo is None or key not in memo:
        return None
    first = memo[key]
    return replace(first, group=replace(first.group, **{f: getattr(group, f)
                                                        for f in _IDENTITY}))


def remember(key: Hashable | None, decided: Decided) -> Decided:
    """``decided``, remembered under ``key`` (outside :func:`remembering`, not)."""
    memo = _MEMO.get()
    if key is not None and memo is not None:
        memo[key] = decided
    return decided


def _unnamed(value: object, names: dict[str, int]) -> Hashable:
    """``value`` (a plan dataclass, a tuple, a name...) with the names of ``names`` replaced
    by their positions."""
    if isinstance(value, str) and not isinstance(value, Enum):
        return ("name", names[value]) if value in names else value
    if isinstance(value, tuple):
        return tuple(_unnamed(v, names) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,
                *(_unnamed(getattr(value, f.name), names) for f in fields(value)))
    return value  # type: ignore[return-value]
