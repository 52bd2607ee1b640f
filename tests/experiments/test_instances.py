"""experiments.stats.instances on synthetic runs with a known instance effect: calibration, power, the
components it recovers, and the external instance variance."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from common.tstats import t_interval
from experiments.stats import design, instances

# the committed H200 8B runs' components (runtime_tables/instance-prior.json), log units
INSTANCE_SD, CELL_SD = 0.00165, 0.0084
SETS = 1000
PAIRS, WINDOWS, LOADS = 4, 24, 3
CODES = np.repeat(np.arange(LOADS), WINDOWS)  # cell columns: load-major
GAP = np.tile(np.where(np.arange(WINDOWS * LOADS) % 2 == 0, 1.0, -1.0), (PAIRS, 1))


def _sets(seed: int, pairs: int, cells_per_load: int, delta: float = 0.0) -> np.ndarray:
    """(SETS, pairs, cells): each instance pair's two servers carry N(0, INSTANCE_SD) effects; each cell
    a load effect (centred), an order effect of 0.05% per position and N(0, CELL_SD) noise."""
    rng = np.random.default_rng(seed)
    cells = cells_per_load * LOADS
    servers = rng.normal(0.0, INSTANCE_SD, size=(SETS, pairs, 2))
    load = 0.003 * (np.repeat(np.arange(LOADS), cells_per_load) - 1)
    gap = np.tile(np.where(np.arange(cells) % 2 == 0, 1.0, -1.0), (pairs, 1))
    noise = rng.normal(0.0, CELL_SD, size=(SETS, pairs, cells))
    return delta + (servers[..., 1] - servers[..., 0])[..., None] + load + 0.0005 * gap + noise


def _excludes(fit: dict) -> np.ndarray:
    return (fit["lo"] > 0) | (fit["hi"] < 0)


def test_aa_over_instances_is_calibrated_and_within_pair_is_not() -> None:
    """1,000 seeded A/A sets, 4 instance pairs x 72 cells: the interval over instances excludes zero
    in 5.7% of them; the within-pair interval of the first pair alone (a committed run's design: one
    server per arm, 72 cells) in 43.2%, and all 288 cells pooled as if one pair in 39.4% (pooling
    averages the pair effects but its cell-level se still leaves them out)."""
    y = _sets(11, PAIRS, WINDOWS)
    over = _excludes(instances.over_instances(y, CODES, GAP)).mean()
    one_pair = _excludes(instances.within_pairs(y[:, :1], GAP[:1])).mean()
    pooled = _excludes(instances.within_pairs(y, GAP)).mean()
    assert 0.025 <= over <= 0.08
    assert one_pair > 0.3 and pooled > 0.3
    assert (round(over, 3), round(one_pair, 3), round(pooled, 3)) == (0.057, 0.432, 0.394)


def test_the_components_and_the_order_effect_come_back() -> None:
    fit = instances.over_instances(_sets(12, PAIRS, WINDOWS), CODES, GAP)
    assert math.sqrt(fit["cell_var"].mean()) == pytest.approx(CELL_SD, rel=0.01)
    assert fit["instance_var"].mean() == pytest.approx(INSTANCE_SD ** 2, rel=0.15)
    assert fit["beta"].mean() == pytest.approx(0.0005, rel=0.05)
    assert fit["df"] == PAIRS - 1


def test_a_planted_difference_is_found_at_the_power_the_design_promises() -> None:
    """The plan for +-0.25% with these components (11 pairs x 3 windows x 3 loads) promises 80% power
    at its MDE; over 1,000 seeded sets with that difference planted the interval over instances
    excludes zero in 79.5% of them."""
    comps = design.Components(INSTANCE_SD ** 2, CELL_SD ** 2)
    costs = design.Costs(start_min=1.83, overhead_s=0.98, s_per_window_s=0.21, loads=LOADS)
    p = design.design_for_precision(comps, costs, 0.25)
    assert (p["instances"], p["windows"]) == (11, 3)
    y = _sets(13, p["instances"], p["windows"], delta=math.log1p(p["mde_pct"] / 100))
    codes = np.repeat(np.arange(LOADS), p["windows"])
    found = _excludes(instances.over_instances(y, codes)).mean()
    assert abs(found - 0.8) <= 3 * math.sqrt(0.8 * 0.2 / SETS)
    assert round(found, 3) == 0.795


def test_mixedlm_agrees_with_the_moments_on_a_balanced_set() -> None:
    """Balanced, one load, no order term: REML's group variance is the ANOVA estimate when positive."""
    import statsmodels.formula.api as smf

    rng = np.random.default_rng(4)
    y = rng.normal(0, 0.004, size=(8, 1))[None] + rng.normal(0, 0.008, size=(1, 8, 30))
    fit = instances.over_instances(y[0])
    # in percent: the optimiser is not at ease with variances of 1e-5
    frame = pd.DataFrame({"y": 100 * y[0].ravel(), "pair": np.repeat(np.arange(8), 30)})
    mixed = smf.mixedlm("y ~ 1", frame, groups=frame["pair"]).fit(reml=True)
    assert 1e4 * fit["pair_var"] == pytest.approx(float(mixed.cov_re.iloc[0, 0]), rel=1e-3)
    assert 1e4 * fit["cell_var"] == pytest.approx(float(mixed.scale), rel=1e-3)
    assert 100 * fit["mu"] == pytest.approx(float(mixed.fe_params.iloc[0]), rel=1e-6)


