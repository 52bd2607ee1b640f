"""Which arms are compared, the design fingerprint, burn-in and drift summaries."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from experiments.core.runfile import Run
from experiments.stats import comparisons


def _run(**kw) -> Run:
    run = {"arm_labels": ["stock", "patched", "stock-b"], "arms": ["stock", "patched", "stock"],
           "loads": [4.0, 8.0], "windows": [{"id": 0, "duration_s": 15.0}], "device": "cuda",
           "servers": {"stock": {"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": 1},
                       "patched": {"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": 1}},
           "model": {"name": "llama-3.1-8b", "dtype": "bfloat16", "eager": False}, "schedule": []}
    run.update(kw)
    return Run(**run)


def test_arm_roles_name_the_primary_comparison_and_the_aa_control() -> None:
    assert comparisons.arm_roles(_run()) == {"baseline": "stock", "primary": "patched",
                                             "controls": ["stock-b"], "treatments": ["patched", "stock-b"],
                                             "pure_aa": False}
    aa = comparisons.arm_roles(_run(arm_labels=["stock-a", "stock-b"], arms=["stock", "stock"]))
    assert aa["primary"] == "stock-b" and aa["controls"] == [] and aa["pure_aa"]


def test_fingerprint_differences_name_what_differs() -> None:
    this = comparisons.fingerprint(_run())
    with_aa = comparisons.fingerprint(_run(command=["experiments/run.py", "--with-aa"]))
    assert this["resident_servers"] == 2 and with_aa["resident_servers"] == 3
    other = _run()
    other.servers = {k: {**v, "gpu_memory_utilization": 0.4} for k, v in other.servers.items()}
    diffs = comparisons.fingerprint_differences(this, comparisons.fingerprint(other))
    assert diffs == [{"key": "gpu_memory_utilization", "this": [0.3], "floor": [0.4]}]
    assert comparisons.fingerprint_differences(this, None)[0]["key"] is None
    asleep = comparisons.fingerprint(_run(config={"sleep_mode": True}))  # switched servers: another design
    assert comparisons.fingerprint_differences(asleep, this) == [{"key": "sleep_mode", "this": True,
                                                                  "floor": None}]


def _frame(rows: list[tuple]) -> pd.DataFrame:
    cols = ["arm", "window", "load", "index", "phase", "ok", "tpot_ms", "ttft_ms"]
    df = pd.DataFrame(rows, columns=cols)
    df["due_ms"], df["input_tokens"], df["output_tokens"] = 0.0, 10, 10
    return df


def test_burnin_summary_compares_a_fresh_server_with_its_measured_replays() -> None:
    df = _frame([("stock", 0, 8.0, i, "burnin", True, 10.6, 100.0) for i in range(3)]
                + [("stock", 0, 8.0, i, "measure", True, 10.0, 100.0) for i in range(3)])
    (b,) = comparisons.burnin_summary(df, df[df["phase"] == "measure"])
    assert (b["arm"], b["load"], b["n"]) == ("stock", 8.0, 3)
    assert b["tpot_p50_ms_vs_measured_pct"] == pytest.approx(6.0)
    assert b["ttft_p90_ms_vs_measured_pct"] == pytest.approx(0.0)


def test_drift_finds_a_baseline_slowing_over_the_run() -> None:
    rows, replays, schedule = [], [], []
    for w in range(6):
        schedule.append({"window": w, "load": 8.0, "order": ["stock", "patched"]})
        for arm in ("stock", "patched"):
            replays.append({"arm": arm, "window": w, "load": 8.0, "phase": "measure", "started_s": 60.0 * w})
            rows += [(arm, w, 8.0, i, "measure", True, 10.0 * (1 + 0.01 * w) * (1 + 0.001 * i), 50.0)
                     for i in range(5)]
    run = _run(arm_labels=["stock", "patched"], arms=["stock", "patched"], replays=replays, schedule=schedule)
    d = comparisons.drift(_frame(rows), run)
    assert d["unit"] == "per minute"
    assert d["baseline"]["slope"] == pytest.approx(100 * 0.01 / 1.025, rel=0.02)
    assert d["baseline"]["significant"]
    assert d["paired"]["slope"] == pytest.approx(0.0, abs=1e-9)  # both arms drift together


def test_near_bound_counts_requests_within_ten_percent() -> None:
    tpots = [5.0, 28.0, 32.5, 40.0]
    df = _frame([("stock", 0, 1.0, i, "measure", True, tpot, 10.0) for i, tpot in enumerate(tpots)])
    assert comparisons.near_bound(df, 500.0, 30.0, ["stock"]) == 2
    assert comparisons.near_bound(df, 500.0, 30.0, ["patched"]) == 0
    assert np.isfinite(comparisons.near_bound(df.iloc[:0], 500.0, 30.0, ["stock"]))


def test_a_drifting_baseline_is_read_beside_the_paired_line_in_the_report() -> None:
    from experiments.reporting.report_md import design_lines

    line = {"slope": 6.1, "ci95": [4.6, 7.7], "significant": True}
    flat = {"slope": -0.05, "ci95": [-0.2, 0.1], "significant": False}
    drift = {"unit": "per minute", "baseline_arm": "stock", "paired_arms": ["stock", "patched"],
             "baseline": line, "paired": flat}
    r = SimpleNamespace(burnin=[], drift=drift)  # the entries of a Report that design_lines reads
    text = "\n".join(design_lines(r))
    assert "— drifting" in text and "its trend can be the trace's" in text
    r.drift["baseline"] = flat
    assert "trace's" not in "\n".join(design_lines(r))
