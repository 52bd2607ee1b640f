"""The spacing study re-derives from committed records what hostslow's thresholds were chosen from."""

from __future__ import annotations

from pathlib import Path

import pytest

from research import slowhost
from tests.experiments.synthetic_run import write_run

RESULTS = Path(__file__).resolve().parents[2] / "experiments/results"
H100_1B = ("h100-aa3-baseline", "h100-aa3-pin", "h100-aa3-rotate", "h100-llama1b-default",
           "h100-llama1b-windows9")


@pytest.mark.evidence
def test_the_comment_on_the_spacing_floor_re_derives() -> None:
    quiet = [slowhost.spacing(RESULTS / run) for run in ("h200-llama8b-confirm2", "h200-llama8b-confirm3")]
    assert [round(100 * r["robust_sd"], 2) for r in quiet] == [0.90, 0.87]
    assert [(r["replays"], len(r["slow"])) for r in quiet] == [(288, 1), (288, 1)]
    h100 = [slowhost.spacing(RESULTS / run) for run in ("h100-llama8b-fuseall", "h100-llama8b-fuseall-pair2")]
    assert [round(100 * r["robust_sd"], 1) for r in h100] == [1.0, 0.5]
    assert [(r["replays"], r["slow"]) for r in h100] == [(64, []), (64, [])]
    noisy = [slowhost.spacing(RESULTS / run) for run in H100_1B]
    sds = [100 * r["robust_sd"] for r in noisy]
    assert round(min(sds), 1) == 3.8 and round(max(sds)) == 14
    assert [len(r["slow"]) for r in noisy] == [3, 1, 3, 0, 0]
    assert [(s["arm"], s["window"], s["load"]) for s in noisy[1]["slow"]] == [("stock-b", 5, 8.0)]


def test_cli_prints_each_run_and_names_a_run_without_token_gaps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert slowhost.main([str(RESULTS / "cpu-tiny-aa")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cpu-tiny-aa: 36 replays, robust sd ") and "slow: stock-b w2 4x +" in out
    bare = write_run(tmp_path / "bare", lambda arm, w, load, rng: [(100.0, 20.0, None)] * 40)
    assert slowhost.main([str(bare)]) == 2
    assert "its records kept no token gaps" in capsys.readouterr().err
