"""research.cellnoise on synthetic A/A runs with a known source of scatter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from experiments.core.rundir import load_records
from experiments.stats import goodput
from research import cellnoise
from tests.experiments.synthetic_run import write_run

REQUESTS, WINDOWS = 60, 30


def _pairs(run_dir: Path):  # noqa: ANN202
    records, _ = load_records(run_dir)
    return cellnoise.paired_requests(goodput.records_frame(records, []), "stock", "stock-b", "tpot_ms")


def _aa_run(tmp_path: Path, cell_sd: float) -> Path:
    """stock and stock-b: every request's TPOT scatters 5% on its own; stock-b's cells also move
    together by a cell shift of sd `cell_sd` (0: none)."""
    def cell(arm: str, window: int, load: float, rng: np.random.Generator) -> list:
        shift = rng.normal(0.0, cell_sd) if arm == "stock-b" else 0.0
        return [(50.0, 10.0 * float(np.exp(shift + rng.normal(0.0, 0.05))), None) for _ in range(REQUESTS)]
    return write_run(tmp_path / f"run-{cell_sd}", cell, labels=("stock", "stock-b"), windows=WINDOWS,
                     loads=(4.0,), requests=REQUESTS, seed=3)


def test_request_scatter_alone_predicts_the_cell_medians_spread(tmp_path: Path) -> None:
    (row,) = cellnoise.per_load(_pairs(_aa_run(tmp_path, 0.0)))
    assert row["cells"] == WINDOWS and row["requests_per_cell"] == REQUESTS
    assert row["per_request_sd"] == pytest.approx(0.05 * np.sqrt(2), rel=0.1)  # two arms' 5% each
    assert row["observed_cell_sd"] == pytest.approx(row["predicted_cell_sd"], rel=0.35)


def test_a_planted_cell_effect_shows_as_observed_above_predicted(tmp_path: Path) -> None:
    (row,) = cellnoise.per_load(_pairs(_aa_run(tmp_path, 0.03)))
    # predicted ~1.25 x 7.1% / sqrt(60) = 1.1%; the 3% cell shift adds to what is observed
    assert row["observed_cell_sd"] > 2 * row["predicted_cell_sd"]


def test_scatter_by_output_length_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _aa_run(tmp_path, 0.0)
    bins = cellnoise.by_output_tokens(_pairs(run))
    assert [b["output_tokens"] for b in bins] == ["9-32"] and bins[0]["requests"] == REQUESTS * WINDOWS
    assert cellnoise.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "load 4x: 30 cells of 60 paired requests" in out and "9-32:" in out
    assert "cell-to-cell sd by cell summary (pooled over loads): median " in out
    assert cellnoise.main([str(run), "--arms", "stock,patched"]) == 2
    assert "no records of arm 'patched'" in capsys.readouterr().err
    assert cellnoise.main([str(tmp_path / "absent")]) == 2
    assert "no requests.jsonl" in capsys.readouterr().err


def test_hodges_lehmann_literal() -> None:
    assert cellnoise.hodges_lehmann(np.array([0.0, 1.0, 10.0])) == 3.0  # Walsh averages 0 .5 1 5 5.5 10
    assert cellnoise.hodges_lehmann(np.array([3.0])) == 3.0


def test_summary_spread_ranks_the_summaries_by_their_noise(tmp_path: Path) -> None:
    """Normal per-request scatter: the mean is the most efficient summary (median about 1.25x its sd,
    Hodges-Lehmann about 1.02x); a few wild requests per cell turn that order around."""
    normal = cellnoise.summary_spread(_pairs(_aa_run(tmp_path, 0.0)))
    assert normal["mean"] < normal["Hodges-Lehmann"] < normal["median"]
    assert normal["median"] / normal["mean"] == pytest.approx(1.25, rel=0.3)

    def heavy(arm: str, window: int, load: float, rng: np.random.Generator) -> list:
        out = []
        for _ in range(REQUESTS):
            wild = rng.random() < 0.1  # one request in ten is 10x as scattered
            out.append((50.0, 10.0 * float(np.exp(rng.normal(0.0, 0.5 if wild else 0.05))), None))
        return out
    run = write_run(tmp_path / "heavy", heavy, labels=("stock", "stock-b"), windows=WINDOWS, loads=(4.0,),
                    requests=REQUESTS, seed=5)
    tails = cellnoise.summary_spread(_pairs(run))
    assert tails["median"] < tails["mean"] and tails["Hodges-Lehmann"] < tails["mean"]
