"""AB/BA ordering of (window, load) replays, blocks for one-server-at-a-time runs, prompt seeds."""

from __future__ import annotations

from collections import Counter

import pytest

from experiments.schedule import build_schedule, replay_seed, segments, split_blocks

LABELS = ("stock", "patched")


def test_resident_schedule_covers_every_pair_once_with_both_arms() -> None:
    steps = build_schedule(4, (0.5, 1.0, 2.0), LABELS)
    assert [(s.window, s.load) for s in steps] == [(w, x) for w in range(4) for x in (0.5, 1.0, 2.0)]
    assert all(sorted(s.order) == sorted(LABELS) for s in steps)
    assert [s.load_index for s in steps[:3]] == [0, 1, 2]


def test_order_alternates_window_to_window_at_every_load() -> None:
    steps = build_schedule(4, (1.0, 2.0), LABELS)
    for load in (1.0, 2.0):
        orders = [s.order for s in steps if s.load == load]
        assert orders[0] != orders[1] and orders[1] != orders[2] and orders[2] != orders[3]
        assert Counter(orders) == {("stock", "patched"): 2, ("patched", "stock"): 2}
    assert steps[0].order == ("stock", "patched") and steps[1].order == ("patched", "stock")


def test_single_load_is_plain_ab_ba() -> None:
    orders = [s.order for s in build_schedule(3, (1.0,), ("stock-a", "stock-b"))]
    assert orders == [("stock-a", "stock-b"), ("stock-b", "stock-a"), ("stock-a", "stock-b")]


def test_split_blocks_is_contiguous_and_near_equal() -> None:
    assert split_blocks(5, 2) == [range(0, 3), range(3, 5)]
    assert split_blocks(4, 4) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    with pytest.raises(ValueError, match="blocks must be in"):
        split_blocks(2, 3)


def test_one_at_a_time_runs_blocks_ab_then_ba() -> None:
    steps = build_schedule(4, (1.0, 2.0), LABELS, one_at_a_time=True, blocks=2)
    assert [s.block for s in steps] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {s.order for s in steps if s.block == 0} == {("stock", "patched")}
    assert {s.order for s in steps if s.block == 1} == {("patched", "stock")}
    segs = segments(steps, one_at_a_time=True)
    assert [seg.arms for seg in segs] == [("stock",), ("patched",), ("patched",), ("stock",)]
    assert [{s.window for s in seg.steps} for seg in segs] == [{0, 1}, {0, 1}, {2, 3}, {2, 3}]


def test_resident_mode_is_one_segment_with_both_arms() -> None:
    steps = build_schedule(2, (1.0,), LABELS)
    segs = segments(steps, one_at_a_time=False)
    assert len(segs) == 1 and set(segs[0].arms) == set(LABELS) and list(segs[0].steps) == steps


def test_step_json_records_order_and_done() -> None:
    step = build_schedule(1, (2.0,), LABELS)[0]
    step.done.append("stock")
    assert step.to_json() == {"window": 0, "load": 2.0, "order": ["stock", "patched"], "done": ["stock"]}


def test_replay_seeds_are_distinct_per_pair_and_warmup() -> None:
    seeds = {replay_seed(7, w, j) for w in range(-1, 50) for j in range(5)}
    assert len(seeds) == 51 * 5
    assert all(s >= 0 for s in seeds)
    assert replay_seed(0, 3, 1) != replay_seed(1, 3, 1)
