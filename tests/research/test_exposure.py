"""research.exposure: a planted cost that grows with exposure to prefills is found, a flat one is not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from research import exposure


def _frame(effect, seed: int = 1, n: int = 400) -> pd.DataFrame:
    """Two arms replaying the same n requests (two cells): arrivals bursty (rate changing 10x), TPOT
    10 ms for stock and stock x exp(effect(exposure) + noise) for the treatment."""
    rng = np.random.default_rng(seed)
    rows = []
    for window in (0, 1):
        gaps = np.where(np.arange(n) % 100 < 50, rng.exponential(20.0, n), rng.exponential(200.0, n))
        due = np.cumsum(gaps)
        out = rng.integers(20, 200, n)
        tpot = 10.0 * np.exp(rng.normal(0, 0.01, n))
        e2e = 50.0 + tpot * (out - 1)
        arrived = np.searchsorted(np.sort(due), due + e2e) - np.searchsorted(np.sort(due), due + 50.0)
        expo = arrived / (out - 1)
        t_tpot = tpot * np.exp(effect(expo) + rng.normal(0, 0.002, n))
        for arm, tp in (("stock", tpot), ("treated", t_tpot)):
            for i in range(n):
                rows.append({"arm": arm, "window": window, "load": 2.0, "index": i, "ok": True,
                             "due_ms": due[i], "input_tokens": 100, "output_tokens": int(out[i]),
                             "ttft_ms": 50.0, "tpot_ms": tp[i], "e2e_ms": 50.0 + tp[i] * (out[i] - 1)})
    return pd.DataFrame(rows)


def test_a_cost_that_grows_with_exposure_has_a_positive_slope() -> None:
    frame = exposure.exposure_frame(_frame(lambda x: 0.002 + 0.05 * x), "stock", "treated")
    assert len(frame) == 800 and frame["exposure"].std() > 0.05
    s = exposure.slope(frame)
    assert s["ci95_pct"][0] <= 5.0 <= s["ci95_pct"][1] and s["ci95_pct"][0] > 0  # 5% per unit
    thirds = {r["third"]: r["median_change_pct"] for r in exposure.by_third(frame)}
    assert thirds["least"] < thirds["middle"] < thirds["most"]


def test_a_flat_cost_has_a_slope_near_zero() -> None:
    frame = exposure.exposure_frame(_frame(lambda x: 0.01 + 0.0 * x, seed=2), "stock", "treated")
    s = exposure.slope(frame)
    assert s["ci95_pct"][0] <= 0.0 <= s["ci95_pct"][1]
    assert all(r["median_change_pct"] == pytest.approx(1.005, abs=0.1) for r in exposure.by_third(frame))


def test_the_cli_names_an_unknown_arm(tmp_path, capsys) -> None:  # noqa: ANN001
    assert exposure.main([str(tmp_path), "--arm", "x"]) == 2
    assert "python -m research.exposure: error: " in capsys.readouterr().err


@pytest.mark.evidence
def test_the_cli_reads_a_committed_run(capsys) -> None:  # noqa: ANN001
    from pathlib import Path

    run = Path(__file__).resolve().parents[2] / "experiments/results/h200-llama8b-planted-inkernel"
    assert exposure.main([str(run), "--arm", "nope"]) == 2
    assert "'nope' is not an arm" in capsys.readouterr().err
    assert exposure.main([str(run), "--arm", "stock-b"]) == 0
    out = capsys.readouterr().out
    assert out.count("third:") == 18 and "slope within cells" in out and "by concurrency" in out


def test_added_per_token_and_totals_against_the_median_request() -> None:
    # one cell, two requests: a short-TPOT one slowed 10% (1 ms per token over 9 steps) and a
    # long-TPOT one not at all: per token +1000 and 0 us; totals weight the long one
    rows = []
    for arm, tpots in (("stock", (10.0, 100.0)), ("treated", (11.0, 100.0))):
        for i, tp in enumerate(tpots):
            rows.append({"arm": arm, "window": 0, "load": 4.0, "index": i, "ok": True, "due_ms": 0.0,
                         "input_tokens": 10, "output_tokens": 10, "ttft_ms": 5.0, "tpot_ms": tp,
                         "e2e_ms": 5.0 + 9 * tp})
    (row,) = exposure.added_per_token(exposure.exposure_frame(pd.DataFrame(rows), "stock", "treated"))
    assert row["n"] == 2 and row["added_us_median"] == pytest.approx(500.0)
    assert row["added_us_mean"] == pytest.approx(500.0)
    assert row["total_change_pct"] == pytest.approx(100.0 * 9.0 / 990.0)
    assert row["median_request_change_pct"] == pytest.approx(100.0 * (np.sqrt(1.1) - 1.0))


def test_concurrency_is_the_mean_number_of_others_decoding_and_added_time_is_per_token() -> None:
    # one cell: A decodes over [10, 110] ms, B over [60, 160], C over [210, 310] (due + TTFT to due +
    # E2E); the treatment adds 1 ms per token to A only
    spans = {0: (0.0, 10.0, 100.0), 1: (50.0, 10.0, 100.0), 2: (200.0, 10.0, 100.0)}  # due, ttft, decode
    rows = []
    for arm in ("stock", "treated"):
        for i, (due, ttft, decode) in spans.items():
            tpot = 10.0 + (1.0 if arm == "treated" and i == 0 else 0.0)
            rows.append({"arm": arm, "window": 0, "load": 1.0, "index": i, "ok": True, "due_ms": due,
                         "input_tokens": 10, "output_tokens": 11, "ttft_ms": ttft, "tpot_ms": tpot,
                         "e2e_ms": ttft + decode})
    frame = exposure.exposure_frame(pd.DataFrame(rows), "stock", "treated").set_index("index")
    assert frame["concurrency"].tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert frame["added_us"].tolist() == pytest.approx([1000.0, 0.0, 0.0])
    assert frame["tpot_ms"].tolist() == pytest.approx([10.0, 10.0, 10.0])
    thirds = exposure.by_third(frame.reset_index(), "concurrency")
    assert [r["added_us"] for r in thirds] == pytest.approx([0.0, 1000.0, 0.0])  # ties ranked in order: A, B
    assert [r["concurrency"] for r in thirds] == pytest.approx([0.0, 0.5, 0.5])


def _feedback_records(per_step_us: float, seed: int = 3, n: int = 300) -> pd.DataFrame:
    """One arm's replay of n requests in one cell where a decode step costs 5 ms + per_step_us and
    every request that becomes due while a request decodes adds 25 ms to its decode (its prefill):
    each request's decode time is solved to its fixed point, so a slower step also buys more arrivals."""
    rng = np.random.default_rng(seed)
    due = np.cumsum(rng.exponential(150.0, n))
    out = rng.integers(20, 200, n)
    start = due + 40.0
    steps_ms = (out - 1) * (5.0 + per_step_us / 1000.0)
    decode = steps_ms
    for _ in range(50):
        arrived = np.searchsorted(due, start + decode) - np.searchsorted(due, start)
        decode = steps_ms + 25.0 * arrived
    return pd.DataFrame({"window": 0, "load": 5.0, "index": np.arange(n), "ok": True, "due_ms": due,
                         "input_tokens": 100, "output_tokens": out, "ttft_ms": 40.0,
                         "tpot_ms": decode / (out - 1), "e2e_ms": 40.0 + decode})


