"""The knee search's choice of loads, and capacity per window with its paired comparison."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

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


def test_past_the_list_the_search_grows_while_every_tier_is_met() -> None:
    met = {"interactive": 0.95, "chat": 1.0}
    assert knee.extension(8.0, met, 0) == 12.0 and knee.extension(12.0, met, 1) == 18.0
    assert knee.extension(18.0, met, knee.EXTRA) is None  # the extra factors are spent
    assert knee.extension(8.0, {"interactive": 0.89, "chat": 1.0}, 0) is None  # a tier crossed: knee inside
    assert knee.extension(8.0, {}, 0) is None
    assert knee.beyond_listed({"factors": [3, 4, 6, 9], "listed": [3, 4]}) == [6, 9]
    assert knee.beyond_listed({"factors": [3, 4]}) == []  # runs before the extension listed nothing


def test_a_search_whose_windows_shared_prompt_seeds_is_flagged_in_the_report() -> None:
    from experiments.reporting.report_md import knee_lines
    from experiments.stats.goodput import met_column

    df = pd.DataFrame({"phase": ["knee"] * 4, "load": [4.0, 4.0, 8.0, 8.0],
                       met_column(CHAT): [True, True, True, False]})
    run = {"knee": {"arm": "stock", "windows": [3, 4], "tier": "chat", "knee": 6.0, "loads": [4.0, 8.0]}}
    old = knee.summary(df, run, [CHAT])
    assert old["shared_prompts"] and old["points"]["chat"] == [(4.0, 1.0), (8.0, 0.5)]
    line = "prefix cache served the repeats"
    assert any(line in x for x in knee_lines(SimpleNamespace(knee=old, slos=[])))
    run["knee"]["prompt_seeds"] = "per window"  # what orchestrate records since 2026-12-05
    new = knee.summary(df, run, [CHAT])
    assert "shared_prompts" not in new
    assert not any(line in x for x in knee_lines(SimpleNamespace(knee=new, slos=[])))
    one = knee.summary(df, {"knee": {**run["knee"], "windows": [3], "prompt_seeds": None}}, [CHAT])
    assert "shared_prompts" not in one  # one window: nothing to share


def test_the_report_checks_the_searched_knee_against_the_measured_windows() -> None:
    from experiments.reporting.report_md import knee_lines

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
