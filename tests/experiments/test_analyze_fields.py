"""Records and run.json values of the wrong type or range are refused by the analysis with the file,
line and field named; records so refused are analysed only when told, and the report is then damaged."""

import json
import math

import pytest

from experiments.analyze import main
from tests.experiments.synthetic_run import write_run
from tests.experiments.test_analyze_integrity import cell

SLO = ["--slo", "chat:2000:100"]
LINE = 10  # a measured record of stock, window 0 (after 3 warm-up records per arm)


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", cell, windows=2)


def edit_record(run_dir, lineno: int, tags: dict | None = None, **fields) -> None:
    path = run_dir / "requests.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[lineno - 1])
    assert rec["tags"]["phase"] == "measure" and rec["tags"]["window"] == 0
    rec.update(fields)
    rec["tags"].update(tags or {})
    lines[lineno - 1] = json.dumps(rec) + "\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize("change, reason", [
    ({"first_token_ns": "1000"}, 'bad record: first_token_ns must be an integer >= 0 or null, got "1000"'),
    ({"status": "200"}, 'bad record: status must be an integer from 100 to 599 or null, got "200"'),
    ({"index": 1e18}, "bad record: index must be an integer >= 0, got 1e+18"),
    ({"index": 10**18}, "index 1000000000000000000 is past the 40 requests of window 0"),
    ({"tags": {"window": "0"}}, 'tags.window must be an integer, got "0"'),
    ({"tags": {"load": float("nan")}}, "tags.load must be a finite number > 0, got NaN"),
    ({"tags": {"phase": "measured"}},
     'tags.phase must be one of warmup, burnin, knee, measure, got "measured"'),
])
def test_a_record_field_of_the_wrong_type_or_range_is_refused_then_left_out(run_dir, capsys, change,
                                                                             reason):
    n = len((run_dir / "requests.jsonl").read_text().splitlines())
    edit_record(run_dir, LINE, **change)
    assert main([str(run_dir), *SLO]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"requests.jsonl:{LINE}: {reason}" in err, err
    assert "--accept-damaged" in err and not (run_dir / "report.json").exists()
    assert main([str(run_dir), *SLO, "--accept-damaged", "--no-plots"]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "damaged" and report["records"]["total"] == n - 1  # the bad one left out
    assert any(f"requests.jsonl:{LINE}: " in d for d in report["records"]["damage"])


def edit_run(run_dir, change) -> None:
    path = run_dir / "run.json"
    run = json.loads(path.read_text())
    change(run)
    path.write_text(json.dumps(run, indent=1))


@pytest.mark.parametrize("change, reason", [
    (lambda r: r["loads"].__setitem__(1, math.nan), "loads[1] must be a finite number > 0, got NaN"),
    (lambda r: r["windows"][0].__setitem__("requests", "40"),
     'windows[0].requests must be an integer >= 0, got "40"'),
    (lambda r: r["windows"][1].__setitem__("duration_s", -20.0),
     "windows[1].duration_s must be a finite number > 0, got -20.0"),
    (lambda r: r["schedule"][2].__setitem__("load", 3.0), "schedule[2].load 3.0 is not one of the loads"),
    (lambda r: r["schedule"][0]["done"].append("stock-z"),
     'schedule[0].done must be a list of arm_labels, got ["stock", "patched", "stock-z"]'),
    (lambda r: r.__setitem__("status", 1), "status must be a string, got 1"),
])
def test_a_run_record_value_of_the_wrong_type_or_range_is_refused(run_dir, capsys, change, reason):
    edit_run(run_dir, change)
    for more in ([], ["--accept-damaged"]):  # run.json is the design: nothing to analyse without it
        assert main([str(run_dir), *SLO, *more]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{run_dir / 'run.json'}: {reason}" in err, err
    assert not (run_dir / "report.json").exists()
