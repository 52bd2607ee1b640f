"""integration.proof.graphtime's comparison of graph-replay step times, on synthetic samples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from integration.proof import graphtime


def _rounds(rng: np.random.Generator, base_us: float, shift: float, drift: list[float], n: int = 200) -> list:
    """Replay samples per round: a per-round drift shared by the arms, replay noise of 0.2%."""
    return [list(base_us * (1 + shift) * (1 + d) * (1 + 0.002 * rng.standard_normal(n))) for d in drift]


def test_a_planted_half_percent_is_found_and_its_interval_holds_the_truth() -> None:
    rng = np.random.default_rng(1)
    drift = list(0.003 * rng.standard_normal(6))  # clocks move between rounds, both arms alike
    res = graphtime.compare({"stock": _rounds(rng, 6800, 0, drift),
                             "planted": _rounds(rng, 6800, 0.005, drift)}, calls_per_step=65)
    row = res["arms"]["planted"]
    assert row["excludes_zero"] and row["rounds"] == 6
    lo, hi = row["ci95_pct"]
    assert lo < 0.5 < hi and hi - lo < 0.2
    assert row["change_per_norm_call_us"] == pytest.approx(6800 * 0.005 / 65, rel=0.1)
    assert res["replays_per_round"] == [200]


def test_identical_arms_give_an_interval_around_zero() -> None:
    rng = np.random.default_rng(2)
    drift = list(0.003 * rng.standard_normal(6))
    row = graphtime.compare({"stock": _rounds(rng, 100, 0, drift),
                             "patched": _rounds(rng, 100, 0, drift)})["arms"]["patched"]
    assert not row["excludes_zero"] and row["ci95_pct"][0] < 0 < row["ci95_pct"][1]


def test_one_round_gives_no_interval_and_says_why() -> None:
    row = graphtime.compare({"stock": [[10.0, 10.1]], "patched": [[9.0, 9.1]]})["arms"]["patched"]
    assert "ci95_pct" not in row and "2" in row["why_no_interval"]
    assert row["per_round_log_ratio"] == [pytest.approx(math.log(9.05 / 10.05))]


def test_from_results_groups_decode_sizes_and_keeps_why_a_step_was_not_timed() -> None:
    def res(us: float, timed: bool = True) -> dict:
        rounds = [{"graphs_in_step": 1, "replay_us": [us, us]} if timed else
                  {"graphs_in_step": 40, "replay_us": [], "why_not_timed": "40 graphs"}] * 2
        return {"steps": [{"kind": "decode", "batch_tokens": 8, "graph_rounds": rounds},
                          {"kind": "prefill", "batch_tokens": 512, "step_wall_us": [1.0]}]}

    rows = graphtime.from_results({"stock-compiled": res(10.0), "patched-compiled": res(9.0),
                                   "stock-eager": res(99.0)})
    assert [r["batch_tokens"] for r in rows] == [8]
    assert rows[0]["arms"]["patched"]["change_pct"] == pytest.approx(-10.0)
    rows = graphtime.from_results({"stock-compiled": res(10.0, False), "patched-compiled": res(9.0, False)})
    assert rows[0]["why_not_timed"] == ["40 graphs"] and "ci95_pct" not in rows[0]["arms"]["patched"]


def test_prefill_steps_compare_wall_times_and_find_a_planted_shift() -> None:
    rng = np.random.default_rng(0)
    wall = lambda shift: list(15_000 + shift + 300 * rng.standard_normal(20))  # noqa: E731 (20 steps, 2% noise)
    results = {"stock-compiled": {"steps": [{"kind": "prefill", "batch_tokens": 512, "step_wall_us": wall(0)},
                                            {"kind": "decode", "batch_tokens": 1, "step_wall_us": wall(0)}]},
               "planted:500ns-compiled": {"steps": [{"kind": "prefill", "batch_tokens": 512,
                                                     "step_wall_us": wall(1950)}]},
               "patched-compiled": {"steps": [{"kind": "prefill", "batch_tokens": 512,
                                               "step_wall_us": wall(0)}]}}
    (row,) = graphtime.prefill_rows(results, calls_per_step=65)  # decode rows are not prefill rows
    planted, patched = row["arms"]["planted:500ns"], row["arms"]["patched"]
    assert row["batch_tokens"] == 512 and planted["steps"] == 20
    assert planted["ci95_us"][0] > 1000 and planted["ci95_us"][0] <= 1950 <= planted["ci95_us"][1]
    assert planted["change_per_norm_call_us"] == pytest.approx(planted["change_us"] / 65)
    assert patched["ci95_us"][0] < 0 < patched["ci95_us"][1]  # no shift: the interval holds zero
    assert graphtime.prefill_rows({"patched-compiled": results["patched-compiled"]}) == []  # no stock
