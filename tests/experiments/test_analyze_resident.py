"""The analysis of a run of resident sets (--resident 2, four arms, three instances): every comparison
whose arms shared cells, over instance pairs, and a plain line for the one pair that never did."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.analyze import analyze_run
from experiments.core.runfile import Run
from experiments.core.schedule import cover
from experiments.core.slo import SLO
from experiments.stats.comparisons import required_pairs
from tests.experiments.synthetic_run import write_run

LABELS = ("stock", "patched", "planted:3us", "stock-b")
ARMS = ("stock", "patched", "planted:3us", "stock")
RUN = Run(arm_labels=list(LABELS), arms=list(ARMS))
SETS = cover(LABELS, required_pairs(RUN), 2)
SHIFT = {"stock": 0.0, "patched": 0.01, "planted:3us": 0.04, "stock-b": 0.0}  # log TPOT against stock
PER = 2 * len(SETS)  # windows per instance: two per set


def _cell(arm: str, window: int, load: float, rng: np.random.Generator) -> list:
    instance = window // PER
    shift = SHIFT[arm] + 0.002 * math.sin(3 * instance + len(arm)) + rng.normal(0, 0.0005)
    return [(50.0, 20.0 * (1 + 0.01 * i) * math.exp(shift), None) for i in range(40)]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    run_dir = write_run(tmp_path_factory.mktemp("resident") / "run", _cell, labels=LABELS, arms=ARMS,
                        windows=3 * PER, sets=SETS, instances=3, seed=2)
    result = analyze_run(run_dir, [SLO("chat", 2000.0, 100.0)], draw_plots=False)
    return result, (run_dir / "report.md").read_text()


def test_the_sets_are_the_baseline_s_a_a_then_the_a_b_then_the_planted_twins() -> None:
    assert SETS == (("stock", "stock-b"), ("stock", "patched"), ("patched", "planted:3us"))


def test_every_comparison_of_arms_that_shared_cells_is_made_over_instances(report: tuple[dict, str]) -> None:
    r, _ = report
    assert r["status"] == "complete" and r["missing"] == []  # no cell is expected of an arm not resident
    assert r["design"]["resident_sets"] == [list(s) for s in SETS]
    assert set(r["paired_latency"]) == {"patched", "stock-b"}  # planted never replayed a cell with stock
    tpot = r["paired_latency"]["patched"]["tpot_ms"]
    assert tpot["n_cells"] == 3 * 2 * 2 and tpot["estimate_pct"] == pytest.approx(1.0, abs=0.3)
    assert [p["reference"] for p in r["planted"]] == ["patched"]  # the planted control against its twin
    assert r["aa_in_run"]["pair"] == ["stock", "stock-b"]
    rows = {row["comparison"]: row for row in r["over_instances"]["rows"]}
    assert list(rows) == ["patched vs stock", "planted:3us vs patched", "stock-b vs stock"]
    assert all(row["instance_pairs"] == 3 and row["cells_per_pair"] == 4 for row in rows.values())
    twin = rows["planted:3us vs patched"]
    assert twin["estimate_pct"] == pytest.approx(100 * math.expm1(0.03), abs=0.3) and twin["ci95_pct"][0] > 0
    assert rows["stock-b vs stock"]["ci95_pct"][0] < 0 < rows["stock-b vs stock"]["ci95_pct"][1]


def test_the_pair_never_measured_together_is_said_not_measured(report: tuple[dict, str]) -> None:
    r, md = report
    assert r["design"]["not_measured_together"] == [["stock", "planted:3us"]]
    comparisons = md.split("## Comparisons")[1].split("\n## ")[0]
    assert ("- planted:3us vs stock: not measured (the two never shared a resident set, so never replayed a "
            "cell together)") in comparisons
    assert "- resident sets (--resident 2), in turn within every server instance, each replaying its own " \
           "equal share of the windows: stock, stock-b | stock, patched | patched, planted:3us" in md
    assert json.loads(json.dumps(r["design"]))["fingerprint"]["resident_sets"] == [list(s) for s in SETS]


def test_a_run_without_sets_says_nothing_of_them(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", _cell, labels=LABELS, arms=ARMS, windows=4)
    r = analyze_run(run_dir, [SLO("chat", 2000.0, 100.0)], draw_plots=False)
    assert "resident_sets" not in r["design"] and "resident_sets" not in r["design"]["fingerprint"]
    assert set(r["paired_latency"]) == {"patched", "planted:3us", "stock-b"}
    assert "not measured" not in (run_dir / "report.md").read_text()
