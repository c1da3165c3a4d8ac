"""Choosers record and replay the same decisions, and the shrinker minimises choice sequences."""

from __future__ import annotations

from tvm_stitch.testing.choices import RandomChooser, ReplayChooser, shrink


def _decisions(chooser) -> list:
    return [chooser.integer(3, 9), chooser.choice("abcd"), chooser.boolean(0.3),
            chooser.weighted([1.0, 5.0, 1.0]), chooser.subset(list(range(6)), min_size=2)]


def test_replay_reproduces_a_random_run() -> None:
    first = RandomChooser(7)
    made = _decisions(first)
    replay = ReplayChooser(first.record)
    assert _decisions(replay) == made
    assert replay.record == first.record


def test_replay_clamps_and_defaults_to_the_simplest_option() -> None:
    replay = ReplayChooser([50])
    assert replay.integer(0, 4) == 4  # clamped into range
    assert replay.integer(2, 9) == 2  # exhausted: the lowest value
    assert replay.choice("xyz") == "x"
    assert replay.boolean(0.99) is False


def test_subset_respects_its_minimum() -> None:
    for seed in range(30):
        assert len(RandomChooser(seed).subset([0, 1, 2], min_size=2)) >= 2
    assert ReplayChooser([]).subset([4, 5, 6], min_size=1) == [4]


def test_shrink_finds_a_small_failing_sequence() -> None:
    calls = []

    def fails(offsets: list[int]) -> bool:
        calls.append(offsets)
        return sum(offsets) >= 10 and 7 in offsets

    best = shrink([3, 9, 7, 4, 0, 12, 7, 1], fails, budget=500)
    assert fails(best)
    assert len(best) == 2 and 7 in best and sum(best) <= 14  # from 8 choices summing to 43
    assert len(calls) <= 501


def test_shrink_stops_at_its_budget() -> None:
    calls = []
    shrink(list(range(1, 40)), lambda o: calls.append(o) or True, budget=5)
    assert len(calls) == 5
