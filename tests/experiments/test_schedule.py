"""Randomised balanced arm order of (window, load) replays, blocks for one-server-at-a-time runs,
resident sets (--resident), the burn-in cell, prompt seeds."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import pytest

from experiments.core.schedule import (
    build_schedule,
    burnin_seed,
    burnin_step,
    cover,
    knee_seed,
    replay_seed,
    segments,
    split_blocks,
)
from loadgen.prompts import prompt_token_ids
from traces.trace import TraceRequest

LABELS = ("stock", "patched")


def test_resident_schedule_covers_every_pair_once_with_both_arms() -> None:
    steps = build_schedule(4, (0.5, 1.0, 2.0), LABELS)
    assert [(s.window, s.load) for s in steps] == [(w, x) for w in range(4) for x in (0.5, 1.0, 2.0)]
    assert all(sorted(s.order) == sorted(LABELS) for s in steps)
    assert [s.load_index for s in steps[:3]] == [0, 1, 2]


def test_order_is_balanced_at_every_load_and_seeded() -> None:
    steps = build_schedule(8, (1.0, 2.0), LABELS, seed=3)
    for load in (1.0, 2.0):
        orders = [s.order for s in steps if s.load == load]
        assert Counter(orders) == {("stock", "patched"): 4, ("patched", "stock"): 4}
    assert [s.order for s in steps] == [s.order for s in build_schedule(8, (1.0, 2.0), LABELS, seed=3)]
    others = {tuple(s.order for s in build_schedule(8, (1.0, 2.0), LABELS, seed=k)) for k in range(6)}
    assert len(others) > 1  # randomised: not one fixed AB/BA pattern


def test_three_arms_take_every_position_equally_often() -> None:
    labels = ("stock", "patched", "stock-b")
    steps = build_schedule(6, (1.0,), labels, seed=1)
    assert len({s.order for s in steps}) == 6  # one cycle through every permutation
    for pos in range(3):
        assert Counter(s.order[pos] for s in steps) == {lab: 2 for lab in labels}
    with pytest.raises(ValueError, match="distinct arm labels"):
        build_schedule(2, (1.0,), ("stock", "stock"))


def test_burnin_cell_is_window_zero_at_the_highest_load_with_its_own_prompts() -> None:
    steps = build_schedule(4, (1.0, 8.0, 4.0), LABELS, seed=2)
    b = burnin_step(steps, (1.0, 8.0, 4.0), ("patched",))
    assert (b.window, b.load, b.load_index, b.order) == (0, 8.0, 1, ("patched",))
    both = burnin_step(steps, (1.0, 8.0, 4.0), LABELS)
    assert both.order == steps[1].order
    seeds = {replay_seed(5, w, j) for w in range(-1, 50) for j in range(5)}
    assert not seeds & {burnin_seed(5, n) for n in range(10)}


def test_split_blocks_is_contiguous_and_near_equal() -> None:
    assert split_blocks(5, 2) == [range(3), range(3, 5)]
    assert split_blocks(4, 4) == [range(1), range(1, 2), range(2, 3), range(3, 4)]
    with pytest.raises(ValueError, match="blocks must be in"):
        split_blocks(2, 3)


def test_one_at_a_time_blocks_take_both_orders() -> None:
    for seed in range(4):
        steps = build_schedule(4, (1.0, 2.0), LABELS, one_at_a_time=True, blocks=2, seed=seed)
        assert [s.block for s in steps] == [0, 0, 0, 0, 1, 1, 1, 1]
        first, second = ({s.order for s in steps if s.block == b} for b in (0, 1))
        assert len(first) == len(second) == 1 and first | second == {LABELS, LABELS[::-1]}
        segs = segments(steps, one_at_a_time=True)
        order0, order1 = first.pop(), second.pop()
        assert [seg.arms for seg in segs] == [(order0[0],), (order0[1],), (order1[0],), (order1[1],)]
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


def test_knee_seeds_are_distinct_per_window_and_factor_and_from_the_other_phases() -> None:
    knee = {knee_seed(7, j, w) for j in range(8) for w in range(200)}
    assert len(knee) == 8 * 200
    others = {replay_seed(7, w, j) for w in range(-1, 200) for j in range(8)}
    others |= {burnin_seed(7, n) for n in range(10)}
    assert not knee & others


def test_knee_windows_pooled_at_one_factor_share_no_prompt_prefix() -> None:
    # request i of every window drew from (seed, i): with one seed per factor, window 16's first
    # prompt began with window 12's, and the prefix cache served the repeats (the knee came out 3x high)
    req = TraceRequest(0.0, 64, 8)
    first = {tuple(prompt_token_ids(0, req, seed=knee_seed(3, 2, w))[:16]) for w in (12, 16, 18)}
    assert len(first) == 3


FOUR = ("stock", "patched", "planted:3us", "stock-b")
NEEDED = [("stock", "patched"), ("patched", "planted:3us"), ("stock", "stock-b")]  # A/B, twin, A/A


def test_sets_of_two_cover_every_comparison_each_arm_once_per_instance() -> None:
    sets = cover(FOUR, NEEDED, 2)
    assert sets == (("stock", "stock-b"), ("stock", "patched"), ("patched", "planted:3us"))
    for label in FOUR:  # each label's sets follow one another: its server starts once per instance
        where = [i for i, s in enumerate(sets) if label in s]
        assert where == list(range(where[0], where[-1] + 1))
    three = cover(FOUR, NEEDED, 3)  # fewer sets, and every pair but one resident together
    assert len(three) == 2 and all(len(s) == 3 for s in three) and "stock" in three[0]
    assert {frozenset(p) for s in three for p in combinations(s, 2)} >= {frozenset(p) for p in NEEDED}
    assert cover(FOUR, NEEDED, 4) == (FOUR,) and cover(FOUR, NEEDED, 9) == (FOUR,)


def test_sets_that_cannot_keep_each_arm_s_turns_together_are_refused() -> None:
    every = list(combinations("abc", 2))  # every pair in sets of two: the first and last share a label
    with pytest.raises(ValueError, match="^no order of resident sets of at most 2 servers holds a and b, "
                                         "a and c, b and c together"):
        cover("abc", every, 2)
    assert cover("abc", every, 3) == (("a", "b", "c"),)
    with pytest.raises(ValueError, match="holds 2 or more servers, got 1"):
        cover(FOUR, NEEDED, 1)


def test_sets_split_every_instance_and_order_only_their_own_arms() -> None:
    sets = cover(FOUR, NEEDED, 2)
    steps = build_schedule(12, (1.0, 4.0), FOUR, sets=sets, instances=2, seed=5)
    assert [s.resident_set for s in steps if s.load == 1.0] == [0, 0, 1, 1, 2, 2] * 2
    assert all(sorted(s.order) == sorted(sets[s.resident_set]) for s in steps)
    for k, s in enumerate(sets):  # both orders of a set's two arms, equally often at every load
        for load in (1.0, 4.0):
            assert Counter(st.order for st in steps if st.resident_set == k and st.load == load) == {
                s: 2, s[::-1]: 2}
    assert steps[0].to_json()["set"] == 0 and "set" not in build_schedule(2, (1.0,), LABELS)[0].to_json()
    segs = segments(steps, one_at_a_time=False)
    assert [set(seg.arms) for seg in segs] == [set(s) for s in sets] * 2
    assert [sorted({st.window for st in seg.steps}) for seg in segs] == [[0, 1], [2, 3], [4, 5], [6, 7],
                                                                          [8, 9], [10, 11]]
    later = burnin_step(steps, (1.0, 4.0), ("planted:3us",))  # a later set's fresh server: its first cell
    assert (later.window, later.load, later.order) == (4, 4.0, ("planted:3us",))
