"""research.layouts: each layout's starts, replays and switches priced from a start-cost record."""

import math
from pathlib import Path

import pytest

from common.jsonfile import read_json
from experiments.stats import design
from research import layouts

COST = {"wave_of_two_ready_s": [60.0, 90.0], "sleep_mode_ready_s": 120.0,
        "sleep_cycles": [{"sleep_s": 1.0, "wake_s": 2.0}, {"sleep_s": 2.0, "wake_s": 3.0},
                         {"sleep_s": 1.5, "wake_s": 2.5}]}
BASE = design.Costs(start_min=1.0, overhead_s=1.0, s_per_window_s=0.2, loads=3, arms=2)


def test_a_layout_pays_its_waves_replays_and_switches() -> None:
    pairs = layouts.costs_of(layouts.Layout("pairs", 4, 6), COST, BASE)
    assert pairs.start_min == pytest.approx(4 * 90.0 / 60) and pairs.arms == 6 and pairs.overhead_s == 1.0
    sleep = layouts.costs_of(layouts.Layout("sleep", 2, 4, True), COST, BASE)
    assert sleep.start_min == pytest.approx(2 * 120.0 / 60)
    assert sleep.overhead_s == pytest.approx(1.0 + 4.0)  # the median sleep + wake


def test_cheaper_starts_reach_a_target_in_fewer_gpu_minutes() -> None:
    prior = read_json(layouts.PRIOR, 1, "instance prior")
    rows = {(r["layout"], r["target_pct"]): r for r in layouts.compare(COST, prior, None)}
    assert rows[("all", 0.5)]["gpu_minutes"] < rows[("pairs", 0.5)]["gpu_minutes"]
    assert rows[("all", 0.5)]["half_width_pct"] <= 0.5
    assert rows[("all", 0.25)]["gpu_minutes"] > rows[("all", 0.5)]["gpu_minutes"]


def test_the_cell_variance_of_a_run_is_its_aa_cell_sd() -> None:
    run = Path("experiments/results/h200-llama8b-confirm3")
    report = read_json(run / "report.json", 1, "report")
    sd_pct = report["paired_latency"]["stock-b"]["tpot_ms"]["sd_cell_pct"]
    assert layouts.run_cell_var(run) == pytest.approx(math.log1p(sd_pct / 100) ** 2)
