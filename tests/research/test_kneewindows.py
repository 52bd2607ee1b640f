"""The knee-window study re-derives from committed records what SEARCH_QUANTILES says."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.stats import knee
from research import kneewindows

RESULTS = Path(__file__).resolve().parents[2] / "experiments/results"
LOCATED = ("h200-llama8b-confirm2", "h200-llama8b-confirm", "h200-llama8b-twin", "h200-llama8b-twin-aa",
           "h200-llama8b-knee")  # the runs whose measured windows located the interactive knee
QUARTILES = (0.25, 0.5, 0.75)


@pytest.mark.evidence
def test_confirm2_quartile_picks_were_light_and_the_five_quantiles_are_not() -> None:
    old = kneewindows.compare(RESULTS / "h200-llama8b-confirm2", QUARTILES)
    assert old["windows"] == [3, 4, 5]
    assert old["knee_all"]["load"] == pytest.approx(6.94, abs=0.005)
    assert old["knee_picked"]["load"] == pytest.approx(9.67, abs=0.005)
    new = kneewindows.compare(RESULTS / "h200-llama8b-confirm2", knee.SEARCH_QUANTILES)
    assert abs(new["knee_picked"]["load"] / new["knee_all"]["load"] - 1) < 0.10


@pytest.mark.evidence
def test_the_comment_on_search_quantiles_re_derives() -> None:
    old = [kneewindows.compare(RESULTS / run, QUARTILES) for run in LOCATED]
    new = [kneewindows.compare(RESULTS / run, knee.SEARCH_QUANTILES) for run in LOCATED]
    old_bias = [b for r in old for b in r["bias"].values()]
    new_bias = [b for r in new for b in r["bias"].values()]
    assert min(old_bias) > 0 and max(old_bias) == pytest.approx(0.106, abs=0.0005)
    assert sum(old_bias) / len(old_bias) == pytest.approx(0.056, abs=0.0005)
    assert sum(map(abs, new_bias)) / len(new_bias) == pytest.approx(0.029, abs=0.0005)
    assert min(new_bias) < 0 < max(new_bias)
    ratios = [r["knee_picked"]["load"] / r["knee_all"]["load"] for r in old]
    assert min(ratios) == pytest.approx(1.08, abs=0.005) and max(ratios) == pytest.approx(1.39, abs=0.005)
    assert all(abs(r["knee_picked"]["load"] / r["knee_all"]["load"] - 1) < 0.105 for r in new)


def test_cli_prints_each_set_and_names_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kneewindows.main([str(RESULTS / "h200-llama8b-twin-aa")]) == 0
    out = capsys.readouterr().out
    assert "quantiles (0.25, 0.5, 0.75): windows [3, 4, 5]" in out and "mean |bias|" in out
    assert kneewindows.main([str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kneewindows.main([str(RESULTS / "h200-llama8b-twin-aa"), "--quantiles", "0.5,2"])
    assert "quantiles must lie in [0, 1]" in capsys.readouterr().err


def test_an_aa_run_takes_its_first_label_as_the_baseline() -> None:
    run = RESULTS / "h100-aa3-baseline"  # arms stock, stock, stock labelled stock-a, stock-b, stock-c
    m = kneewindows.measured_requests(run)
    assert set(m.arm) == {"stock-a"} and (m.phase == "measure").all()
