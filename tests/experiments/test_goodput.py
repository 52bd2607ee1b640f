import math

import pytest

from experiments.core.slo import SLO
from experiments.stats import goodput
from tests.experiments.synthetic_run import record

CHAT = SLO("chat", 2000.0, 100.0)


def tags(arm, window, load, phase="measure"):
    return {"arm": arm, "window": window, "load": load, "phase": phase}


def hand_made():
    recs = [record(9999.0, 1.0, tags=tags("stock", 0, 1.0, "warmup"))]
    # window 0, load 1 (10 s wall): stock 3 of 4 meet, patched 4 of 4
    recs += [record(100.0, 10.0, tags=tags("stock", 0, 1.0)) for _ in range(3)]
    recs += [record(100.0, 10.0, error="boom", status=500, completion=0, tags=tags("stock", 0, 1.0))]
    recs += [record(100.0, 10.0, tags=tags("patched", 0, 1.0)) for _ in range(4)]
    # window 0, load 2 (5 s wall): stock 2 of 4 meet (two TTFT misses), patched 1 of 4
    recs += [record(100.0, 10.0, tags=tags("stock", 0, 2.0)) for _ in range(2)]
    recs += [record(3000.0, 10.0, tags=tags("stock", 0, 2.0)) for _ in range(2)]
    recs += [record(100.0, 10.0, tags=tags("patched", 0, 2.0))]
    recs += [record(100.0, 200.0, tags=tags("patched", 0, 2.0)) for _ in range(3)]
    return recs


def test_cells_attainment_and_goodput():
    df, excluded = goodput.split_phases(goodput.records_frame(hand_made(), [CHAT]))
    assert excluded == {"warmup": 1}
    cells = goodput.cell_table(df, [CHAT], {0: 10.0}).set_index(["arm", "load"])
    assert cells.loc[("stock", 1.0), "attainment"] == 0.75
    assert cells.loc[("stock", 1.0), "goodput_rps"] == 0.3  # 3 / 10 s
    assert cells.loc[("patched", 1.0), "goodput_rps"] == 0.4
    assert cells.loc[("stock", 2.0), "goodput_rps"] == 0.4  # 2 / 5 s
    assert cells.loc[("patched", 2.0), "goodput_rps"] == 0.2
    assert cells.loc[("stock", 1.0), "n_ok"] == 3


def test_unknown_window_and_missing_tags_are_errors():
    df = goodput.records_frame(hand_made(), [CHAT])
    with pytest.raises(ValueError, match=r"windows \[0\]"):
        goodput.cell_table(df, [CHAT], {1: 10.0})
    with pytest.raises(ValueError, match=r"lacks tags \['phase'\]"):
        goodput.records_frame([record(1.0, 1.0, tags={"arm": "a", "window": 0, "load": 1.0})], [CHAT])


def test_paired_relative_known_answer():
    df, _ = goodput.split_phases(goodput.records_frame(hand_made(), [CHAT]))
    cells = goodput.cell_table(df, [CHAT], {0: 10.0})
    p = goodput.paired_relative(cells, "goodput_rps", "stock", "patched")
    by_load = {d["load"]: d["diff_pct"] for d in p["diffs"]}
    assert by_load[1.0] == pytest.approx(100 * 0.1 / 0.3)
    assert by_load[2.0] == pytest.approx(100 * -0.2 / 0.4)
    assert p["unpaired"] == [] and p["comparison"]["n"] == 2


def test_paired_relative_lists_unpaired_cells():
    recs = hand_made() + [record(100.0, 10.0, tags=tags("stock", 1, 1.0))]
    df, _ = goodput.split_phases(goodput.records_frame(recs, [CHAT]))
    cells = goodput.cell_table(df, [CHAT], {0: 10.0, 1: 10.0})
    p = goodput.paired_relative(cells, "goodput_rps", "stock", "patched")
    assert p["unpaired"] == [{"window": 1, "load": 1.0, "arm": "stock"}]


def test_highest_passing_load_cases():
    f = goodput.highest_passing_load
    assert f([1, 2, 4], [100, 300, 700], 500) == {"load": 3.0, "status": "interpolated"}
    assert f([1, 2, 4], [600, 700, 800], 500)["status"] == "below lowest"
    assert f([1, 2, 4], [100, 200, 300], 500) == {"load": 4, "status": "above highest"}
    assert f([1, 2], [100, math.inf], 500) == {"load": 1, "status": "last passing load"}


def test_capacity_from_attainment_interpolates():
    import pandas as pd
    per_load = pd.DataFrame({"arm": ["a"] * 3, "load": [1.0, 2.0, 3.0], "attainment": [1.0, 0.95, 0.75]})
    cap = goodput.capacity_from_attainment(per_load, "a")
    assert cap["status"] == "interpolated"
    assert cap["load"] == pytest.approx(2.25)  # 0.95 -> 0.75 crosses 0.9 a quarter of the way


def test_latency_curve_and_capacity():
    recs = []
    for load, ttft in ((1.0, 100.0), (2.0, 1000.0), (3.0, 3000.0)):
        recs += [record(ttft, 10.0, tags=tags("s", 0, load)) for _ in range(10)]
    df = goodput.records_frame(recs, [CHAT])
    curve = goodput.latency_curve(df, "s")
    assert list(curve["ttft_q_ms"]) == [100.0, 1000.0, 3000.0]
    cap = goodput.capacity_from_latency(curve, CHAT)
    assert cap["status"] == "interpolated" and cap["load"] == pytest.approx(2.5)
    assert cap["by_tpot"]["status"] == "above highest"


