"""A duet on real vLLM CPU servers: 2 arms x 2 server slots (4 servers, the smallest settings), each
window replayed to both arms at once, the placement balanced, the report written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments.runner import cli as run_cli
from experiments.stats import duet
from loadgen.records import read_records

pytestmark = pytest.mark.server
TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def test_a_cpu_duet_replays_both_arms_at_once_balanced_and_reports_it(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    started = time.monotonic()
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--layout", "duet", "--gpus", "0,1",
                         "--windows", "2", "--window-s", "6", "--loads", "1", "--warmup-s", "3",
                         "--max-output-tokens", "16", "--results-dir", str(tmp_path), "--name", "duet",
                         "--no-progress"])
    print(f"duet run: {time.monotonic() - started:.0f} s")  # the run time, for the record (-s)
    assert code == 0, capsys.readouterr().err
    run_dir = tmp_path / "duet"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and run["layout"] == "duet"
    servers = run["servers"]
    assert sorted(servers) == ["patched@gpu0", "patched@gpu1", "stock@gpu0", "stock@gpu1"]
    assert {k: v["env"]["CUDA_VISIBLE_DEVICES"] for k, v in servers.items()} == {
        k: k[-1] for k in servers}
    assert len({v["port"] for v in servers.values()}) == 4
    sched = duet.from_record(run["duet"]["schedule"])
    assert run["duet"]["schedule"]["balance"] == {"stock": {"0": 1, "1": 1}, "patched": {"0": 1, "1": 1}}
    measured = [r for r in read_records(run_dir / "requests.jsonl.xz") if r.tags["phase"] == "measure"]
    assert {(r.tags["arm"], r.tags["gpu"]) for r in measured} == {
        (a, g) for a in ("stock", "patched") for g in (0, 1)}  # every arm served on both slots
    assert all(r.tags["gpu"] == sched[r.tags["window"]].gpu_of(r.tags["arm"]) for r in measured)
    t0 = {(e["arm"], e["window"]): e["t0_perf_ns"] for e in run["replays"] if e["phase"] == "measure"}
    for w in (0, 1):
        sends = {arm: [t0[(arm, w)] + r.sent_ns for r in measured if r.tags["arm"] == arm and
                       r.tags["window"] == w] for arm in ("stock", "patched")}
        assert len(sends["stock"]) == len(sends["patched"]) > 1
        (s, p) = sends.values()
        assert min(s) <= max(p) and min(p) <= max(s)  # the two arms' sends of a window overlap: at once
    report = json.loads((run_dir / "report.json").read_text())
    assert report["layout"]["name"] == "duet" and not report["missing"]
    assert report["paired_latency"]["patched"]["tpot_ms"]["covariate"] == "gpu"
    md = (run_dir / "report.md").read_text()
    assert "**Duet layout**" in md and "server slots" in md and "CUDA_VISIBLE_DEVICES" in md