def test_fit_cells_reads_a_frame_with_requests() -> None:
    rng = np.random.default_rng(5)
    rows, reqs = [], []
    for inst in range(3):
        shift = rng.normal(0, 0.01)
        for w in range(6):
            for load in (2.0, 4.0):
                r = shift + rng.normal(0, 0.05, size=40)
                reqs += [{"instance": inst, "window": w, "load": load, "log_ratio": v} for v in r]
                rows.append({"instance": inst, "window": w, "load": load, "gap": (-1) ** w,
                             "median_log_ratio": float(np.median(r))})
    rows.append({"instance": 0, "window": 9, "load": 2.0, "gap": 1, "median_log_ratio": 0.0})
    out = instances.fit_cells(pd.DataFrame(rows), pd.DataFrame(reqs))
    assert (out["instance_pairs"], out["cells_per_pair"], out["cells_left_out"], out["df"]) == (3, 12, 1, 2)
    assert out["components_sd_pct"]["request_var"] == pytest.approx(5.0, rel=0.1)
    assert out["ci95_pct"][0] < out["estimate_pct"] < out["ci95_pct"][1]
    assert "no instance variance" in out["within_pair_interval"]


def test_external_instance_variance_literal() -> None:
    """A/A estimates 0.3, -0.3, 0.0 (var 0.09) with se 0.1 each (se^2 0.01): s2 = (0.09 - 0.01) / 2."""
    est = instances.external_instance_var([0.3, -0.3, 0.0], [0.1, 0.1, 0.1])
    assert est["instance_var"] == pytest.approx(0.04)
    assert est["df"] == pytest.approx(2 * (0.08 / 0.09) ** 2)  # Satterthwaite: the excess over the spread
    assert instances.external_instance_var([0.0, 0.01], [0.1, 0.1])["instance_var"] == 0.0
    with pytest.raises(ValueError, match="2\\+ A/A pairs"):
        instances.external_instance_var([0.1], [0.1])


def test_with_external_adds_the_variance_and_states_its_df() -> None:
    none = instances.with_external(0.01, 0.002, 30, 0.0, 8)
    assert (none["lo"], none["hi"]) == pytest.approx(t_interval(0.01, 0.002, 30))
    assert none["df"] == pytest.approx(30)
    w = instances.with_external(0.01, 0.002, 30, 2e-6, 8)
    total = 0.002 ** 2 + 4e-6
    assert w["se"] == pytest.approx(math.sqrt(total))
    assert w["df"] == pytest.approx(total ** 2 / (0.002 ** 4 / 30 + (4e-6) ** 2 / 8))
    assert w["hi"] - w["estimate"] == pytest.approx(sps.t.ppf(0.975, w["df"]) * math.sqrt(total))