def test_latency_curve_counts_failures_as_infinite():
    recs = [record(100.0, 10.0, tags=tags("s", 0, 1.0)) for _ in range(8)]
    recs += [record(100.0, 10.0, error="x", status=500, completion=0, tags=tags("s", 0, 1.0))
             for _ in range(2)]
    curve = goodput.latency_curve(goodput.records_frame(recs, [CHAT]), "s")
    assert curve["ttft_q_ms"].iloc[0] == math.inf  # 20% failed: fewer than 90% within any bound


def test_latency_table_percentiles():
    recs = [record(float(t), 10.0, tags=tags("s", 0, 1.0)) for t in range(1, 11)]
    row = goodput.latency_table(goodput.records_frame(recs, [CHAT]))[0]
    assert row["ttft_p50_ms"] == pytest.approx(5.5) and row["ttft_p90_ms"] == pytest.approx(9.1)
    assert row["failed"] == 0 and row["n"] == 10


def test_latency_table_pools_inter_token_gaps_where_records_kept_them():
    import dataclasses

    recs = [dataclasses.replace(record(100.0, 10.0, out=3, tags=tags("s", 0, 1.0)), itl_us=gaps)
            for gaps in ((10_000, 12_000), (20_000, 30_000))]
    failed = dataclasses.replace(record(100.0, 10.0, out=3, error="boom", status=500, completion=0,
                                        tags=tags("s", 0, 1.0)), itl_us=(900_000,))
    row = goodput.latency_table(goodput.records_frame(recs + [failed], [CHAT]))[0]
    # pooled over the succeeded requests' gaps 10, 12, 20, 30 ms (the failed one's gap is left out)
    assert row["itl_p50_ms"] == pytest.approx(16.0) and row["itl_p99_ms"] == pytest.approx(29.7)
    old = goodput.latency_table(goodput.records_frame([record(100.0, 10.0, tags=tags("s", 0, 1.0))], [CHAT]))
    assert not any(k.startswith("itl_") for k in old[0])  # no gaps kept: no ITL figures at all


def test_latency_table_send_lateness_covers_every_sent_request():
    import dataclasses

    recs = [dataclasses.replace(record(100.0, 10.0, tags=tags("s", 0, 1.0)), sent_ns=int(late * 1e6))
            for late in range(1, 11)]  # sent 1..10 ms after due
    # failed, still counted
    recs.append(dataclasses.replace(recs[0], error="boom", status=500, sent_ns=int(50e6)))
    row = goodput.latency_table(goodput.records_frame(recs, [CHAT]))[0]
    assert row["lateness_max_ms"] == pytest.approx(50.0)
    assert row["lateness_p99_ms"] == pytest.approx(46.0)  # linear: 10 + 0.9 * (50 - 10) over 11 values


def test_goodput_is_attainment_times_offered_rate_and_the_real_replay_time_is_kept_beside_it():
    # window 0 at load 1 is 10 s nominal; the last request ends 30 s after t0 (the server fell behind)
    recs = [record(100.0, 10.0, tags=tags("stock", 0, 1.0), due_ms=1000.0 * i) for i in range(3)]
    recs.append(record(25_000.0, 10.0, tags=tags("stock", 0, 1.0), due_ms=4000.0, out=10))
    cells = goodput.cell_table(goodput.records_frame(recs, [CHAT]), [CHAT], {0: 10.0})
    row = cells.iloc[0]
    assert row["goodput_rps"] == 0.3 and row["attainment"] == 0.75  # 3 met over the nominal 10 s
    assert row["replay_s"] == pytest.approx(29.09)  # due 4 s + TTFT 25 s + 9 x 10 ms
    assert row["achieved_goodput_rps"] == pytest.approx(3 / 29.09)
    per_load = goodput.per_load_attainment(cells, "chat")
    assert per_load["achieved_goodput_rps"].iloc[0] == pytest.approx(3 / 29.09)


def test_paired_cells_keep_only_cells_every_arm_has():
    df = goodput.records_frame(hand_made(), [CHAT])
    cells = goodput.cell_table(df[df["phase"] == "measure"], [CHAT], {0: 10.0})
    cells = cells[~((cells["arm"] == "patched") & (cells["load"] == 2.0))]
    kept = goodput.paired_cells(cells, ["stock", "patched"])
    assert sorted(set(zip(kept["arm"], kept["load"]))) == [("patched", 1.0), ("stock", 1.0)]


def test_latency_table_throughput_over_the_real_replay_time():
    # load 1: window 0's last request ends at 9 s + 100 ms + 9 x 10 ms, window 1's at 29.19 s (38.38 s
    # of replay); 3 succeeded requests of 10 output tokens and one failure: 3 and 30 per 38.38 s
    recs = [record(100.0, 10.0, out=10, tags=tags("s", 0, 1.0), due_ms=9_000.0),
            record(100.0, 10.0, out=10, tags=tags("s", 1, 1.0), due_ms=0.0),
            record(100.0, 10.0, out=10, tags=tags("s", 1, 1.0), due_ms=29_000.0),
            record(100.0, 10.0, out=10, error="boom", status=500, completion=0, tags=tags("s", 1, 1.0))]
    df = goodput.records_frame(recs, [CHAT])
    assert [goodput.replay_seconds(w) for _, w in df.groupby("window")] == pytest.approx([9.19, 29.19])
    (row,) = goodput.latency_table(df)
    assert row["request_rps"] == pytest.approx(3 / 38.38) and row["output_tok_s"] == pytest.approx(30 / 38.38)
