"""Intervals over server instances: variance components and an arm difference that carries them. Pure.

A run with one server per arm gives intervals over the cells (window x load) of that one pair of
servers; two servers of one build differ by more than that (the in-run A/A pairs). With I instance
pairs, each replaying the same C cells (the kit's design: every arm replays every cell), a cell's
paired log ratio is modelled as

    y_jc = mu + a_j + b_load(c) + beta * gap_jc + e_jc,   a_j ~ (0, 2 s2_instance),  e_jc ~ (0, s2_cell),

a_j the difference of pair j's two servers (each server's own effect has variance s2_instance).
The components are estimated by the method of moments at each level (Kalibera and Jones, ISMM 2013):
s2_cell from the residuals of the fixed-effects fit (pair, load, order), s2_instance from the spread
of the pair means less what the cells put into it. The interval over instances is the kit's one t
interval on the mean of the I order-adjusted pair means, I - 1 degrees of freedom: exact under
normality for any instance variance, zero included. The least-squares interval over all cells
(experiments.stats.paired.order_adjusted_t, the one a run of one pair reports) is kept beside it,
named for what it is: within the pairs, without the instance variance. An A/A is the same fit on
pairs of the baseline's own instances.

Where a run has one pair, `with_external` adds an instance variance estimated elsewhere (the
committed A/A pairs, `external_instance_var`) to its within-pair standard error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from common.tstats import t_interval, t_quantile
from experiments.stats.paired import cell_medians, order_adjusted_t, order_gaps, pct, request_pairs

MEDIAN_FACTOR2 = math.pi / 2  # variance of a normal sample's median / variance of its mean


def _residualise(x: np.ndarray, load_codes: np.ndarray) -> np.ndarray:
    """x (..., I, C) less its pair means and its load effects (balanced: every pair has the same
    cells, so the two sets of effects are orthogonal)."""
    x = x - x.mean(axis=-1, keepdims=True)
    out = x.copy()
    for code in np.unique(load_codes):
        cols = load_codes == code
        out[..., cols] -= x[..., cols].mean(axis=(-2, -1), keepdims=True)
    return out


def over_instances(y: np.ndarray, load_codes: Sequence[int] | None = None, gap: np.ndarray | None = None,
                   confidence: float = 0.95) -> dict:
    """The fit of the module docstring on balanced cells; vectorised over leading axes.

    ``y`` (..., I, C): cell log ratios of I instance pairs x C cells (the same cells in each pair);
    ``load_codes`` (C,): the load of each cell column (None: one load); ``gap`` (I, C) or (..., I, C):
    the order covariate (None or constant: no order term). Returns mu, se, df, lo, hi (over instances),
    beta, pair_means, and the components pair_var (2 s2_instance), instance_var, cell_var (log-ratio
    units squared; instance components floored at 0).
    """
    y = np.asarray(y, dtype=float)
    n_pairs, n_cells = y.shape[-2], y.shape[-1]
    if n_pairs < 2 or n_cells < 2:
        raise ValueError(f"an interval over instances needs 2+ instance pairs of 2+ cells, got "
                         f"{n_pairs} x {n_cells}")
    codes = np.zeros(n_cells, dtype=int) if load_codes is None else np.asarray(load_codes)
    n_loads = len(np.unique(codes))
    r = _residualise(y, codes)
    dof = n_pairs * n_cells - n_pairs - (n_loads - 1)
    beta = np.zeros(y.shape[:-2])
    if gap is not None and np.ptp(gap) > 0:
        g = np.broadcast_to(np.asarray(gap, dtype=float), y.shape)
        gr = _residualise(g, codes)
        beta = (r * gr).sum(axis=(-2, -1)) / (gr * gr).sum(axis=(-2, -1))
        r = r - beta[..., None, None] * gr
        dof -= 1
        y = y - beta[..., None, None] * g
    if dof < 1:
        raise ValueError("no degrees of freedom left for the cell component")
    cell_var = (r * r).sum(axis=(-2, -1)) / dof
    means = y.mean(axis=-1)
    mu = means.mean(axis=-1)
    spread = means.var(axis=-1, ddof=1)
    se = np.sqrt(spread / n_pairs)
    pair_var = np.maximum(spread - cell_var / n_cells, 0.0)
    lo, hi = t_interval(mu, se, n_pairs - 1, confidence)
    out = {"mu": mu, "se": se, "df": n_pairs - 1, "lo": lo, "hi": hi, "beta": beta, "pair_means": means,
           "pair_var": pair_var, "instance_var": pair_var / 2, "cell_var": cell_var}
    return {k: (float(v) if isinstance(v, np.ndarray) and v.ndim == 0 else v) for k, v in out.items()}


def within_pairs(y: np.ndarray, gap: np.ndarray | None = None, confidence: float = 0.95) -> dict:
    """The least-squares interval over all cells of ``y`` (..., I, C) as if they came from one pair of
    servers (order_adjusted_t, the one a run's report keeps beside its primary): no instance variance."""
    y = np.asarray(y, dtype=float)
    flat = y.reshape(*y.shape[:-2], -1)
    g = np.zeros(flat.shape[-1]) if gap is None else np.broadcast_to(gap, y.shape).reshape(flat.shape)
    return order_adjusted_t(flat, g, confidence)


def request_component(pairs: pd.DataFrame) -> dict:
    """The request level: the pooled within-cell variance of per-request log ratios (``pairs`` with
    instance, window, load, log_ratio) and what it puts into a cell median, (pi / 2) var / n."""
    g = pairs.groupby(["instance", "window", "load"])["log_ratio"]
    n, var = g.size(), g.var(ddof=1)
    keep = n >= 2
    pooled = float(((n[keep] - 1) * var[keep]).sum() / (n[keep] - 1).sum())
    return {"request_var": pooled, "requests": int(n.sum()),
            "in_cell_median_var": MEDIAN_FACTOR2 * pooled * float((1.0 / n[keep]).mean())}


def fit_cells(cells: pd.DataFrame, pairs: pd.DataFrame | None = None, confidence: float = 0.95) -> dict:
    """Variance components and both intervals (percent) from a frame of cells with instance, window,
    load, median_log_ratio and gap (optional); ``pairs``: the per-request log ratios, for the request
    level. Cells not replayed by every instance pair are left out (counted)."""
    wide = cells.pivot_table(index="instance", columns=["load", "window"], values="median_log_ratio")
    full = wide.columns[wide.notna().all(axis=0)]
    y = wide[full].to_numpy()
    loads = np.asarray([ld for ld, _ in full], dtype=float)
    gap = None
    if "gap" in cells:
        gap = cells.pivot_table(index="instance", columns=["load", "window"], values="gap")[full].to_numpy()
    fit = over_instances(y, np.unique(loads, return_inverse=True)[1], gap, confidence)
    within = within_pairs(y, gap, confidence)
    components = {"instance_var": fit["instance_var"], "cell_var": fit["cell_var"]}
    if pairs is not None:
        req = request_component(pairs)
        components.update(request_var=req["request_var"],
                          cell_beyond_requests_var=max(fit["cell_var"] - req["in_cell_median_var"], 0.0))
    return {"instance_pairs": int(y.shape[0]), "cells_per_pair": int(y.shape[1]),
            "cells_left_out": int(len(wide.columns) - len(full)),
            "components": components,
            "components_sd_pct": {k: 100.0 * math.sqrt(v) for k, v in components.items()},
            "estimate_pct": pct(fit["mu"]), "ci95_pct": [pct(fit["lo"]), pct(fit["hi"])], "df": fit["df"],
            "interval": "over instance pairs: t on the order-adjusted pair means",
            "within_pair_ci95_pct": [pct(within["lo"]), pct(within["hi"])],
            "within_pair_df": within["df"],
            "within_pair_interval": "least squares over all cells as one pair: no instance variance"}


Orders = Mapping[tuple[int, float], Sequence[str]]  # (window, load) -> arm order: comparisons.cell_orders


def cells_from_run(df: pd.DataFrame, baseline: str, treatment: str, metric: str = "tpot_ms",
                   orders: Orders | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, pairs) of a run's measured requests for `fit_cells`: ``df`` a frame of
    experiments.stats.runframe.load_run (an instance column; without one, instance 0). A cell's
    instance is the instance pair that replayed its window; its window is renumbered by position within
    that instance, so that the pairs line up cell by cell (the trace window kept as trace_window);
    ``orders`` (comparisons.cell_orders of run.json) give the gap. ValueError when the two arms
    replayed a window on instances of different index."""
    m = df[df["phase"] == "measure"].rename(columns={"succeeded": "ok"})
    m = m.assign(instance=m["instance"] if "instance" in m else 0)
    of = m[m["arm"].isin([baseline, treatment])].groupby("window")["instance"].unique()
    mixed = [int(w) for w, v in of.items() if len(v) > 1]
    if mixed:
        raise ValueError(f"{baseline} and {treatment} replayed window {mixed[0]} on different instances")
    pairs = request_pairs(m, baseline, treatment, metric)
    pairs["instance"] = pairs["window"].map(lambda w: int(of[w][0]))
    cells = cell_medians(pairs)
    cells["instance"] = cells["window"].map(lambda w: int(of[w][0]))
    if orders is not None:
        cells["gap"] = order_gaps(cells, orders, baseline, treatment)
    cells["trace_window"] = cells["window"]
    cells["window"] = cells.groupby("instance")["trace_window"].rank(method="dense").astype(int) - 1
    return cells, pairs


def from_run(df: pd.DataFrame, baseline: str, treatment: str, metric: str = "tpot_ms",
             orders: Orders | None = None, confidence: float = 0.95) -> dict:
    """`fit_cells` of a run's cells (`cells_from_run`): the interval over its server instances, the
    within-pair one and the variance components. ValueError for a run of one instance."""
    cells, pairs = cells_from_run(df, baseline, treatment, metric, orders)
    return fit_cells(cells, pairs, confidence)


def run_rows(df: pd.DataFrame, comparisons: Sequence[tuple[str, str]], metric: str = "tpot_ms",
             orders: Orders | None = None) -> list[dict]:
    """One row per (arm, reference) of a run whose arms ran on several instances (`from_run`): the
    interval over instance pairs, the within-pair one beside it and the variance components as sd in
    percent; a row with `reason` instead where there is no interval. An A/A arm's row is the A/A over
    instances."""
    rows = []
    for arm, ref in comparisons:
        row: dict = {"comparison": f"{arm} vs {ref}"}
        try:
            fit = from_run(df, ref, arm, metric, orders)
        except ValueError as exc:
            rows.append({**row, "reason": str(exc)})
            continue
        rows.append({**row, **{k: fit[k] for k in (
            "estimate_pct", "ci95_pct", "df", "within_pair_ci95_pct", "within_pair_df", "instance_pairs",
            "cells_per_pair", "components_sd_pct")}})
    return rows


def external_instance_var(estimates: Sequence[float], ses: Sequence[float]) -> dict:
    """s2_instance from A/A pairs of other runs (log ratios and their within-pair standard errors):
    an A/A of two servers has variance 2 s2_instance + se^2, so s2_instance = (var(estimates) -
    mean(se^2)) / 2, floored at 0. Its degrees of freedom are Satterthwaite's for that difference with
    the se^2 taken as known, (pairs - 1) x (excess / var)^2: fewer than pairs - 1, which alone leaves
    `with_external` too narrow (tests/experiments/test_instances.py)."""
    d, s = np.asarray(estimates, dtype=float), np.asarray(ses, dtype=float)
    if d.size < 2:
        raise ValueError(f"an instance variance needs 2+ A/A pairs, got {d.size}")
    spread, within = float(d.var(ddof=1)), float((s * s).mean())
    excess = spread - within
    return {"pairs": int(d.size), "df": (d.size - 1) * (max(excess, 0.0) / spread) ** 2,
            "sd_estimates": math.sqrt(spread), "mean_se2": within, "instance_var": max(excess / 2, 0.0),
            "excess": excess}


def with_external(estimate: float, se: float, df: float, instance_var: float, instance_df: float,
                  confidence: float = 0.95) -> dict:
    """An interval on an arm difference of one server pair (log ratio, its within-pair se on df) that
    carries an external instance variance: se^2 + 2 s2_instance, Welch-Satterthwaite degrees of freedom
    (the external estimate on ``instance_df``)."""
    between = 2.0 * instance_var
    total = se * se + between
    dof = total * total / (se ** 4 / df + (between * between / instance_df if between > 0 else 0.0))
    lo, hi = t_interval(estimate, math.sqrt(total), dof, confidence)
    return {"estimate": estimate, "se": math.sqrt(total), "df": dof, "lo": lo, "hi": hi}


def se_from_interval(lo_pct: float, hi_pct: float, df: float, confidence: float = 0.95) -> float:
    """The log-ratio standard error behind a reported percent t interval on df degrees of freedom."""
    q = float(t_quantile(0.5 + confidence / 2, df))
    return (math.log1p(hi_pct / 100.0) - math.log1p(lo_pct / 100.0)) / (2.0 * q)


OWN_SOURCE = "this run's"  # how report.json's over_instances "source" begins for a run's own instances


def own_source(pairs: set[int]) -> str:
    """The over_instances source of a run that measured its own instances (`pairs`: the rows' counts)."""
    return f"{OWN_SOURCE} {max(pairs)} server instance pairs" if pairs else f"{OWN_SOURCE} server instances"


def measured_own(over_instances: Mapping | None) -> bool:
    """Whether a report's over_instances rows are over the run's own instances (not an external floor)."""
    return str((over_instances or {}).get("source", "")).startswith(OWN_SOURCE)


def floor_key(gpu: str | None, model: str | None) -> str:
    """How the instance prior (runtime_tables/instance-prior.json) names an external estimate: the GPU's name
    and the model's."""
    return f"{gpu} {model}"


def restated(paired_latency: Mapping, planted: Sequence[Mapping], baseline: str, floor: Mapping | None,
             metric: str = "tpot_ms") -> list[dict]:
    """Each paired comparison of `metric` of a one-pair run (every treatment against the baseline, and
    the planted control against its reference) with the external instance variance `floor` (an entry
    of runtime_tables/instance-prior.json) added: the interval over instances, beside the
    within-pair one it came from. Empty without a floor."""
    if not floor or floor.get("instance_var") is None:
        return []
    rows = [(f"{treat} vs {baseline}", c.get(metric) or {}) for treat, c in paired_latency.items()]
    for p in planted:
        fit = (paired_latency.get(p["arm"]) or {}).get(metric) or {}
        if p.get("reference") and p["reference"] != baseline and p.get("ci95_pct") is not None:
            rows.append((f"{p['arm']} vs {p['reference']}",
                         {**fit, "estimate_pct": p["measured_pct"], "ci95_pct": p["ci95_pct"]}))
    out = []
    for label, c in rows:
        if c.get("ci95_pct") is None or c.get("df") is None:
            continue
        lo, hi = c["ci95_pct"]
        se = se_from_interval(lo, hi, c["df"])
        w = with_external(math.log1p(c["estimate_pct"] / 100), se, c["df"], floor["instance_var"],
                          floor["df"])
        out.append({"comparison": label, "estimate_pct": c["estimate_pct"], "within_pair_ci95_pct": [lo, hi],
                    "ci95_pct": [pct(w["lo"]), pct(w["hi"])], "df": w["df"]})
    return out
