"""Sources of random choices for the graph generator, so one generator serves three drivers.

The generator asks a :class:`Chooser` for every decision it makes. A choice is an integer in
``[lo, hi]``; by convention ``lo`` is the *simplest* option (fewest nodes, smallest shape,
float32), so that moving any choice towards ``lo`` simplifies the graph.

- :class:`RandomChooser` draws from a seeded ``random.Random`` (the fuzz script: plain loops,
  reproducible per graph) and records the choices it made.
- :class:`ReplayChooser` replays recorded choices (clamped into range, ``lo`` once they run
  out): the basis of :func:`shrink`, which minimises a failing graph without Hypothesis.
- :class:`HypothesisChooser` draws through Hypothesis (``st.composite``), so pytest's
  ``@given`` explores and shrinks with Hypothesis' own engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class Chooser:
    """A source of integer choices; subclasses implement :meth:`integer`."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``."""
        raise NotImplementedError

    def weighted(self, weights: Sequence[float]) -> int:
        """An index into ``weights``, drawn in proportion to them where the driver is random.
        Replay and Hypothesis treat it as a plain index (0 is simplest)."""
        return self.integer(0, len(weights) - 1)

    def choice(self, options: Sequence[T]) -> T:
        """One of ``options`` (the first is the simplest)."""
        return options[self.integer(0, len(options) - 1)]

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability ``p`` under a random driver; False is the simpler answer."""
        return self.weighted([1.0 - p, p]) == 1

    def subset(self, items: Sequence[T], min_size: int = 0) -> list[T]:
        """A sub-list of ``items`` in their order, with at least ``min_size`` of them."""
        chosen = [x for x in items if self.boolean()]
        missing = [x for x in items if x not in chosen]
        while len(chosen) < min_size and missing:
            chosen.append(missing.pop(self.integer(0, len(missing) - 1)))
        return [x for x in items if x in chosen]


class RandomChooser(Chooser):
    """Choices from ``random.Random(seed)``; ``record`` holds each one as its offset from lo."""

    def __init__(self, seed: int | str) -> None:
        self.rng = random.Random(seed)
        self.record: list[int] = []

    def integer(self, lo: int, hi: int) -> int:
        """A uniform integer in ``[lo, hi]``."""
        value = self.rng.randint(lo, hi)
        self.record.append(value - lo)
        return value

    def weighted(self, weights: Sequence[float]) -> int:
        """An index drawn in proportion to ``weights``."""
        index = self.rng.choices(range(len(weights)), weights=weights)[0]
        self.record.append(index)
        return index


class ReplayChooser(Chooser):
    """Replays offsets recorded by another chooser; ``record`` holds the offsets it used."""

    def __init__(self, offsets: Sequence[int]) -> None:
        self.offsets = list(offsets)
        self.record: list[int] = []

    def integer(self, lo: int, hi: int) -> int:
        """The next recorded offset above ``lo``, clamped to ``hi``; ``lo`` when exhausted."""
        i = len(self.record)
        offset = min(self.offsets[i], hi - lo) if i < len(self.offsets) else 0
        self.record.append(offset)
        return lo + offset


class HypothesisChooser(Chooser):
    """Choices drawn through Hypothesis inside an ``st.composite`` strategy."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        from hypothesis import strategies as st

        self._draw = draw
        self._st = st

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``; Hypothesis shrinks it towards ``lo``."""
        return self._draw(self._st.integers(lo, hi))


def shrink(offsets: Sequence[int], fails: Callable[[list[int]], bool],
           budget: int = 200) -> list[int]:
    """A smaller choice sequence on which ``fails`` still holds, found greedily.

    ``fails(candidate)`` replays a candidate and says whether it still shows the failure. Each
    round tries, in order: dropping the tail, deleting blocks of choices (large blocks first),
    and lowering each choice (to 0, by halving, by one). At most ``budget`` calls of ``fails``.
    """
    best = _canonical(offsets)
    calls = 0
    tried = {tuple(best)}

    def attempt(candidate: list[int]) -> bool:
        nonlocal best, calls
        candidate = _canonical(candidate)
        if calls >= budget or tuple(candidate) in tried:
            return False
        tried.add(tuple(candidate))
        calls += 1
        if fails(candidate):
            best = candidate
            return True
        return False

    improved = True
    while improved and calls < budget:
        improved = False
        for cut in (len(best) // 2, 3 * len(best) // 4):
            improved |= attempt(best[:cut])
        size = max(1, len(best) // 4)
        while size >= 1:
            i = 0
            while i + size <= len(best):
                if not attempt(best[:i] + best[i + size:]):
                    i += size
                else:
                    improved = True
            size //= 2
        for i in range(len(best)):
            if best[i] == 0:
                continue
            if attempt(best[:i] + [0] + best[i + 1:]):
                improved = True
                continue
            while best[i] > 1 and attempt(best[:i] + [best[i] // 2] + best[i + 1:]):
                improved = True
            if best[i] > 1 and attempt(best[:i] + [best[i] - 1] + best[i + 1:]):
                improved = True
    return best


def _canonical(offsets: Sequence[int]) -> list[int]:
    """``offsets`` without trailing zeros: a replay treats missing choices as zeros."""
    out = list(offsets)
    while out and out[-1] == 0:
        out.pop()
    return out
