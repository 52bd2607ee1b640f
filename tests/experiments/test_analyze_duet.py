"""Analysis of duet runs on synthetic records: the GPU is the covariate, the report says the layout,
the GPU bias with its interval and the A/A duet's half-width."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.analyze import analyze_run
from experiments.core.runfile import read_run
from experiments.reporting import duetreport
from experiments.stats import duet
from tests.experiments.synthetic_run import write_run

WINDOWS, LOADS = 8, (1.0, 2.0)


def _duet_run(run_dir: Path, labels: tuple[str, str], arms: tuple[str, str], effect: float,
              gpu_bias: float, seed: int) -> tuple[Path, list[duet.Placement]]:
    """A synthetic duet: per-request base TPOT shared by both arms of a cell, the treatment x
    (1 + effect), the arm on GPU 1 x (1 + gpu_bias); run.json then says layout duet."""
    sched = duet.placements(labels, (0, 1), WINDOWS, seed)
    base: dict[tuple[int, float], np.ndarray] = {}

    def cell(lab: str, win: int, load: float, rng: np.random.Generator) -> list:
        b = base.setdefault((win, load), rng.lognormal(np.log(20.0), 0.2, size=40))
        scale = (1 + effect if lab == labels[1] else 1.0) * (1 + gpu_bias if sched[win].gpu_of(lab) else 1.0)
        tpot = b * scale * np.exp(rng.normal(0.0, 0.004, size=40))
        return [(50.0, float(t), None) for t in tpot]

    write_run(run_dir, cell, labels=labels, arms=arms, windows=WINDOWS, loads=LOADS, seed=seed)
    run = json.loads((run_dir / "run.json").read_text())
    run["layout"] = "duet"
    run["duet"] = {"gpus": [0, 1], "schedule": duet.schedule_record(sched, seed), "note": None}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir, sched


def test_an_ab_duet_finds_the_effect_with_the_gpu_bias_removed_and_reports_both(tmp_path: Path) -> None:
    run_dir, _ = _duet_run(tmp_path / "ab", ("stock", "patched"), ("stock", "patched"), 0.01, 0.03, seed=4)
    report = analyze_run(run_dir, draw_plots=False)
    tpot = report["paired_latency"]["patched"]["tpot_ms"]
    assert tpot["covariate"] == "gpu" and tpot["ci95_pct"][0] < 1.0 < tpot["ci95_pct"][1]
    lay = report["layout"]
    assert lay["name"] == "duet" and lay["balance"] == {"stock": {"0": 4, "1": 4},
                                                        "patched": {"0": 4, "1": 4}}
    lo, hi = lay["gpu_bias"]["tpot_ms"]["ci95_pct"]
    assert lo < 3.0 < hi and lay["gpu_bias"]["tpot_ms"]["pct"] == pytest.approx(3.0, abs=0.3)
    assert lay["aa_half_width_tpot_pct"] is None  # an A/B duet with no A/A report: not known, said so
    # nominal replay time: 8 windows of 20 s at 1x and 2x, on both GPUs at once
    assert lay["gpu_minutes"] == pytest.approx(WINDOWS * (20.0 + 10.0) * 2 / 60.0)
    assert report["design"]["fingerprint"]["layout"] == "duet"
    md = (run_dir / "report.md").read_text()
    assert "**Duet layout**" in md and "GPU-adjusted least-squares t over 16 cells" in md
    assert f"GPU bias on TPOT (beta: a later GPU of a window's placement vs an earlier one): " \
           f"{lay['gpu_bias']['tpot_ms']['pct']:+.2f}%" in md
    assert "position effect" not in md and "A/A duet half-width of the paired TPOT interval: not known" in md


def test_an_aa_duet_gives_its_half_width_and_an_ab_duet_takes_it_from_the_aa_report(tmp_path: Path) -> None:
    aa_dir, _ = _duet_run(tmp_path / "aa", ("stock-a", "stock-b"), ("stock", "stock"), 0.0, 0.03, seed=5)
    aa = analyze_run(aa_dir, draw_plots=False)
    ci = aa["paired_latency"]["stock-b"]["tpot_ms"]["ci95_pct"]
    assert ci[0] < 0.0 < ci[1]  # the crossover keeps the GPU's 3% out of the A/A difference
    half = aa["layout"]["aa_half_width_tpot_pct"]
    assert (half == pytest.approx((ci[1] - ci[0]) / 2)
            and aa["layout"]["aa_half_width_source"].startswith("this"))
    assert aa["layout"]["aa_half_width_x_sqrt_gpu_minutes"] == pytest.approx(half * np.sqrt(8.0))
    assert f"+-{half:.2f}% (this run (A/A)) over 8.00 GPU-minutes" in (aa_dir / "report.md").read_text()
    ab_dir, _ = _duet_run(tmp_path / "ab", ("stock", "patched"), ("stock", "patched"), 0.01, 0.03, seed=6)
    ab = analyze_run(ab_dir, aa_report=aa_dir / "report.json", draw_plots=False)
    assert ab["noise_floor"]["applied"], ab["noise_floor"]["design_differences"]
    assert (ab["layout"]["aa_half_width_tpot_pct"]
            == pytest.approx(ab["noise_floor"]["band_pct"]["paired:tpot_ms"][1]))


def test_a_turns_run_has_no_layout_entry_and_counts_one_gpu_per_replay(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "turns",
                        lambda lab, w, ld, rng: [(50.0, 20.0 + rng.normal(0, 0.1), None)] * 40,
                        windows=4, loads=(1.0,))
    report = analyze_run(run_dir, draw_plots=False)
    assert "layout" not in report and "layout" not in report["design"]["fingerprint"]
    assert "Duet layout" not in (run_dir / "report.md").read_text()
    run = read_run(run_dir)
    assert duetreport.gpu_minutes(run) == pytest.approx(4 * 20.0 * 2 / 60.0)  # 4 windows, 2 arms in turn
