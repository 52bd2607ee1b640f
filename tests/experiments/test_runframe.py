"""experiments.load_run: the committed CPU run's requests as one DataFrame, row for record."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import experiments
from common.jsonfile import read_json
from loadgen.records import read_records, succeeded, tpot_ms, tpot_unobserved, ttft_ms

RUN = Path(__file__).resolve().parents[2] / "experiments" / "results" / "cpu-tiny-aa"


def test_one_row_per_record_with_arm_window_load_phase_and_metrics() -> None:
    df = experiments.load_run(RUN)
    records = read_records(RUN / "requests.jsonl.xz")
    run = read_json(RUN / "run.json", None, "run record")
    assert len(df) == len(records)
    assert set(df["arm"]) == set(run["arm_labels"])
    assert dict(zip(df["arm"], df["arm_name"])) == dict(zip(run["arm_labels"], run["arms"]))
    assert set(df["phase"]) == {r.tags["phase"] for r in records}
    measured = df[df["phase"] == "measure"]
    per_arm = sum(w["requests"] for w in run["windows"]) * len(run["loads"])
    assert measured.groupby("arm").size().to_dict() == {lab: per_arm for lab in run["arm_labels"]}
    for row, rec in zip(df.itertuples(), records):
        assert (row.arm, row.window, row.load, row.index) == (rec.tags["arm"], rec.tags["window"],
                                                               rec.tags["load"], rec.index)
        assert row.succeeded == succeeded(rec)
        assert row.ttft_ms == pytest.approx(ttft_ms(rec))
        want = tpot_ms(rec)  # None (NaN in the frame) for one token or a reply read at one instant
        assert math.isnan(row.tpot_ms) if want is None else row.tpot_ms == pytest.approx(want)
        assert row.tpot_unobserved == tpot_unobserved(rec)
    burn = df[df["phase"] == "burnin"]
    assert burn["burnin"].notna().all() and df.loc[df["phase"] != "burnin", "burnin"].isna().all()
    assert {"met:interactive", "met:chat", "met:relaxed", "e2e_ms", "prompt_tokens_match"} <= set(df.columns)


def test_a_directory_without_a_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no run.json"):
        experiments.load_run(tmp_path)
