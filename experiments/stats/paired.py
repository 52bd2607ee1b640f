"""Paired per-request latency: requests matched one to one across arms, summarised per window. Pure.

Both arms replay the same requests of a (window, load) cell: the same index, due time and token
counts. For TPOT, TTFT and E2E the per-request log ratio ln(treatment / baseline) is taken over the
requests that succeeded in both arms, and each cell is summarised by its median. The cells' medians
are fitted with an effect per load and the arm order as a covariate,

    y_c = a_load(c) + beta * gap_c + e_c,   gap_c = position of treatment - position of baseline in cell c,

by the Huber M-estimate of experiments.stats.robust (a few chaotic replays move a cell by several percent;
least squares would give them full weight), so that the change mu, the mean of the load effects, has
the position effect removed and beta is the position effect (the change a later replay shows against
an earlier one). Its Student-t interval (Huber's sandwich variance, n - p degrees of freedom) is the
primary interval; least squares over the cells (y_c = mu + beta * gap_c + e_c, the earlier primary)
and a window-block bootstrap of the M-estimate (windows resampled with all their loads) are shown
beside it. With fewer than robust.MIN_DF degrees of freedom the least-squares fit is the primary.
Changes are reported in percent: 100 * (exp(mu) - 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from common.tstats import t_interval
from experiments.stats import robust
from experiments.stats.intervals import block_weights, mde_se, percentile_interval

METRICS = ("tpot_ms", "ttft_ms", "e2e_ms")
METRIC_NAMES = {"tpot_ms": "TPOT", "ttft_ms": "TTFT", "e2e_ms": "E2E"}
PAIR_KEY = ["window", "load", "index"]
BOOTSTRAP_RESAMPLES = 4000
MIN_CELLS_FOR_ORDER_TERM = 4  # the order term costs a degree of freedom; below this, plain t


def pct(log_ratio: float | np.ndarray) -> float | np.ndarray:
    """A log ratio as a percent change: 100 * (exp(x) - 1)."""
    out = 100.0 * np.expm1(log_ratio)
    return float(out) if np.ndim(out) == 0 else out


def request_pairs(df: pd.DataFrame, baseline: str, treatment: str, metric: str) -> pd.DataFrame:
    """Per request succeeded in both arms with a positive ``metric``: window, load, index, log_ratio.

    ``df`` is a goodput.records_frame of measured rows. Raises ValueError when a pair's due time or
    token counts differ (the arms did not replay the same requests).
    """
    cols = [*PAIR_KEY, "due_ms", "input_tokens", "output_tokens", "ok", metric]
    b = df.loc[df["arm"] == baseline, cols].set_index(PAIR_KEY)
    t = df.loc[df["arm"] == treatment, cols].set_index(PAIR_KEY)
    both = b.merge(t, how="inner", left_index=True, right_index=True, suffixes=("_b", "_t"))
    for col in ("input_tokens", "output_tokens", "due_ms"):
        bad = both.index[~np.isclose(both[f"{col}_b"], both[f"{col}_t"], rtol=0.0, atol=1e-3)]
        if len(bad):
            w, ld, i = bad[0]
            raise ValueError(f"{baseline} and {treatment} replayed different requests: window {w} load "
                             f"{ld:g} index {i} has {col} {both.loc[bad[0], f'{col}_b']} vs "
                             f"{both.loc[bad[0], f'{col}_t']}")
    vb, vt = both[f"{metric}_b"], both[f"{metric}_t"]
    keep = both["ok_b"] & both["ok_t"] & (vb > 0) & (vt > 0)
    out = both[keep]
    return pd.DataFrame({"log_ratio": np.log(out[f"{metric}_t"] / out[f"{metric}_b"])}).reset_index()


def cell_medians(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (window, load): n pairs and the median per-request log ratio."""
    g = pairs.groupby(["window", "load"], sort=True)["log_ratio"]
    return pd.DataFrame({"n": g.size(), "median_log_ratio": g.median()}).reset_index()


def order_gaps(cells: pd.DataFrame, orders: Mapping[tuple[int, float], Sequence[str]], baseline: str,
               treatment: str) -> np.ndarray:
    """gap per cell: position of treatment minus position of baseline in that cell's replay order."""
    out = []
    for w, ld in zip(cells["window"], cells["load"]):
        order = list(orders.get((int(w), float(ld))) or [])
        out.append(order.index(treatment) - order.index(baseline)
                   if treatment in order and baseline in order else 0)
    return np.asarray(out, dtype=float)


