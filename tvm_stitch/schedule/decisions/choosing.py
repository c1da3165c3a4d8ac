"""Who chooses a group's kernel: the rules alone, or a chooser (a tuning database, a cost
model, the tuner's task recorder) in force for a block of code.

The stitch pass asks ``decisions_for`` for a group's kernels in order of preference and
keeps the first that is no worse than TVM's fusion; the rules' own kernel always comes last,
so a chooser can only add options, never take the rules' away.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tvm import tirx
from tvm.target import Target

from ...plan import Choices, Group
from ..rows import Unstitchable
from . import Decided, decide

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One group to decide: its fused PrimFunc, its plan entry, its row count (None for an
    element-wise group) and the target."""

    func: tirx.PrimFunc
    group: Group
    rows: int | None
    target: Target | None


class Chooser:
    """Kernels for a task in order of preference; this base offers none (the rules
    decide)."""

    def preferred(self, task: Task) -> Iterator[Decided]:
        """The kernels this chooser prefers for ``task``, best first; each raises no
        Unstitchable (a chooser skips what does not build)."""
        return iter(())


class FixedChoices(Chooser):
    """Prefers, for every task, the kernel of the same fixed ``choices`` (``plan.Choices``);
    a task they cannot apply to is left to the rules."""

    def __init__(self, choices: Choices) -> None:
        self.choices = choices

    def preferred(self, task: Task) -> Iterator[Decided]:
        """``task`` decided with the fixed choices, if they apply to it."""
        try:
            yield decide(task.func, task.group, task.rows, task.target, self.choices)
        except Unstitchable as err:
            logger.debug("choices %s do not apply to %s: %s", self.choices, task.group.ops, err)


_CHOOSER: ContextVar[Chooser | None] = ContextVar("tvm_stitch_chooser", default=None)


@contextmanager
def choosing(chooser: Chooser) -> Iterator[Chooser]:
    """Within the block, the stitch pass asks ``chooser`` first."""
    token = _CHOOSER.set(chooser)
    try:
        yield chooser
    finally:
        _CHOOSER.reset(token)


def current_chooser() -> Chooser | None:
    """The chooser in force, or None."""
    return _CHOOSER.get()


def decisions_for(task: Task) -> Iterator[Decided]:
    """The kernels for ``task``, best first: the chooser's in force, then the rules'; raises
    Unstitchable when the rules' does not build either."""
    chooser = current_chooser()
    if chooser is not None:
        yield from chooser.preferred(task)
    yield decide(task.func, task.group, task.rows, task.target)


