"""research.plantedsim: its committed documents re-derive from the runs; bad input gets one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.jsonfile import read_json, write_json
from experiments.core.runfile import Run, read_run
from experiments.reporting.reportdiff import same_figures
from research import plantedsim

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "experiments" / "results" / "plantedsim").glob("*.json"))


def test_forward_points_take_the_arm_timed_else_stock_from_a_change() -> None:
    doc = {"sizes": [{"batch_tokens": 1, "arms": {"patched": {"median_us": 99.0, "change_pct": -1.0}}}],
           "prefill": [{"batch_tokens": 512, "arms": {"patched": {"median_us": 220.0, "change_pct": 10.0}}}]}
    assert plantedsim.forward_points(doc, "patched") == [(1.0, 99.0), (512.0, 220.0)]
    assert plantedsim.forward_points(doc, None) == [(1.0, pytest.approx(100.0)),
                                                    (512.0, pytest.approx(200.0))]


def test_gap_change_splits_time_and_counts_the_long_gaps() -> None:
    before, after = np.array([5.0, 5.0, 30.0]), np.array([6.0, 6.0, 30.0, 30.0])
    assert plantedsim.gap_change(before, after, 10.0) == {"short": pytest.approx(20.0), "long": 100.0,
                                                          "long_count": 100.0}


@pytest.mark.evidence
@pytest.mark.evidence
@pytest.mark.parametrize("path", DOCS, ids=[p.stem for p in DOCS])
def test_a_committed_document_re_derives_from_its_run(path: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the command names the run relative to the project
    doc = read_json(path, plantedsim.SCHEMA_VERSION, "plantedsim document")
    args = doc["command"].split()[3:]  # after "python -m research.plantedsim"
    out = tmp_path / path.name
    assert plantedsim.main([*args[:args.index("--out")], "--out", str(out)]) == 0
    again = read_json(out, plantedsim.SCHEMA_VERSION, "plantedsim document")
    assert same_figures({k: v for k, v in again.items() if k != "command"},
                        {k: v for k, v in doc.items() if k != "command"})


def test_every_planted_run_with_a_report_has_a_document() -> None:
    runs = {p.parent.name for p in (ROOT / "experiments" / "results").glob("h200-*/report.json*")
            if any(e.get("norm_calls_per_step") for e in read_json(p, None, "report").get("planted") or [])}
    assert runs and runs <= {p.stem for p in DOCS}


def test_bad_input_gets_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ROOT / "experiments" / "results" / "h200-llama8b-confirm3"
    assert plantedsim.main([str(run), "--arm", "stock-b"]) == 2
    assert "--arm 'stock-b': no planted control" in capsys.readouterr().err
    other = tmp_path / "steps.json"
    write_json(other, {"model": "/models/qwen3-8b", "sizes": []})
    assert plantedsim.main([str(run), "--arm", "planted:3us", "--step-times", str(other)]) == 2
    assert "times model '/models/qwen3-8b', the run's is 'llama-3.1-8b'" in capsys.readouterr().err
    assert plantedsim.main([str(run), "--arm", "planted:3us", "--kv-tokens", "0"]) == 2
    assert "--kv-tokens must be >= 1" in capsys.readouterr().err
    assert plantedsim.main([str(tmp_path / "none"), "--arm", "planted:3us"]) == 2
    assert "run.json" in capsys.readouterr().err


def test_the_kv_cache_size_comes_from_the_reference_servers_log(tmp_path: Path) -> None:
    run = Run(servers={"patched": {"log": "server-patched.log"}, "stock": {"log": "server-stock.log"}})
    (tmp_path / "server-patched.log").write_text("INFO x\n"
                                                 "INFO [kv] GPU KV cache size: 1,234 tokens\n")
    assert plantedsim.logged_kv_tokens(tmp_path, run, "patched") == 1234
    assert plantedsim.logged_kv_tokens(tmp_path, run, "stock") is None  # no log kept
    assert plantedsim.logged_kv_tokens(tmp_path, Run(), "patched") is None  # no servers recorded
    committed = ROOT / "experiments" / "results" / "h200-llama8b-confirm3"  # gzipped beside the name
    assert plantedsim.logged_kv_tokens(committed, read_run(committed), "patched") == 81920
