"""Huber M-estimate of the paired change over cells, with load effects and a covariate. Pure numpy.

The cells of a run (one per window and load) carry the median per-request log ratio treatment /
baseline. On the H200 most A/A cells lie within +-0.5% while a few replays diverge by 3-13%
(experiments/results/h200-llama8b-twin-aa: 24 cells at 5x with sd 3.2%, one of them +13%): batch
composition in a short open-loop replay is chaotic, and least squares gives such a cell the weight of
any other. The M-estimate keeps the cell but bounds its pull. The model is

    y_c = a_load(c) + beta * x_c + e_c

(x: the arm-order gap, or the duet's GPU assignment), fitted by iteratively reweighted least squares
with Huber's psi at k = 1.345 (95% efficiency under normal errors) and the scale re-estimated each
iteration as median |residual| / 0.6745: the defaults of statsmodels' RLM (HuberT, scale "mad",
update_scale, covariance "H1"), which tests/experiments/test_robust.py checks this against. The change
is the mean of the load effects (every load weighs the same, as cells do when each load has as many);
its variance is Huber's H1 sandwich, and the interval uses Student's t with n - p degrees of freedom.

The sandwich variance is a large-sample result: over 8,000 seeded normal data sets the 95% interval
excluded zero in 6.8% of them at 8 cells (2 parameters), 6.1% at 24 cells (4 parameters, 20 degrees
of freedom), 5.3% at 36 and 5.2% at 72; experiments.stats.paired uses the fit from MIN_DF degrees of freedom
on and least squares below.

Vectorised over data sets (rows of y) and over case weights (a window-block bootstrap's counts), so
1,000 calibration sets or 4,000 resamples are one call.
"""

from __future__ import annotations

import numpy as np

from experiments.stats.intervals import block_weights, percentile_interval, t_interval

HUBER_K = 1.345
MAD_NORMAL = 0.6744897501960817  # median |Z| of a standard normal
MAX_ITER = 100
TOL = 1e-10
MIN_DF = 20  # below this the interval's coverage falls short (see the module text)