def order_adjusted_t(y: np.ndarray, gap: np.ndarray, confidence: float = 0.95) -> dict:
    """Least-squares mu (at gap 0) and beta of y = mu + beta * gap, with t intervals; vectorised.

    ``y`` and ``gap`` have shape (..., n): one row per data set (gap may be one (n,) design for all).
    Without variation in ``gap`` (in any row) or with fewer than MIN_CELLS_FOR_ORDER_TERM cells the
    fit is the plain mean (beta None). Returns mu, se, df, lo, hi, beta, beta_lo, beta_hi, resid_sd
    (floats for 1-D y, arrays otherwise).
    """
    y = np.asarray(y, dtype=float)
    gap = np.broadcast_to(np.asarray(gap, dtype=float), y.shape)
    n = y.shape[-1]
    if n < 2:
        raise ValueError(f"an interval needs at least 2 cells, got {n}")
    gbar = gap.mean(axis=-1)
    gc = gap - gbar[..., None]
    sgg = (gc * gc).sum(axis=-1)
    with_order = bool(np.all(sgg > 0)) and n >= MIN_CELLS_FOR_ORDER_TERM
    ybar = y.mean(axis=-1)
    if with_order:
        beta = (y * gc).sum(axis=-1) / sgg
        resid = y - ybar[..., None] - beta[..., None] * gc
        dof = n - 2
        s = np.sqrt((resid * resid).sum(axis=-1) / dof)
        mu = ybar - beta * gbar
        se = s * np.sqrt(1.0 / n + gbar ** 2 / sgg)
        se_beta = s / np.sqrt(sgg)
    else:
        dof = n - 1
        s = y.std(axis=-1, ddof=1)
        mu, se, beta, se_beta = ybar, s / math.sqrt(n), None, None
    lo, hi = t_interval(mu, se, dof, confidence)
    beta_lo, beta_hi = (None, None) if beta is None else t_interval(beta, se_beta, dof, confidence)
    out = {"mu": mu, "se": se, "df": dof, "lo": lo, "hi": hi, "resid_sd": s,
           "beta": beta, "beta_lo": beta_lo, "beta_hi": beta_hi}
    return {k: (float(v) if isinstance(v, np.ndarray) and v.ndim == 0 else v) for k, v in out.items()}