def test_an_external_instance_variance_makes_a_calibrated_interval() -> None:
    """1,000 seeded worlds like the committed ones: 9 A/A pairs (within-pair se 0.138% on 68 df) give
    the external estimate, then one run's A/A (se 0.08%) is restated with it. The restated interval
    excludes zero in 3.8% of them (9.1% with pairs - 1 = 8 degrees of freedom for the estimate instead
    of Satterthwaite's), the within-pair interval in 54.8%."""
    rng = np.random.default_rng(7)
    se_aa, se, dof = 0.00138, 0.0008, 68
    aa = rng.normal(0, math.sqrt(2 * INSTANCE_SD ** 2 + se_aa ** 2), size=(SETS, 9))
    aa_se = se_aa * np.sqrt(rng.chisquare(dof, size=(SETS, 9)) / dof)
    y = rng.normal(0, math.sqrt(2 * INSTANCE_SD ** 2 + se ** 2), size=SETS)
    y_se = se * np.sqrt(rng.chisquare(dof, size=SETS) / dof)
    restated = within = 0
    for k in range(SETS):
        ext = instances.external_instance_var(aa[k], aa_se[k])
        w = instances.with_external(float(y[k]), float(y_se[k]), dof, ext["instance_var"], ext["df"])
        restated += w["lo"] > 0 or w["hi"] < 0
        within += abs(y[k]) / y_se[k] > sps.t.ppf(0.975, dof)
    assert 0.025 <= restated / SETS <= 0.08 and within / SETS > 0.3
    assert (restated / SETS, within / SETS) == (0.038, 0.548)


def test_se_from_interval_round_trips() -> None:
    lo, hi = t_interval(0.004, 0.001, 20)
    assert instances.se_from_interval(100 * math.expm1(lo), 100 * math.expm1(hi), 20) == pytest.approx(0.001)


def test_too_few_pairs_is_refused() -> None:
    with pytest.raises(ValueError, match="2\\+ instance pairs"):
        instances.over_instances(np.zeros((1, 10)))


def test_a_one_pair_interval_restated_with_an_external_floor_widens_and_keeps_its_estimate() -> None:
    paired = {"patched": {"tpot_ms": {"estimate_pct": -0.21, "ci95_pct": [-0.36, -0.06], "df": 60}},
              "planted:3us": {"tpot_ms": {"estimate_pct": 1.09, "ci95_pct": [0.82, 1.36], "df": 60}}}
    planted = [{"arm": "planted:3us", "reference": "patched", "measured_pct": 1.41, "ci95_pct": [1.16, 1.66]}]
    floor = {"instance_var": (0.0016450428266136868) ** 2, "df": 4.379211548985632}
    rows = instances.restated(paired, planted, "stock", floor)
    assert [r["comparison"] for r in rows] == ["patched vs stock", "planted:3us vs stock",
                                               "planted:3us vs patched"]
    first = rows[0]
    assert first["estimate_pct"] == -0.21 and first["within_pair_ci95_pct"] == [-0.36, -0.06]
    lo, hi = first["ci95_pct"]
    assert lo < -0.36 and hi > -0.06 and lo < 0 < hi  # the committed confirm3 reading: [-0.82, +0.41]
    assert round(lo, 2) == -0.82 and round(hi, 2) == 0.41
    assert instances.restated(paired, planted, "stock", None) == []  # no floor, no restated interval
    no_var = instances.restated(paired, [], "stock", {"instance_var": 0.0, "df": 4.0})
    assert no_var[0]["ci95_pct"] == pytest.approx([-0.36, -0.06], abs=1e-3)  # zero variance: as it was
