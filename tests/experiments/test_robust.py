"""The Huber M-estimate of experiments.stats.robust: against statsmodels' RLM, its case weights, its
calibration in heavy-tailed and measured A/A noise, and where experiments.stats.paired uses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as sps

from experiments.core.runfile import read_run
from experiments.stats import goodput, paired, robust, runframe
from experiments.stats.comparisons import cell_orders

TWIN_AA = Path(__file__).resolve().parents[2] / "experiments" / "results" / "h200-llama8b-twin-aa"


def _cells(rng: np.random.Generator, sets: int, n: int = 72, loads=(5.0, 8.0, 12.0)):
    """A/A cells as the H200 runs showed them: most within a 0.4% sd, one in ten a chaotic replay with
    a 3% sd, and a 0.5% position effect per place under a randomised order."""
    load = np.repeat(np.asarray(loads), n // len(loads))
    gap = rng.choice([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0], n)
    noise = np.where(rng.random((sets, n)) < 0.1, rng.normal(0, 0.03, (sets, n)),
                     rng.normal(0, 0.004, (sets, n)))
    return noise - 0.005 * gap, load, gap


def _excluded(y: np.ndarray, load: np.ndarray, gap: np.ndarray) -> tuple[int, float]:
    """(data sets whose 95% interval of the change excludes 0, median half-width) of one fit per row."""
    X, contrast = robust.design(load, gap)
    fit = robust.huber_fit(y, X)
    mu = fit["params"] @ contrast
    se = np.sqrt(np.einsum("i,sij,j->s", contrast, fit["cov"], contrast))
    half = sps.t.ppf(0.975, fit["df"]) * se
    return int(((mu - half > 0) | (mu + half < 0)).sum()), float(np.median(half))


def test_the_fit_is_statsmodels_rlm_with_huber_mad_scale_and_h1_covariance() -> None:
    rng = np.random.default_rng(5)
    y, load, gap = _cells(rng, 4)
    X, _ = robust.design(load, gap)
    ours = robust.huber_fit(y, X)
    assert ours["converged"].all()
    for row in range(4):
        ref = sm.RLM(y[row], X, M=sm.robust.norms.HuberT()).fit(tol=1e-12, maxiter=200)
        np.testing.assert_allclose(ours["params"][row], ref.params, rtol=0, atol=1e-9)
        np.testing.assert_allclose(ours["scale"][row], ref.scale, rtol=1e-7)
        np.testing.assert_allclose(ours["cov"][row], ref.bcov_scaled, rtol=1e-5)


def test_case_weights_equal_repeating_the_cells() -> None:
    rng = np.random.default_rng(1)
    y, load, gap = _cells(rng, 1, n=24, loads=(4.0, 8.0))
    counts = rng.integers(0, 4, 24).astype(float)
    counts[[0, 12]] = 1.0  # both loads present
    X, _ = robust.design(load, gap)
    weighted = robust.huber_fit(y, X, counts[None, :])
    rep = np.repeat(np.arange(24), counts.astype(int))
    repeated = robust.huber_fit(y[:, rep], X[rep])
    np.testing.assert_allclose(weighted["params"], repeated["params"], atol=1e-10)
    np.testing.assert_allclose(weighted["scale"], repeated["scale"], rtol=1e-10)
    np.testing.assert_allclose(weighted["cov"], repeated["cov"], rtol=1e-8)


def test_aa_in_heavy_tailed_noise_excludes_zero_about_five_percent_and_is_twice_as_tight() -> None:
    """1,000 seeded A/A sets of 72 cells (3 loads) with one chaotic cell in ten: the M-estimate's 95%
    interval excluded 0 in 47 (4.7%; binomial(1000, 0.05) lies in [29, 71] with probability > 0.998)
    with a median half-width of 0.113%; least squares gave 0.229% on the same sets."""
    y, load, gap = _cells(np.random.default_rng(2026), 1000)
    excluded, half = _excluded(y, load, gap)
    assert 29 <= excluded <= 71, excluded
    ls = paired.order_adjusted_t(y, gap)
    assert half < 0.6 * float(np.median((ls["hi"] - ls["lo"]) / 2))


def test_aa_from_the_measured_cells_of_an_h200_run_excludes_zero_about_five_percent() -> None:
    """The stock-b vs stock cells of the committed H200 run, centred on their fit and given 1,000
    seeded random signs (an A/A null with the run's own heavy tails): 54 of 1,000 intervals (5.4%)
    excluded 0, at a median half-width of 0.19%."""
    run = read_run(TWIN_AA)
    df = runframe.load_run(TWIN_AA).rename(columns={"succeeded": "ok"})
    measured, _ = goodput.split_phases(df)
    cells = paired.cell_medians(paired.request_pairs(measured, "stock", "stock-b", "tpot_ms"))
    gap = paired.order_gaps(cells, cell_orders(run), "stock", "stock-b")
    y, load = cells["median_log_ratio"].to_numpy(), cells["load"].to_numpy(dtype=float)
    fit = robust.change(y, load, gap)
    resid = y - np.array([fit["load_effects"][v] for v in load]) - fit["beta"] * gap
    assert resid.std() > 0.015  # the heavy tail is there: a least-squares sd of about 2%
    signs = np.random.default_rng(7).choice([-1.0, 1.0], (1000, len(y)))
    excluded, half = _excluded(signs * resid, load, gap)
    assert 29 <= excluded <= 71, excluded
    assert half < 0.0025


def test_a_half_percent_effect_in_heavy_tailed_noise_is_found() -> None:
    y, load, gap = _cells(np.random.default_rng(3), 1)
    fit = robust.change(y[0] + np.log(1.005), load, gap)
    assert 0 < fit["lo"] < np.log(1.005) < fit["hi"]
    assert fit["beta_lo"] < -0.005 < fit["beta_hi"] < 0  # the position effect, recovered
    assert fit["downweighted"] > 0


def test_too_few_cells_or_a_perfect_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="3 cells for 3 parameters"):
        robust.change(np.array([0.1, 0.2, 0.3]), np.array([1.0, 1.0, 2.0]), np.array([1.0, -1.0, 1.0]))
    y = np.zeros(10)
    y[0] = 0.01  # nine of ten cells fit exactly: scale 0, no interval
    fit = robust.huber_fit(y[None, :], robust.design(np.ones(10), None)[0])
    assert fit["scale"][0] == 0 and np.isnan(fit["cov"]).all()


def test_block_bootstrap_is_seeded_and_brackets_the_estimate() -> None:
    y, load, gap = _cells(np.random.default_rng(4), 1)
    windows = np.tile(np.arange(24), 3)
    a = robust.block_bootstrap(y[0], load, gap, windows, seed=1, n_resamples=500)
    assert a == robust.block_bootstrap(y[0], load, gap, windows, seed=1, n_resamples=500)
    mu = robust.change(y[0], load, gap)["mu"]
    assert a[0] < mu < a[1]


def test_paired_comparison_uses_the_m_estimate_only_with_enough_cells() -> None:
    from tests.experiments.test_paired import _realistic_frame

    df, orders = _realistic_frame(np.random.default_rng(11), 0.005)  # 16 cells: 13 dof
    few = paired.compare_metric(df, "stock", "patched", "tpot_ms", orders, seed=3)
    assert few["estimator"] == "least squares" and few["downweighted_cells"] is None
    assert few["estimate_pct"] == few["least_squares_pct"]
    df, orders = _realistic_frame(np.random.default_rng(12), 0.005, windows=12)  # 24 cells: 21 dof
    many = paired.compare_metric(df, "stock", "patched", "tpot_ms", orders, seed=3)
    assert many["estimator"] == "huber" and many["df"] == 24 - 3
    assert many["significant"] is True and many["ci95_pct"][0] < 0.5 < many["ci95_pct"][1]
    assert all(v["estimator"] == "least squares" for v in many["by_load"].values())  # 12 cells each