def test_prefill_feedback_recovers_the_arrival_cost_and_the_steps_own_delay() -> None:
    df = pd.concat([_feedback_records(0.0).assign(arm="stock"),
                    _feedback_records(200.0).assign(arm="treated")])
    frame = exposure.exposure_frame(df, "stock", "treated")
    more = frame["arrived_treated"] - frame["arrived"]
    assert (more >= 0).all() and (more > 0).any()
    rows = {r["part"]: r for r in exposure.prefill_feedback(frame)}
    assert set(rows) == {"all", *exposure.THIRDS} and rows["all"]["n"] == 300
    assert rows["all"]["cost_ms"] == pytest.approx(25.0, rel=1e-6)  # the model is exact: no noise
    assert rows["all"]["added_us_mean"] > 210.0  # more than the 200 us the step itself carries
    assert rows["all"]["remainder_us_mean"] == pytest.approx(200.0, abs=1e-6)
    for part in exposure.THIRDS:
        assert rows[part]["remainder_us_median"] == pytest.approx(200.0, abs=1e-6)


def test_prefill_feedback_of_identical_arms_is_zero() -> None:
    df = pd.concat([_feedback_records(0.0).assign(arm="stock"),
                    _feedback_records(0.0).assign(arm="treated")])
    (row, *_) = exposure.prefill_feedback(exposure.exposure_frame(df, "stock", "treated"))
    assert row["feedback_us_mean"] == 0.0 and row["added_us_mean"] == pytest.approx(0.0, abs=1e-9)
