"""experiments.stats.design: the Kalibera-Jones rule against its analytic optimum, budgets, windows."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from experiments.stats import design

# the worked example: one load, s2_pair = 2 x 0.005 = 0.01, s2_cell = 1, a start 10 minutes, a window
# 0.4 minutes (2 arms x (0 + 12 s)); half-width chosen so that var(mu) = 0.005 (z = 1.96 exactly)
EXAMPLE = design.Components(instance_var=0.005, cell_var=1.0)
EXAMPLE_COSTS = design.Costs(start_min=10.0, overhead_s=0.0, s_per_window_s=1.2, loads=1)
Z = sps.norm.ppf(0.975)
TARGET_PCT = 100 * math.expm1(Z * math.sqrt(0.005))


def test_the_rule_picks_the_analytic_optimum() -> None:
    """Minimise C = I (c_i + W c_w) subject to V = s2_pair / I + s2_cell / (I W). Then I = (s2_pair +
    s2_cell / W) / V and C(W) = (s2_pair + s2_cell / W)(c_i + W c_w) / V; dC/dW = 0 gives
    s2_pair c_w = s2_cell c_i / W^2, W* = sqrt(c_i s2_cell / (c_w s2_pair)) = sqrt(10 x 1 / (0.4 x 0.01))
    = 50, I* = (0.01 + 1/50) / 0.005 = 6, C* = (sqrt(c_i s2_pair) + sqrt(c_w s2_cell))^2 / V
    = (0.316 + 0.632)^2 / 0.005 = 180 GPU minutes. Both are integers, so the integer rule must land on
    them."""
    c_i, c_w, s2_pair, s2_cell = 10.0, EXAMPLE_COSTS.window_min(10.0), 0.01, 1.0
    w_star = math.sqrt(c_i * s2_cell / (c_w * s2_pair))
    assert c_w == pytest.approx(0.4) and w_star == pytest.approx(50)
    p = design.design_for_precision(EXAMPLE, EXAMPLE_COSTS, TARGET_PCT * (1 + 1e-9), normal=True)
    assert (p["instances"], p["windows"]) == (6, 50)
    optimum = (math.sqrt(c_i * s2_pair) + math.sqrt(c_w * s2_cell)) ** 2 / 0.005
    assert p["gpu_minutes"] == pytest.approx(optimum)
    assert p["gpu_minutes"] == pytest.approx(180)


def test_the_t_interval_asks_for_more_than_the_normal_one() -> None:
    t = design.design_for_precision(EXAMPLE, EXAMPLE_COSTS, TARGET_PCT)
    assert t["gpu_minutes"] > 180 and t["half_width_pct"] <= TARGET_PCT and t["df"] == t["instances"] - 1


def test_a_budget_buys_the_precision_its_plan_costs() -> None:
    p = design.design_for_precision(EXAMPLE, EXAMPLE_COSTS, 10.0)
    b = design.design_for_budget(EXAMPLE, EXAMPLE_COSTS, p["gpu_minutes"])
    assert b["gpu_minutes"] <= p["gpu_minutes"] and b["half_width_pct"] <= p["half_width_pct"]
    with pytest.raises(ValueError, match="do not buy"):
        design.design_for_budget(EXAMPLE, EXAMPLE_COSTS, 1.0)
    with pytest.raises(ValueError, match="reaches"):
        design.design_for_precision(EXAMPLE, EXAMPLE_COSTS, 0.01, max_instances=8)


def test_request_scatter_makes_longer_windows_worth_their_time() -> None:
    """Cell noise all from requests and a large fixed cost per replay: the longest window wins; no
    request scatter: the shortest."""
    costs = design.Costs(start_min=2.0, overhead_s=5.0, s_per_window_s=0.2, loads=3)
    quiet = design.Components(instance_var=1e-6, cell_var=1e-5)
    noisy = design.Components(instance_var=1e-6, cell_var=0.0, request_var=0.01, requests_per_s=2.0)
    assert design.design_for_precision(quiet, costs, 0.3, window_s=(5.0, 10.0, 60.0))["window_s"] == 5.0
    assert design.design_for_precision(noisy, costs, 0.3, window_s=(5.0, 10.0, 60.0))["window_s"] == 60.0
    assert noisy.cell_at(10.0) == pytest.approx(math.pi / 2 * 0.01 / 20)


def test_cost_and_variance_of_one_design() -> None:
    costs = design.Costs(start_min=2.0, overhead_s=1.0, s_per_window_s=0.5, loads=3)
    assert design.cost(costs, 4, 10, 10.0) == pytest.approx(4 * (2.0 + 10 * 2 * 3 * 6.0 / 60))
    assert design.variance(EXAMPLE, costs, 4, 10, 10.0) == pytest.approx(0.01 / 4 + 1.0 / 120)
