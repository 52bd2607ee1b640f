"""--instances 2 on real vLLM CPU servers: every arm restarted once, what each start cost and what its
log said of its KV cache, every record labelled with its instance (four server starts: about 7 minutes on
the 2-core machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.runner import cli as run_cli
from loadgen.records import read_records

pytestmark = pytest.mark.server
TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def test_two_instances_per_arm_on_real_servers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--arms", "stock,patched", "--aa", "none",
                         "--instances", "2", "--windows", "2", "--window-s", "6", "--loads", "1",
                         "--results-dir", str(tmp_path), "--name", "inst", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    run_dir = tmp_path / "inst"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and run["instances"]["windows"] == [[0], [1]]
    for label in ("stock", "patched"):
        entries = run["instances"]["arms"][label]
        assert [e["index"] for e in entries] == [0, 1] and all(e["ready_s"] > 1 for e in entries)
        assert len({e["pid"] for e in entries}) == 2
        assert all(e["kv_cache_tokens"] and e["engine_init_s"] for e in entries)  # read from the log
        assert "kv_cache_tokens" not in run["instances"]["differences"][label]  # the same explicit size
    records = read_records(run_dir / "requests.jsonl.xz")
    measured = {(r.tags["instance"], r.tags["window"]) for r in records if r.tags["phase"] == "measure"}
    assert measured == {(0, 0), (1, 1)}
    assert {r.tags["instance"] for r in records if r.tags["phase"] in ("warmup", "burnin")} == {0, 1}
