"""The knee search's choice of loads, and capacity per window with its paired comparison."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from experiments.core.runfile import Run
from experiments.core.slo import SLO
from experiments.stats import knee

INTERACTIVE, CHAT, RELAXED = SLO("interactive", 500, 30), SLO("chat", 2000, 100), SLO("relaxed", 6000, 175)


def test_knee_interpolates_where_attainment_falls_through_ninety_percent() -> None:
    k = knee.knee([(1.0, 1.0), (2.0, 0.98), (4.0, 0.94), (8.0, 0.74)])
    assert k["status"] == "interpolated" and k["load"] == pytest.approx(4.0 + 4.0 * 0.04 / 0.20)
    assert knee.knee([(1.0, 0.5), (2.0, 0.3)])["status"] == "below lowest"
    assert knee.knee([(1.0, 1.0), (2.0, 0.95)])["status"] == "above highest"


def test_the_search_pools_the_windows_at_quantiles_of_request_count() -> None:
    counts = [46, 88, 95, 90, 70, 12, 60, 75, 99, 30]
    # sorted 12 (w5) 30 (w9) 46 (w0) 60 (w6) 70 (w4) 75 (w7) 88 (w1) 90 (w3) 95 (w2) 99 (w8):
    # 0.1 0.3 0.5 0.7 0.9 of 9 are ranks 1, 3 (round(2.7)), 4 (round(4.5) is 4), 6, 8
    assert knee.SEARCH_QUANTILES == (0.1, 0.3, 0.5, 0.7, 0.9)
    assert knee.search_windows(counts) == [1, 2, 4, 6, 9]
    # the old quartiles: ranks 2 (round(2.25)), 4, 7 (round(6.75))
    assert knee.search_windows(counts, (0.25, 0.5, 0.75)) == [0, 3, 4]
    assert knee.search_windows([5, 9, 9, 1], (0.25, 0.5, 0.75)) == [0, 1]  # 1 5 9 9: ranks 1, 2, 2
    assert knee.search_windows([7]) == [0]
    with pytest.raises(ValueError, match="at least one window"):
        knee.search_windows([])


def test_loads_bracket_the_strictest_reachable_tier_plus_the_lowest_factor() -> None:
    knees = {"interactive": {"status": "below lowest", "load": None},
             "chat": {"status": "interpolated", "load": 6.0},
             "relaxed": {"status": "above highest", "load": 16.0}}
    got = knee.choose_loads(knees, [RELAXED, CHAT, INTERACTIVE], (1.0, 2.0, 4.0, 8.0, 16.0))
    assert got == {"tier": "chat", "knee": 6.0, "loads": (1.0, 4.8, 7.5), "reason": None}
    # a lowest factor next to the knee gives way to knee / 2 as the latency-sensitive load
    near = knee.choose_loads({"interactive": {"status": "interpolated", "load": 6.77}}, [INTERACTIVE],
                             (5.0, 8.0))
    assert near["loads"] == (3.4, 5.4, 8.5)
    none = knee.choose_loads({"chat": {"status": "above highest", "load": 16.0}}, [CHAT], (1.0, 16.0))
    assert none["loads"] is None and "1x, 16x" in none["reason"]


def _cells(att: dict[tuple[str, int], list[float]], loads=(4.0, 8.0)) -> pd.DataFrame:
    return pd.DataFrame([{"arm": arm, "window": w, "load": load, "slo": "chat", "attainment": a}
                         for (arm, w), values in att.items() for load, a in zip(loads, values)])


def test_capacity_per_window_and_its_paired_change() -> None:
    att = {}
    for w in range(4):  # stock crosses 90% at 6x (+-0.4x), the treatment 5% later
        stock_knee = 6.0 + 0.4 * (w % 2) - 0.2
        att[("stock", w)] = [0.9 + 0.1 * (stock_knee - 4.0) / 4.0, 0.9 - 0.1 * (8.0 - stock_knee) / 4.0]
        t_knee = stock_knee * 1.05
        att[("patched", w)] = [0.9 + 0.1 * (t_knee - 4.0) / 4.0, 0.9 - 0.1 * (8.0 - t_knee) / 4.0]
    c = knee.compare_capacity(_cells(att), "chat", "stock", "patched")
    assert c["arms"]["stock"]["mean"] == pytest.approx(6.0) and c["arms"]["stock"]["n"] == 4
    assert c["paired"]["mean"] == pytest.approx(5.0, abs=0.01)
    assert c["paired"]["t_ci95"][0] < 5.0 < c["paired"]["t_ci95"][1]
    never = knee.capacity_per_window(_cells({("stock", 0): [1.0, 0.95]}), "chat")
    assert never["capacity"].isna().all() and list(never["status"]) == ["above highest"]


MET = {"interactive": 0.95, "chat": 1.0}
ONE_BELOW = {"interactive": 0.89, "chat": 1.0}
ALL_BELOW = {"interactive": 0.5, "chat": 0.8}


def test_the_search_walks_its_list_then_grows_until_a_tier_fails_or_the_maximum() -> None:
    listed, top = (5.0, 8.0), 64.0
    assert knee.next_factor(5.0, MET, False, listed, top) == (8.0, None)
    assert knee.next_factor(5.0, ONE_BELOW, False, listed, top) == (8.0, None)  # the list goes on
    assert knee.next_factor(5.0, ALL_BELOW, False, listed, top) == (None, knee.KNEE)
    assert knee.next_factor(8.0, MET, False, listed, top) == (12.0, None)  # 1.5x past the list
    assert knee.next_factor(8.0, ONE_BELOW, False, listed, top) == (None, knee.KNEE)
    assert knee.next_factor(40.0, MET, False, listed, top) == (60.0, None)
    assert knee.next_factor(60.0, MET, False, listed, top) == (64.0, None)  # at most the maximum
    assert knee.next_factor(64.0, MET, False, listed, top) == (None, knee.MAXIMUM)
    assert knee.next_factor(64.0, ONE_BELOW, False, listed, top) == (None, knee.KNEE)
    # replays sent late: the client is the limit, whatever the tiers did
    assert knee.next_factor(5.0, MET, True, listed, top) == (None, knee.CLIENT)
    assert knee.next_factor(12.0, ALL_BELOW, True, listed, top) == (None, knee.CLIENT)
    assert knee.possible_factors(listed, top) == [5.0, 8.0, 12.0, 18.0, 27.0, 40.0, 60.0, 64.0]
    assert knee.possible_factors((1.0, 2.0), 2.0) == [1.0, 2.0]
    assert knee.highest_load(64.0) == 80.0  # a knee at 64x is measured up to 64 x 1.25
    assert knee.beyond_listed({"factors": [3, 4, 6, 9], "listed": [3, 4]}) == [6, 9]
    assert knee.beyond_listed({"factors": [3, 4]}) == []  # runs before the extension listed nothing


def test_one_stalled_replay_is_not_the_clients_limit_most_late_replays_are() -> None:
    # h200-llama8b-confirm2 at 5x in miniature: one replay of three stalled for about 170 ms
    stall = knee.lateness_figures([[0.5, 0.6, 169.0, 0.4], [0.7, 0.2], [0.6, 0.68]])
    assert stall["replay_p99_ms"] == pytest.approx([0.6 + 0.97 * 168.4, 0.2 + 0.99 * 0.5, 0.6 + 0.99 * 0.08])
    assert stall["median_replay_p99_ms"] == pytest.approx(0.695)
    assert stall["p99_ms"] == pytest.approx(0.7 + 0.93 * 168.3) and stall["max_ms"] == 169.0
    assert not knee.client_late(stall, 2.0)
    late = knee.lateness_figures([[3.0, 5.0], [2.5, 4.0], [0.1, 0.3]])
    assert late["median_replay_p99_ms"] == pytest.approx(2.5 + 0.99 * 1.5)
    assert knee.client_late(late, 2.0) and not knee.client_late(late, 4.0)
    assert not knee.client_late(knee.lateness_figures([[], []]), 2.0)  # nothing sent: no figure


def test_a_stop_at_the_client_names_the_factor_and_the_lateness() -> None:
    late = {"replay_p99_ms": [4.98, 3.985, 0.298], "median_replay_p99_ms": 3.985, "p99_ms": 4.9,
            "max_ms": 5.0}
    line = knee.stop_line({"reason": knee.CLIENT, "factor": 12.0}, late, 2.0)
    assert line.startswith("The client, not the server, is the limit: at 12x")
    assert "per replay 5.0, 4.0, 0.3 ms, median 4.0 ms, above the client's 2 ms target" in line
    assert "pooled p99 4.9 ms, max 5.0 ms" in line
    assert "fell below 90% there" in knee.stop_line({"reason": knee.KNEE, "factor": 8.0}, {}, 2.0)
    top = knee.stop_line({"reason": knee.MAXIMUM, "factor": 64.0}, {}, 2.0)
    assert "maximum factor, 64x (--knee-max)" in top


def _searched(attainment: list[bool], lateness: list[float], loads: list[float]) -> pd.DataFrame:
    from experiments.stats.goodput import met_column

    return pd.DataFrame({"phase": "knee", "load": loads, "window": [1, 2] * (len(loads) // 2),
                         "lateness_ms": lateness, met_column(CHAT): attainment})


def test_the_report_says_why_the_search_stopped_and_leaves_the_clients_factor_out_of_the_knee() -> None:
    from experiments.reporting.report_knee import knee_lines

    df = _searched([True, True, True, False], [0.3, 0.4, 6.0, 9.0], [4.0, 4.0, 8.0, 8.0])
    run = {"knee": {"arm": "stock", "windows": [1, 2], "tier": None, "knee": None, "loads": None,
                    "reason": "none crossed", "prompt_seeds": "per window"}}
    old = knee.summary(df, Run(**run), [CHAT])  # recorded before the stop was: as it was
    assert old["knees"]["chat"]["status"] == "interpolated" and "lateness" not in old and "stopped" not in old
    assert not any("lateness" in x or "stopped" in x for x in knee_lines(SimpleNamespace(knee=old, slos=[])))
    run["knee"].update(stopped={"reason": knee.CLIENT, "factor": 8.0}, max_factor=64.0,
                       lateness_target_ms=2.0)
    new = knee.summary(df, Run(**run), [CHAT])
    assert new["knees"]["chat"] == {"load": 4.0, "status": "above highest"}  # 8x was the client's
    assert new["points"]["chat"] == [(4.0, 1.0), (8.0, 0.5)]  # every factor searched, still shown
    assert new["lateness"]["8"]["replay_p99_ms"] == [6.0, 9.0] and new["lateness"]["8"]["max_ms"] == 9.0
    lines = knee_lines(SimpleNamespace(knee=new, slos=[]))
    assert "| 8x | 0.500 | 7.50 | 8.97 | 9.00 |" in lines
    assert any(x.startswith("The client, not the server, is the limit: at 8x") for x in lines)


def test_a_search_whose_windows_shared_prompt_seeds_is_flagged_in_the_report() -> None:
    from experiments.reporting.report_knee import knee_lines
    from experiments.stats.goodput import met_column

    df = pd.DataFrame({"phase": ["knee"] * 4, "load": [4.0, 4.0, 8.0, 8.0],
                       met_column(CHAT): [True, True, True, False]})
    run = {"knee": {"arm": "stock", "windows": [3, 4], "tier": "chat", "knee": 6.0, "loads": [4.0, 8.0]}}
    old = knee.summary(df, Run(**run), [CHAT])
    assert old["shared_prompts"] and old["points"]["chat"] == [(4.0, 1.0), (8.0, 0.5)]
    line = "prefix cache served the repeats"
    assert any(line in x for x in knee_lines(SimpleNamespace(knee=old, slos=[])))
    run["knee"]["prompt_seeds"] = "per window"  # what orchestrate records since 2026-12-05
    new = knee.summary(df, Run(**run), [CHAT])
    assert "shared_prompts" not in new
    assert not any(line in x for x in knee_lines(SimpleNamespace(knee=new, slos=[])))
    one = knee.summary(df, Run(knee={**run["knee"], "windows": [3], "prompt_seeds": None}), [CHAT])
    assert "shared_prompts" not in one  # one window: nothing to share


def test_the_report_checks_the_searched_knee_against_the_measured_windows() -> None:
    from experiments.reporting.report_knee import knee_lines

    k = {"windows": [12, 16], "points": {"chat": [(5.0, 1.0), (27.0, 0.8)]},
         "knees": {"chat": {"load": 24.0, "status": "interpolated"}},
         "chosen": {"tier": "chat", "knee": 24.0, "loads": [5.0, 19.0, 30.0]}}
    tier = {"name": "chat", "baseline": "stock", "stock": {"capacity_by_attainment":
                                                           {"load": 8.2, "status": "interpolated"}},
            "capacity_per_window": {"arms": {"stock": {"mean": 11.8, "ci95": [8.6, 15.0], "n": 17}}}}
    r = SimpleNamespace(knee=k, slos=[tier])  # the entries knee_lines reads of a Report
    check = [x for x in knee_lines(r) if x.startswith("Check against the measured windows")]
    assert check and "8.2x (interpolated) pooled" in check[0] and "24x lies outside" in check[0]
    k["chosen"]["knee"] = 10.0
    assert "10x lies inside." in next(x for x in knee_lines(r) if x.startswith("Check against"))
    tier["capacity_per_window"] = {}
    assert "no per-window interval" in next(x for x in knee_lines(r) if x.startswith("Check against"))
