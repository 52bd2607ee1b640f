"""Metric functions on hand-made records, JSON round trip, reading and writing record files."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from loadgen.records import (
    RecordWriter,
    RequestRecord,
    batched,
    e2e_ms,
    itl_ms,
    lateness_ms,
    read_records,
    record_from_json,
    record_to_json,
    succeeded,
    tpot_ms,
    tpot_unobserved,
    ttft_ms,
)


def make(**kw) -> RequestRecord:
    base = dict(index=3, due_ns=1_000_000, sent_ns=1_250_000, first_token_ns=21_000_000,
                last_token_ns=61_000_000, end_ns=62_000_000, input_tokens=100, output_tokens=5,
                prompt_tokens=100, completion_tokens=5, n_chunks=5, max_gap_ms=12.5, status=200,
                error=None, tags={"arm": "stock", "window": 2})
    base.update(kw)
    return RequestRecord(**base)


def test_metrics_from_literal_times():
    r = make()
    assert ttft_ms(r) == 20.0  # (21e6 - 1e6) ns
    assert tpot_ms(r) == 10.0  # (61e6 - 21e6) ns / (5 - 1)
    assert e2e_ms(r) == 61.0
    assert lateness_ms(r) == 0.25
    assert succeeded(r)


def test_tpot_not_observed_when_the_whole_reply_came_in_one_read():
    r = make(last_token_ns=21_000_000)  # 5 tokens, first and last chunk in the same network read
    assert tpot_ms(r) is None and tpot_unobserved(r)
    assert not tpot_unobserved(make()) and not tpot_unobserved(make(completion_tokens=1, n_chunks=1))


def test_a_reply_streamed_in_fewer_chunks_than_tokens_is_batched():
    assert batched(make(n_chunks=3)) and not batched(make())  # 5 tokens in 3 chunks / in 5
    assert not batched(make(n_chunks=3, error="boom")) and not batched(make(completion_tokens=1, n_chunks=1))


def test_tpot_undefined_for_one_token_and_missing_times():
    one = make(output_tokens=1, completion_tokens=1, n_chunks=1, last_token_ns=21_000_000)
    assert tpot_ms(one) is None
    assert ttft_ms(one) == 20.0
    failed = make(first_token_ns=None, last_token_ns=None, end_ns=None, sent_ns=None,
                  completion_tokens=None, status=None, error="ClientConnectorError: refused")
    assert (ttft_ms(failed), tpot_ms(failed), e2e_ms(failed), lateness_ms(failed)) == (None,) * 4
    assert not succeeded(failed)


@pytest.mark.parametrize("change", [
    {"error": "timeout: reply not complete within 1 s"},
    {"status": 500},
    {"completion_tokens": 4},
    {"completion_tokens": None},
])
def test_succeeded_needs_no_error_200_and_exact_tokens(change):
    assert not succeeded(make(**change))


def test_json_round_trip_and_tags_copied():
    r = make()
    d = record_to_json(r)
    assert json.loads(json.dumps(d)) == d
    back = record_from_json(json.loads(json.dumps(d)))
    assert back == r
    d["tags"]["arm"] = "patched"
    assert r.tags["arm"] == "stock"


def test_inter_token_gaps_round_trip_and_older_records_read_without_them():
    r = make(itl_us=(10_000, 9_500, 10_500, 10_000))
    back = record_from_json(json.loads(json.dumps(record_to_json(r))))
    assert back == r and back.itl_us == (10_000, 9_500, 10_500, 10_000)
    assert itl_ms(back) == [10.0, 9.5, 10.5, 10.0]
    old = record_to_json(make())
    del old["itl_us"]  # a file written before the field existed
    assert record_from_json(old).itl_us is None and itl_ms(record_from_json(old)) == []


def test_from_json_names_bad_keys():
    d = record_to_json(make())
    del d["due_ns"]
    d["dew_ns"] = 1
    with pytest.raises(ValueError, match=r"missing \['due_ns'\], unknown \['dew_ns'\]"):
        record_from_json(d)


def test_writer_appends_flushed_lines_and_reader_reads_plain_and_gz(tmp_path):
    path = tmp_path / "sub" / "r.jsonl"
    recs = [make(index=i) for i in range(3)]
    with RecordWriter(path) as w:
        w.write(recs[0])
        assert read_records(path) == recs[:1]  # on disk before the writer closes
        w.write(recs[1])
    with RecordWriter(path) as w:  # append, never truncate
        w.write(recs[2])
    assert read_records(path) == recs
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read_records(gz) == recs


def test_reader_reports_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record_to_json(make())) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:2: "):
        read_records(path)


@pytest.mark.parametrize("change, reason", [
    ({"status": "200"}, 'status must be an integer from 100 to 599 or null, got "200"'),
    ({"first_token_ns": "21000000"}, 'first_token_ns must be an integer >= 0 or null, got "21000000"'),
    ({"index": 1e18}, "index must be an integer >= 0, got 1e+18"),
    ({"due_ns": -1}, "due_ns must be an integer >= 0, got -1"),
    ({"output_tokens": 0}, "output_tokens must be an integer >= 1, got 0"),
    ({"completion_tokens": True}, "completion_tokens must be an integer >= 0 or null, got true"),
    ({"n_chunks": None}, "n_chunks must be an integer >= 0, got null"),
    ({"max_gap_ms": float("nan")}, "max_gap_ms must be a finite number >= 0 or null, got NaN"),
    ({"error": 5}, "error must be a string or null, got 5"),
    ({"tags": ["stock"]}, 'tags must be an object, got ["stock"]'),
    ({"itl_us": [10, 2.5]}, "itl_us must be a list of integers >= 0 or null, got [10, 2.5]"),
    ({"first_token_ns": 900_000}, "times out of order: first_token_ns 900000 is before sent_ns 1250000"),
    ({"end_ns": 60_000_000}, "times out of order: end_ns 60000000 is before last_token_ns 61000000"),
])
def test_a_field_of_the_wrong_type_or_range_is_named_with_its_line(tmp_path, change, reason):
    path = tmp_path / "r.jsonl"
    bad = {**record_to_json(make()), **change}
    path.write_text(json.dumps(record_to_json(make())) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError) as got:
        read_records(path)
    assert str(got.value) == f"{path}:2: bad record: {reason}"


def test_a_key_given_twice_in_a_record_is_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record_to_json(make()))[:-1] + ', "status": 500}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl:1: bad record: key\(s\) status given more than once"):
        read_records(path)


def test_record_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().status = 500  # type: ignore[misc]