def block_bootstrap(y: np.ndarray, gap: np.ndarray, blocks: np.ndarray, *, seed: int = 0,
                    n_resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the order-adjusted mu, resampling whole blocks (windows) with replacement.

    Each resample weights a cell by how often its block was drawn; the weighted fit falls back to the
    weighted mean when the resample has no variation in ``gap``. numpy default_rng(seed).
    """
    y, gap = np.asarray(y, dtype=float), np.asarray(gap, dtype=float)
    w = block_weights(blocks, seed=seed, n_resamples=n_resamples)  # (resamples, cells)
    s0, sg, sy = w.sum(1), w @ gap, w @ y
    sgg, sgy = w @ (gap * gap), w @ (gap * y)
    det = s0 * sgg - sg * sg
    use = det > 1e-12 * np.maximum(s0 * sgg, 1.0)
    beta = np.where(use, (s0 * sgy - sg * sy) / np.where(use, det, 1.0), 0.0)
    mu = (sy - beta * sg) / s0
    return percentile_interval(mu, confidence)


def _least_squares(y: np.ndarray, gap: np.ndarray) -> dict:
    fit = order_adjusted_t(y, gap)
    return {**fit, "estimator": "least squares", "scale": fit["resid_sd"], "downweighted": None}


def _fit(y: np.ndarray, loads: np.ndarray, gap: np.ndarray) -> dict:
    """The primary fit of one set of cells: the Huber M-estimate with load effects and the order
    covariate (experiments.stats.robust), or least squares over the cells where there are too few cells for
    it (fewer than robust.MIN_DF degrees of freedom) or more than half of them fit exactly (a robust
    scale of 0)."""
    with_order = np.ptp(gap) > 0 and len(y) >= MIN_CELLS_FOR_ORDER_TERM
    params = len(np.unique(loads)) + int(with_order)
    if len(y) - params >= robust.MIN_DF:
        fit = robust.change(y, loads, gap if with_order else None)
        if math.isfinite(fit["se"]):
            return {**fit, "estimator": "huber"}
    return _least_squares(y, gap)


def compare_metric(df: pd.DataFrame, baseline: str, treatment: str, metric: str,
                   orders: Mapping[tuple[int, float], Sequence[str]], seed: int = 0) -> dict:
    """The paired per-request comparison of one latency metric (see the module docstring).

    Fields are None, with ``reason``, when there are fewer than two cells or no spread. sd_cell_pct
    is the primary fit's standard error x sqrt(cells) (the spread its interval implies), scale_pct
    the fit's own per-cell scale (the residual sd for least squares, MAD / 0.6745 for Huber).
    """
    pairs = request_pairs(df, baseline, treatment, metric)
    cells = cell_medians(pairs)
    cells["gap"] = order_gaps(cells, orders, baseline, treatment)
    cells["change_pct"] = pct(cells["median_log_ratio"].to_numpy())
    out: dict = {"metric": metric, "baseline": baseline, "treatment": treatment, "summary": "median",
                 "estimator": None, "n_requests": len(pairs), "n_cells": len(cells),
                 "cells": cells.to_dict(orient="records"), "estimate_pct": None, "ci95_pct": None,
                 "bootstrap_ci95_pct": None, "least_squares_pct": None, "least_squares_ci95_pct": None,
                 "position_pct": None, "position_ci95_pct": None, "df": None, "sd_cell_pct": None,
                 "scale_pct": None, "downweighted_cells": None, "mde_pct": None, "significant": None,
                 "reason": None, "by_load": {}}
    y = cells["median_log_ratio"].to_numpy()
    if len(cells) < 2:
        out["reason"] = f"{len(cells)} paired cell{'s' * (len(cells) != 1)}: no interval"
        out["estimate_pct"] = pct(float(y[0])) if len(y) else None
        return out
    if np.ptp(y) == 0.0:
        out.update(estimate_pct=pct(float(y[0])),
                   reason="the same change in every cell: no spread, no interval")
        return out
    gap, loads = cells["gap"].to_numpy(), cells["load"].to_numpy(dtype=float)
    windows = cells["window"].to_numpy()
    fit = _fit(y, loads, gap)
    ls = fit if fit["estimator"] == "least squares" else _least_squares(y, gap)
    if fit["estimator"] == "huber":
        boot = robust.block_bootstrap(y, loads, gap if fit["beta"] is not None else None, windows, seed=seed,
                                      n_resamples=BOOTSTRAP_RESAMPLES)
    else:
        boot = block_bootstrap(y, gap, windows, seed=seed)
    out.update(estimator=fit["estimator"], estimate_pct=pct(fit["mu"]),
               ci95_pct=[pct(fit["lo"]), pct(fit["hi"])],
               bootstrap_ci95_pct=None if boot is None else [pct(boot[0]), pct(boot[1])], df=fit["df"],
               least_squares_pct=pct(ls["mu"]), least_squares_ci95_pct=[pct(ls["lo"]), pct(ls["hi"])],
               sd_cell_pct=100.0 * float(fit["se"]) * math.sqrt(len(y)),
               scale_pct=100.0 * float(fit["scale"]),
               downweighted_cells=fit["downweighted"], mde_pct=pct(mde_se(fit["se"], fit["df"])),
               significant=bool(fit["lo"] > 0 or fit["hi"] < 0))
    if fit["beta"] is not None:
        out.update(position_pct=pct(fit["beta"]),
                   position_ci95_pct=[pct(fit["beta_lo"]), pct(fit["beta_hi"])])
    else:
        out["position_reason"] = "order term not fitted (no variation in arm order or fewer than " \
                                 f"{MIN_CELLS_FOR_ORDER_TERM} cells)"
    for load, c in cells.groupby("load", sort=True):
        entry = {"n_cells": len(c), "estimate_pct": pct(float(c["median_log_ratio"].mean())),
                 "ci95_pct": None, "estimator": None}
        if len(c) >= 2 and np.ptp(c["median_log_ratio"]) > 0:
            f = _fit(c["median_log_ratio"].to_numpy(), c["load"].to_numpy(dtype=float), c["gap"].to_numpy())
            entry.update(estimate_pct=pct(f["mu"]), ci95_pct=[pct(f["lo"]), pct(f["hi"])],
                         estimator=f["estimator"])
        out["by_load"][f"{load:g}"] = entry
    return out


def compare_all(df: pd.DataFrame, baseline: str, treatment: str,
                orders: Mapping[tuple[int, float], Sequence[str]], seed: int = 0) -> dict[str, dict]:
    """compare_metric for TPOT, TTFT and E2E."""
    return {m: compare_metric(df, baseline, treatment, m, orders, seed) for m in METRICS}


def trend(values: Sequence[float], times: Sequence[float], confidence: float = 0.95) -> dict:
    """Least-squares slope of values over times, with its t interval (None fields below 3 points)."""
    y, x = np.asarray(values, dtype=float), np.asarray(times, dtype=float)
    n = int(y.size)
    out = {"n": n, "slope": None, "ci95": None, "significant": None}
    if n < 3 or np.ptp(x) == 0:
        return {**out, "reason": "fewer than 3 points or no spread in time"}
    res = sps.linregress(x, y)
    lo, hi = t_interval(res.slope, res.stderr, n - 2, confidence)
    return {**out, "slope": float(res.slope), "ci95": [float(lo), float(hi)],
            "significant": bool(lo > 0 or hi < 0)}
