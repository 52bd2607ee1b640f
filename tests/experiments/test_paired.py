"""Paired per-request latency: pairing, the order-adjusted t interval, its calibration, planted effects."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from experiments.core.slo import SLO
from experiments.stats import goodput, paired
from tests.experiments.synthetic_run import record

CHAT = SLO("chat", 2000.0, 100.0)


def _tags(arm: str, window: int, load: float) -> dict:
    return {"arm": arm, "window": window, "load": load, "phase": "measure"}


def test_request_pairs_match_by_window_load_index_and_drop_failures() -> None:
    recs = [record(100.0, 10.0, index=0, tags=_tags("stock", 0, 1.0)),
            record(100.0, 11.0, index=0, tags=_tags("patched", 0, 1.0)),
            record(100.0, 10.0, index=1, tags=_tags("stock", 0, 1.0)),
            record(100.0, 10.0, index=1, error="boom", status=500, completion=0,
                   tags=_tags("patched", 0, 1.0)),
            record(100.0, 20.0, index=0, tags=_tags("stock", 1, 1.0))]  # no partner
    df = goodput.records_frame(recs, [CHAT])
    p = paired.request_pairs(df, "stock", "patched", "tpot_ms")
    assert list(zip(p["window"], p["index"])) == [(0, 0)]
    assert p["log_ratio"].iloc[0] == pytest.approx(math.log(1.1))


def test_requests_that_differ_across_arms_are_refused() -> None:
    recs = [record(100.0, 10.0, index=0, out=10, tags=_tags("stock", 0, 1.0)),
            record(100.0, 10.0, index=0, out=12, tags=_tags("patched", 0, 1.0))]
    with pytest.raises(ValueError, match="replayed different requests: window 0 load 1 index 0 has "
                                         "output_tokens"):
        paired.request_pairs(goodput.records_frame(recs, [CHAT]), "stock", "patched", "tpot_ms")


def test_order_term_recovers_effect_and_position_exactly() -> None:
    gap = np.array([1, -1, 1, -1, 1, 1], dtype=float)  # unbalanced on purpose
    noise = np.array([0.001, -0.001, 0.0005, -0.0005, 0.0, 0.0])
    y = 0.005 - 0.02 * gap + noise
    fit = paired.order_adjusted_t(y, gap)
    assert fit["df"] == 4
    assert fit["mu"] == pytest.approx(0.005, abs=1e-3) and fit["beta"] == pytest.approx(-0.02, abs=1e-3)
    assert fit["lo"] < 0.005 < fit["hi"] and fit["beta_hi"] < 0
    plain = paired.order_adjusted_t(y, np.ones(6))  # no variation in order: the plain mean, n - 1 dof
    assert plain["df"] == 5 and plain["beta"] is None and plain["mu"] == pytest.approx(y.mean())


def _realistic_frame(rng: np.random.Generator, effect: float, *, windows: int = 8, loads=(4.0, 8.0),
                     requests: int = 150) -> tuple[pd.DataFrame, dict]:
    """TPOT per request: request-to-request spread 30%, arm noise per request 2%, per-cell drift 0.2%
    (a per-cell sd of the median log ratio of about 0.4%, as the H200 A/A runs showed),
    the second replay of a cell 1% faster than the first (randomised balanced order), treatment
    ``effect`` (a fraction)."""
    rows, orders = [], {}
    for w in range(windows):
        for load in loads:
            order = ("stock", "patched") if rng.random() < 0.5 else ("patched", "stock")
            orders[(w, load)] = order
            base = 20.0 * np.exp(rng.normal(0, 0.3, requests))
            for pos, arm in enumerate(order):
                factor = (1 + effect if arm == "patched" else 1.0) * (0.99 if pos == 1 else 1.0)
                tpot = base * factor * np.exp(rng.normal(0, 0.002) + rng.normal(0, 0.02, requests))
                rows += [{"arm": arm, "window": w, "load": load, "index": i, "due_ms": 10.0 * i,
                          "input_tokens": 100, "output_tokens": 50, "ok": True, "tpot_ms": v}
                         for i, v in enumerate(tpot)]
    return pd.DataFrame(rows), orders


def test_planted_half_percent_tpot_effect_is_found() -> None:
    df, orders = _realistic_frame(np.random.default_rng(11), 0.005)
    c = paired.compare_metric(df, "stock", "patched", "tpot_ms", orders, seed=3)
    assert c["n_cells"] == 16 and c["n_requests"] == 16 * 150
    lo, hi = c["ci95_pct"]
    assert c["significant"] is True and 0 < lo < 0.5 < hi
    assert c["estimate_pct"] == pytest.approx(0.5, abs=0.25)
    assert c["position_ci95_pct"][0] < -1.0 < c["position_ci95_pct"][1] < 0  # the 1% position effect
    assert c["mde_pct"] < 0.5
    b_lo, b_hi = c["bootstrap_ci95_pct"]
    assert b_lo < c["estimate_pct"] < b_hi


def test_no_spread_gives_no_interval() -> None:
    df, orders = _realistic_frame(np.random.default_rng(1), 0.0, windows=2, loads=(1.0,), requests=3)
    df.loc[df["arm"] == "patched", "tpot_ms"] = df.loc[df["arm"] == "stock", "tpot_ms"].to_numpy() * 1.01
    c = paired.compare_metric(df, "stock", "patched", "tpot_ms", orders)
    assert c["ci95_pct"] is None and c["significant"] is None and "no spread" in c["reason"]
    assert c["estimate_pct"] == pytest.approx(1.0)


def test_aa_interval_excludes_zero_about_five_percent_of_the_time() -> None:
    """1,000 seeded A/A data sets of 16 cells x 101 requests, with realistic noise and a 1% position
    effect under randomised order: the order-adjusted 95% t interval excluded 0 in 37 of them (3.7%;
    a binomial(1000, 0.05) count lies in [29, 71] with probability > 0.998; the same simulation over
    20,000 sets gave 5.03%)."""
    rng = np.random.default_rng(2026)
    sets, cells, requests = 1000, 16, 101
    gap = rng.choice([-1.0, 1.0], size=(sets, cells))
    y_req = (rng.normal(0, 0.02 * math.sqrt(2), (sets, cells, requests))
             + rng.normal(0, 0.002 * math.sqrt(2), (sets, cells, 1)))
    y = np.median(y_req, axis=-1) - 0.01 * gap  # treatment second (gap +1): 1% faster
    fit = paired.order_adjusted_t(y, gap)  # one closed-form fit per row
    assert fit["df"] == cells - 2
    lo, hi = fit["lo"], fit["hi"]
    excluded = int(((lo > 0) | (hi < 0)).sum())
    assert 29 <= excluded <= 71, excluded


def test_block_bootstrap_is_seeded_and_resamples_windows() -> None:
    y = np.array([0.01, 0.012, -0.004, 0.003, 0.0, 0.008])
    gap = np.array([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    blocks = np.array([0, 0, 1, 1, 2, 2])
    a = paired.block_bootstrap(y, gap, blocks, seed=4)
    assert a == paired.block_bootstrap(y, gap, blocks, seed=4)
    assert a[0] < a[1]


def test_trend_finds_a_planted_slope() -> None:
    t = np.arange(12, dtype=float)
    d = paired.trend(0.2 * t + np.random.default_rng(0).normal(0, 0.05, 12), t)
    assert d["slope"] == pytest.approx(0.2, abs=0.02) and d["significant"] is True
    assert paired.trend([1.0, 2.0], [0.0, 1.0])["slope"] is None
