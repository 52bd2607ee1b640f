"""The GPU share of a served decode step, against literal numbers from hand-made records."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.stats import goodput, gpushare
from loadgen.records import RequestRecord

MS = 1_000_000  # ns per ms
CURVE = gpushare.StepCurve(batch=(1.0, 4.0), step_us=(1000.0, 1600.0))


def reply(first_ms: float, itl_ms: list[float], *, arm: str = "stock", window: int = 0, load: float = 2.0,
          chunks: int | None = None, error: str | None = None) -> RequestRecord:
    """A reply whose tokens came at first_ms and then after each gap of itl_ms."""
    tokens = len(itl_ms) + 1
    last = first_ms + sum(itl_ms)
    return RequestRecord(
        index=0, due_ns=0, sent_ns=0, first_token_ns=int(first_ms * MS), last_token_ns=int(round(last * MS)),
        end_ns=int(round(last * MS)), input_tokens=10, output_tokens=tokens, prompt_tokens=10,
        completion_tokens=tokens, n_chunks=tokens if chunks is None else chunks,
        max_gap_ms=max(itl_ms, default=None), status=200, error=error,
        tags={"arm": arm, "window": window, "load": load, "phase": "measure"},
        itl_us=tuple(int(round(g * 1000)) for g in itl_ms))


def frame(records: list[RequestRecord]) -> pd.DataFrame:
    return goodput.records_frame(records, [])


# A replay of three requests. a: first token at 10 ms, then 12, 14, 16, 18; b: 14.2, then 17, 20;
# c: one token at 16.1 (a prefill that ended near a's token at 16 and b's at 17).
#   a@12: mid 11, batch 1 (a), no first token in (11, 13]       -> kept, 1.0 ms graph / 2 ms
#   a@14: mid 13, batch 1, b's first token 14.2 in (13, 15]     -> prefill
#   a@16: mid 15, batch 2 (a, b), c's 16.1 in (15, 17]          -> prefill
#   a@18: mid 17, batch 2 (c ended at 16.1), none in (17, 19]   -> kept, 1.2 ms / 2 ms
#   b@17: mid 15.6, batch 2, c's 16.1 in (15.6, 18.4]           -> prefill
#   b@20: mid 18.5, batch 1 (a ended at 18), none in (18.5, 21.5] -> kept, 1.0 ms / 3 ms
THREE = [reply(10.0, [2.0, 2.0, 2.0, 2.0]), reply(14.2, [2.8, 3.0]), reply(16.1, [])]


def test_the_batch_and_the_prefill_steps_come_from_the_replays_token_times() -> None:
    steps = gpushare.served_steps(frame(THREE))
    assert steps["batch"].tolist() == [1, 1, 2, 2, 2, 1]
    assert steps["gap_ms"].tolist() == pytest.approx([2.0, 2.0, 2.0, 2.0, 2.8, 3.0])
    assert steps["prefill"].tolist() == [False, True, True, False, True, False]


def test_the_share_is_the_median_over_steps_each_counted_once() -> None:
    (row,) = gpushare.shares(gpushare.served_steps(frame(THREE)), CURVE)
    # shares 0.5 (weight 1), 0.6 (batch 2: weight 1/2), 1/3 (weight 1): the weighted median is 0.5
    assert row == {"arm": "stock", "load": 2.0, "gaps": 3, "prefill": 3, "above_timed": 0, "batch_p50": 1.0,
                   "served_step_ms": 2.0, "gpu_step_ms": 1.0, "gpu_share": 0.5}


def test_a_batch_above_the_largest_timed_size_is_left_out_and_counted() -> None:
    (row,) = gpushare.shares(gpushare.served_steps(frame(THREE)), gpushare.StepCurve((1.0,), (900.0,)))
    assert (row["gaps"], row["above_timed"], row["prefill"]) == (2, 1, 3)
    assert row["gpu_share"] == pytest.approx(0.3)  # 0.9 / 2 and 0.9 / 3, weight 1 each: the lower


def test_gaps_of_one_network_read_and_replies_that_show_no_steps_are_left_out() -> None:
    records = [reply(0.0, [1.0, 3.0, 0.0, 1.5]),  # the read at 4 ms gave two chunks: gaps 3 and 0 dropped
               reply(0.2, [1.0, 1.0], chunks=2),  # 3 tokens in 2 chunks: its gaps span several steps
               reply(0.2, [1.0, 1.0], error="boom")]  # failed
    steps = gpushare.served_steps(frame(records))
    assert steps["gap_ms"].tolist() == [1.0, 1.5]
    assert steps["batch"].tolist() == [3, 1]  # the other two are in decode (0.2 to 2.2 ms), not shown


def test_replays_are_apart_and_each_arm_and_load_gets_a_row() -> None:
    records = [reply(0.0, [2.0, 2.0]), reply(0.0, [2.0, 2.0], window=1),  # same clock values, other replay
               reply(0.0, [4.0], arm="patched"), reply(0.0, [1.0], load=4.0)]
    rows = gpushare.shares(gpushare.served_steps(frame(records)), CURVE)
    assert [(r["arm"], r["load"], r["batch_p50"], r["gpu_share"]) for r in rows] == [
        ("patched", 2.0, 1.0, 0.25), ("stock", 2.0, 1.0, 0.5), ("stock", 4.0, 1.0, 1.0)]


def test_records_without_token_gaps_give_no_steps() -> None:
    steps = gpushare.served_steps(frame([reply(0.0, [])]))
    assert steps.empty and list(steps.columns) == gpushare.STEP_COLUMNS
    assert gpushare.shares(steps, CURVE) == []


def test_the_step_curve_is_the_stock_engines_graph_step_linear_between_timed_sizes() -> None:
    doc = {"sizes": [{"batch_tokens": 4, "baseline_median_us": 1600.0, "arms": {}},
                     {"batch_tokens": 1, "baseline_median_us": 1000.0, "arms": {}},
                     {"batch_tokens": 8, "baseline_median_us": None, "arms": {}}]}
    curve = gpushare.step_curve(doc)
    assert curve == CURVE
    assert curve.at(np.array([1.0, 2.5, 4.0])).tolist() == [1000.0, 1300.0, 1600.0]
    assert np.isnan(curve.at(np.array([0.5, 5.0]))).all()
    assert gpushare.step_curve({"sizes": []}) is None
