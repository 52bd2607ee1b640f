"""experiments.stats.instances.from_run: a synthetic run of three instance pairs, records labelled as
the runner labels them, read through experiments.load_run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import experiments
from experiments.core.runfile import read_run
from experiments.stats import instances
from experiments.stats.comparisons import cell_orders
from loadgen.records import RecordWriter, read_records
from tests.experiments.synthetic_run import write_run

OFFSET = {0: 0.004, 1: -0.003, 2: 0.001}  # each instance pair's own difference (log units)
EFFECT = 0.01
PER = 2  # windows per instance


def _cell(arm: str, window: int, load: float, rng: np.random.Generator) -> list:
    inst = window // PER
    shift = EFFECT + OFFSET[inst] + 0.0005 * (window % 2) if arm == "patched" else 0.0
    return [(50.0, 20.0 * (1 + 0.01 * i) * math.exp(shift), None) for i in range(40)]


def _labelled_run(tmp_path: Path, cell=_cell, **run) -> Path:
    """A synthetic run of 3 instance pairs: every record tagged with its window's instance."""
    run_dir = write_run(tmp_path / "run", cell, windows=3 * PER, **run)
    path = run_dir / "requests.jsonl"
    records = read_records(path)
    path.unlink()
    with RecordWriter(path) as w:
        for r in records:
            w.write(type(r)(**{**r.__dict__, "tags": {**r.tags, "instance": r.tags["window"] // PER}}))
    return run_dir


def test_from_run_fits_over_the_instances_of_a_run(tmp_path: Path) -> None:
    run_dir = _labelled_run(tmp_path)
    df = experiments.load_run(run_dir)
    assert sorted(df["instance"].unique()) == [0, 1, 2]
    run = read_run(run_dir)
    cells, pairs = instances.cells_from_run(df, "stock", "patched", orders=cell_orders(run))
    assert sorted(cells["window"].unique()) == [0, 1] and sorted(cells["trace_window"]) == sorted(
        [w for w in range(6) for _ in (1.0, 2.0)])
    assert set(pairs["instance"]) == {0, 1, 2} and "gap" in cells
    fit = instances.from_run(df, "stock", "patched", orders=cell_orders(run))
    assert (fit["instance_pairs"], fit["cells_per_pair"], fit["cells_left_out"], fit["df"]) == (3, 4, 0, 2)
    want = EFFECT + np.mean(list(OFFSET.values())) + 0.00025
    assert fit["estimate_pct"] == pytest.approx(100 * math.expm1(want), abs=0.02)
    spread = np.var(list(OFFSET.values()), ddof=1)  # the pair means' spread is the instance offsets'
    assert fit["components"]["instance_var"] == pytest.approx(spread / 2, rel=0.05)
    lo, hi = fit["ci95_pct"]
    within = fit["within_pair_ci95_pct"]
    assert lo < fit["estimate_pct"] < hi and within[1] - within[0] < hi - lo  # the instances widen it


def test_runs_of_one_instance_read_as_instance_0_and_get_no_interval_over_instances(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", _cell, windows=4)
    df = experiments.load_run(run_dir)
    assert set(df["instance"]) == {0}
    with pytest.raises(ValueError, match="2\\+ instance pairs"):
        instances.from_run(df, "stock", "patched")
    (row,) = instances.run_rows(df, [("patched", "stock")])
    assert row["comparison"] == "patched vs stock" and "2+ instance pairs" in row["reason"]
    assert "ci95_pct" not in row


def _aa_cell(arm: str, window: int, load: float, rng: np.random.Generator) -> list:
    """patched as _cell; stock-b the baseline's build with its own instance offsets (an A/A)."""
    if arm != "stock-b":
        return _cell(arm, window, load, rng)
    shift = -OFFSET[window // PER] / 2 + 0.0004 * (window % 2)
    return [(50.0, 20.0 * (1 + 0.01 * i) * math.exp(shift), None) for i in range(40)]


def test_the_report_shows_every_arm_over_instances_with_the_components(tmp_path: Path) -> None:
    from experiments.analyze import main

    run_dir = _labelled_run(tmp_path, _aa_cell, labels=("stock", "patched", "stock-b"),
                            arms=("stock", "patched", "stock"))
    assert main([str(run_dir), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())["over_instances"]
    assert report["source"] == "this run's 3 server instance pairs"
    rows = {r["comparison"]: r for r in report["rows"]}
    assert list(rows) == ["patched vs stock", "stock-b vs stock"]
    aa = rows["stock-b vs stock"]
    assert aa["df"] == 2 and aa["ci95_pct"][0] < 0 < aa["ci95_pct"][1]  # the A/A over instances
    assert aa["components_sd_pct"]["instance_var"] > 0 and "request_var" in aa["components_sd_pct"]
    assert rows["patched vs stock"]["ci95_pct"][0] > 0  # the 1% effect over instance offsets of <= 0.4%
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| TPOT stock-b vs stock, over server instances |" in text
    section = text.split("## Server instances")[1].split("\n## ")[0]
    assert "| stock-b vs stock | " in section and "| patched vs stock | " in section
