"""The summary table that opens report.md: its rows, the A/A band, the planted control's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.jsonfile import read_json
from experiments.analyze import analyze_run
from experiments.core.slo import SLO
from experiments.reporting.plots import forest, forest_rows
from experiments.reporting.schema import Report, read_report
from experiments.reporting.summary import summary_lines
from tests.experiments.synthetic_run import write_run

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
CHAT = SLO("chat", 2000.0, 100.0)


def _cell(arm, win, load, rng):
    """Patched TPOT +2%, the planted arm +5%, the second stock server as the first; per-cell noise."""
    f = {"patched": 1.02, "planted:500ns": 1.05}.get(arm, 1.0) * rng.lognormal(0, 0.004)
    return [(100.0 * load * rng.lognormal(0, 0.05), 20.0 * f * (1 + 0.01 * (i % 7)), None) for i in range(40)]


def _rows(lines: list[str]) -> dict[str, list[str]]:
    """label -> the cells of a table row."""
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in x.strip("|").split("|")]
                                              for x in lines if x.startswith("| ") and "---" not in x)}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("summary") / "run", _cell,
                        labels=("stock", "patched", "planted:500ns", "stock-b"),
                        arms=("stock", "patched", "planted:500ns", "stock"), seed=5)
    analyze_run(run_dir, [CHAT], draw_plots=False)
    return run_dir


@pytest.fixture()
def report(run_dir: Path) -> Report:
    return read_report(run_dir / "report.json")


def _with(report: Report, **entries) -> Report:
    return Report.from_json({**report.to_json(), **entries})


def test_the_title_then_the_table_open_the_report(report, run_dir):
    md = (run_dir / "report.md").read_text(encoding="utf-8").splitlines()
    assert md[0] == "# RMSNorm A/B goodput report (complete)"
    assert md[2] == "| comparison | change | 95% interval | A/A band | verdict |"
    rows = _rows(summary_lines(report))
    assert list(rows) == ["comparison", "TPOT, paired per request", "TTFT, paired per request",
                          "E2E, paired per request", "median TPOT per window (secondary)",
                          "p90 TTFT per window (secondary)", "goodput chat (TTFT<=2000 ms, TPOT<=100 ms)",
                          "planted control planted:500ns vs patched, paired TPOT"]
    tpot = report.paired_latency["patched"]["tpot_ms"]
    change, ci, band, verdict = rows["TPOT, paired per request"]
    assert change == f"{tpot['estimate_pct']:+.2f}%" and tpot["estimate_pct"] == pytest.approx(2.0, abs=0.3)
    assert ci == f"[{tpot['ci95_pct'][0]:+.2f}, {tpot['ci95_pct'][1]:+.2f}]%" and verdict == "patched higher"
    # the A/A band is the interleaved pair's own interval, as the noise floor and the forest plot give it
    lo, hi = report.aa_in_run.paired_latency["tpot_ms"]["ci95_pct"]
    assert band.startswith(f"[{lo:+.2f}, {hi:+.2f}]%") and lo < 0 < hi
    assert rows["goodput chat (TTFT<=2000 ms, TPOT<=100 ms)"][3] == "never stressed at these loads"
    # the synthetic model has no config, so the planted arm gets no prediction, and the row says why
    assert rows["planted control planted:500ns vs patched, paired TPOT"][3].startswith("no prediction (")
    note = next(x for x in summary_lines(report) if x.startswith("Changes of patched against stock"))
    assert "over windows x loads of one server per arm" in note
    assert "A/A band: the A/A floor of this run: stock-b vs stock (interleaved)." in note


def test_the_planted_line_gives_its_interval_against_its_prediction(report):
    committed = read_json(RESULTS / "h200-llama8b-confirm3" / "report.json", None, "report")
    p = committed["planted"][0]
    (label, row), = ((k, v) for k, v in _rows(summary_lines(_with(report, planted=[p]))).items()
                     if k.startswith("planted"))
    assert label == "planted control planted:3us vs patched, paired TPOT"
    assert row[:2] == ["+1.41%", "[+1.16, +1.66]%"]
    assert row[3] == "predicted +1.12%: detected, prediction outside the interval"
    missed = {**p, "ci95_pct": [-0.1, 2.9], "detected": False, "prediction_inside": True}
    rows = _rows(summary_lines(_with(report, planted=[missed])))
    (row,) = [v for k, v in rows.items() if k.startswith("planted")]
    assert row[3] == "predicted +1.12%: NOT detected, prediction inside the interval"


def test_without_an_aa_floor_the_band_says_so_and_a_band_off_zero_is_flagged(report):
    """The negative control: no A/A arm and no A/A report gives no band, not a zero-width one."""
    bare = _with(report, noise_floor={"source": None, "applied": False, "band_pct": {}}, planted=[])
    rows = _rows(summary_lines(bare))
    assert {v[2] for k, v in rows.items() if k != "comparison"} == {"not known"}
    note = summary_lines(bare)[-2]
    assert "A/A band: none (no A/A arm in this run and no A/A report given)." in note
    assert note.endswith("no interval here carries it.")  # no instance estimate for a synthetic run
    off = {**report.noise_floor, "band_pct": {"paired:tpot_ms": [0.02, 0.29]}}
    assert _rows(summary_lines(_with(report, noise_floor=off)))["TPOT, paired per request"][2] == (
        "[+0.02, +0.29]% (excludes 0)")


def test_the_forest_plot_gains_the_planted_row_with_its_prediction(report, tmp_path):
    committed = read_report(RESULTS / "h200-llama8b-confirm3" / "report.json")
    rows = forest_rows(committed)
    assert rows[-1] == {"label": "control planted:3us vs patched, TPOT",
                        "estimate": committed.planted[0]["measured_pct"],
                        "ci": committed.planted[0]["ci95_pct"],
                        "band": committed.noise_floor["band_pct"]["paired:tpot_ms"],
                        "predicted": committed.planted[0]["predicted_pct"]}
    assert not any("predicted" in r for r in forest_rows(_with(committed, planted=[])))
    forest(tmp_path / "forest.png", report)  # a planted arm without a prediction draws no marker
    assert (tmp_path / "forest.png").stat().st_size > 1000