def design(loads: np.ndarray, covariate: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(X, contrast): one indicator column per distinct load (sorted), then the covariate when given;
    contrast averages the load columns (the change) and ignores the covariate."""
    loads = np.asarray(loads, dtype=float)
    levels = np.unique(loads)
    cols = [(loads == lv).astype(float) for lv in levels]
    if covariate is not None:
        cols.append(np.asarray(covariate, dtype=float))
    contrast = np.zeros(len(cols))
    contrast[: len(levels)] = 1.0 / len(levels)
    return np.column_stack(cols), contrast


def _weighted_median(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Median of each row of `a` with integer case weights `w` (the median of the rows repeated)."""
    order = np.argsort(a, axis=-1)
    a_s = np.take_along_axis(a, order, axis=-1)
    cw = np.cumsum(np.take_along_axis(w, order, axis=-1), axis=-1)
    total = cw[..., -1:]
    lower = np.take_along_axis(a_s, np.argmax(cw >= total / 2.0, axis=-1)[..., None], axis=-1)
    upper = np.take_along_axis(a_s, np.argmax(cw > total / 2.0, axis=-1)[..., None], axis=-1)
    return ((lower + upper) / 2.0)[..., 0]


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Coefficients of weighted least squares per row: X (n, p), y and w (S, n) -> (S, p)."""
    xtwx = np.einsum("sn,ni,nj->sij", w, X, X)
    xtwy = np.einsum("sn,ni,sn->si", w, X, y)
    return np.linalg.solve(xtwx, xtwy[..., None])[..., 0]


def huber_fit(y: np.ndarray, X: np.ndarray, case_weights: np.ndarray | None = None) -> dict:
    """Huber M-estimate of y = X b + e for each row of `y` (S, n), X (n, p) of full column rank.

    `case_weights` (S, n): how many times each cell counts (a bootstrap resample), default once.
    Returns params (S, p), cov (S, p, p) (H1), scale (S,), robustness weights (S, n), df (n - p,
    counting case weights), and converged (S,) bool. A row whose scale falls to 0 (below 1e-6 of its
    range: more than half the cells fit exactly) gets cov NaN.
    """
    y = np.atleast_2d(np.asarray(y, dtype=float))
    X = np.asarray(X, dtype=float)
    cw = np.ones_like(y) if case_weights is None else np.asarray(case_weights, dtype=float)
    n_eff = cw.sum(axis=-1)
    p = X.shape[1]
    params = _wls(X, y, cw)
    resid = y - params @ X.T
    scale = _weighted_median(np.abs(resid), cw) / MAD_NORMAL
    rw = np.ones_like(y)
    converged = np.zeros(y.shape[0], dtype=bool)
    floor = 1e-6 * np.ptp(y, axis=-1)
    live = scale > floor
    for _ in range(MAX_ITER):
        u = np.abs(resid) / np.where(live, scale, 1.0)[:, None]
        rw = np.where(live[:, None], np.minimum(1.0, HUBER_K / np.maximum(u, 1e-300)), 1.0)
        new = _wls(X, y, cw * rw)
        step = np.abs(new - params).max(axis=-1)
        params = np.where(live[:, None], new, params)
        resid = y - params @ X.T
        scale = np.where(live, _weighted_median(np.abs(resid), cw) / MAD_NORMAL, scale)
        converged |= step < TOL
        live &= scale > floor
        if np.all(converged | ~live):
            break
    scale = np.where(scale > floor, scale, 0.0)
    safe = np.where(scale > 0, scale, 1.0)[:, None]
    sr = resid / safe
    psi = np.clip(sr, -HUBER_K, HUBER_K)
    dpsi = (np.abs(sr) <= HUBER_K).astype(float)
    m = (cw * dpsi).sum(axis=-1) / n_eff
    var_dpsi = (cw * (dpsi - m[:, None]) ** 2).sum(axis=-1) / n_eff
    k = 1.0 + p / n_eff * var_dpsi / np.where(m > 0, m, np.nan) ** 2
    df = n_eff - p
    factor = k ** 2 * (cw * psi ** 2).sum(axis=-1) / df * scale ** 2 / m ** 2
    xtx_inv = np.linalg.inv(np.einsum("sn,ni,nj->sij", cw, X, X))
    cov = factor[:, None, None] * xtx_inv
    cov = np.where((scale > 0)[:, None, None], cov, np.nan)
    return {"params": params, "cov": cov, "scale": scale, "weights": rw, "df": df,
            "converged": converged | (scale == 0)}


def change(y: np.ndarray, loads: np.ndarray, covariate: np.ndarray | None = None,
           confidence: float = 0.95) -> dict:
    """The change (mean of the load effects) of one set of cells with its t interval, and the
    covariate's coefficient with its own: mu, se, df, lo, hi, beta, beta_lo, beta_hi (None without a
    covariate), scale (the robust per-cell sd), downweighted (cells given weight < 1), load_effects
    {load: log ratio}. ValueError when there are no more cells than parameters."""
    X, contrast = design(loads, covariate)
    n, p = X.shape
    if n <= p:
        raise ValueError(f"{n} cells for {p} parameters: no robust fit")
    fit = huber_fit(np.asarray(y, dtype=float)[None, :], X)
    b, cov, df = fit["params"][0], fit["cov"][0], float(fit["df"][0])
    mu = float(contrast @ b)
    se = float(np.sqrt(contrast @ cov @ contrast))
    lo, hi = t_interval(mu, se, df, confidence)
    out = {"mu": mu, "se": se, "df": int(round(df)), "lo": lo, "hi": hi,
           "scale": float(fit["scale"][0]), "downweighted": int((fit["weights"][0] < 1.0).sum()),
           "load_effects": {float(lv): float(v) for lv, v in zip(np.unique(loads), b)},
           "beta": None, "beta_lo": None, "beta_hi": None}
    if covariate is not None:
        se_b = float(np.sqrt(cov[-1, -1]))
        beta_lo, beta_hi = t_interval(float(b[-1]), se_b, df, confidence)
        out.update(beta=float(b[-1]), beta_lo=beta_lo, beta_hi=beta_hi)
    return out


def block_bootstrap(y: np.ndarray, loads: np.ndarray, covariate: np.ndarray | None, blocks: np.ndarray,
                    *, seed: int, n_resamples: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Percentile interval of the M-estimate's change, resampling whole blocks (windows) with
    replacement (numpy default_rng(seed)); resamples that miss a load, or whose design is singular
    (no variation in the covariate), are dropped. None when fewer than half the resamples are usable."""
    X, contrast = design(loads, covariate)
    w = block_weights(blocks, seed=seed, n_resamples=n_resamples)
    gram = np.einsum("sn,ni,nj->sij", w, X, X)
    usable = np.linalg.cond(gram) < 1e10
    if usable.sum() < n_resamples / 2:
        return None
    fit = huber_fit(np.broadcast_to(np.asarray(y, dtype=float), w.shape)[usable], X, w[usable])
    return percentile_interval(fit["params"] @ contrast, confidence)
