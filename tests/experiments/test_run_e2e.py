"""End to end on real vLLM CPU servers: a short default run completes; a knee search records every
factor it searched and why it stopped; a server killed mid-run stops it.

Both tests share one pair of servers (each CPU start costs tens of seconds on two cores); the
server-dies test kills one of them, so it runs last.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from experiments.core.schedule import Step
from experiments.core.slo import DEFAULT_SLO_FILE, load_slo_file, meets
from experiments.runner import hostprobe
from experiments.runner.config import RunConfig, make_config
from experiments.runner.orchestrate import run_experiment
from experiments.runner.servers import start_servers
from experiments.stats import knee
from experiments.stats.hostslow import HostSignals
from integration.launcher import VllmServer
from loadgen.records import lateness_ms, read_records

pytestmark = pytest.mark.server
REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "chat.jsonl"


@pytest.fixture(scope="module")
def short_cfg(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    """The embedded CPU default, shortened: 2 windows x 10 s at 1x (token counts clipped as by default)."""
    return make_config(TRACE, "cpu", windows=2, window_s=10.0, loads=(1.0,), warmup_s=5.0,
                       results_dir=tmp_path_factory.mktemp("results"), progress=False)


@pytest.fixture(scope="module")
def servers(short_cfg: RunConfig,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    started = start_servers(short_cfg, list(short_cfg.labels), tmp_path_factory.mktemp("server-logs"))
    yield started
    for s in started.values():
        s.stop()


def _run(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_short_default_run_completes_with_identical_requests_per_arm(
        short_cfg: RunConfig, servers: dict[str, VllmServer]) -> None:
    run_dir = run_experiment(dataclasses.replace(short_cfg, name="complete"), servers=servers)
    run = _run(run_dir)
    assert run["status"] == "complete" and run["stopped_reason"] is None
    assert run["mode_note"].startswith("A/A run")
    assert all(e["done"] == e["order"] for e in run["schedule"])
    assert not (run_dir / "requests.jsonl").exists()
    records = read_records(run_dir / "requests.jsonl.xz")
    measured = [r for r in records if r.tags["phase"] == "measure"]
    assert sum(r.tags["phase"] == "warmup" for r in records) == 2 * run["warmup"]["requests"]
    per_arm = {label: sorted((r.tags["window"], r.tags["load"], r.index, r.input_tokens, r.output_tokens)
                             for r in measured if r.tags["arm"] == label) for label in run["arm_labels"]}
    stock, patched = per_arm.values()
    assert stock == patched
    assert len(stock) == sum(w["requests"] for w in run["windows"]) * len(run["loads"])
    assert Counter(k[:3] for k in stock).most_common(1)[0][1] == 1  # one record per request per arm
    assert all(r.input_tokens <= 1024 and r.output_tokens <= 32 for r in records)
    for label in run["arm_labels"]:
        assert run["step_histograms"][label]["1.0"]["count"] > 0
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["trace"]["sha256"] == run["trace"]["sha256"] and env["cpu_count"] >= 1
    ok = [r for r in measured if r.error is None and (r.completion_tokens or 0) >= 2]
    assert ok and all(len(r.itl_us) == r.n_chunks - 1 for r in ok)  # every token chunk's gap kept
    report_md = (run_dir / "report.md").read_text()
    assert "A/A" in report_md.splitlines()[0]
    assert "| ITL p50 | p90 | p99 |" in report_md  # pooled inter-token latency beside TTFT and TPOT
    assert (run_dir / "report.json").is_file() and list(run_dir.glob("*.png"))
    _check_host_signals(run_dir, run, servers)


def _check_host_signals(run_dir: Path, run: dict, servers: Mapping[str, VllmServer]) -> None:
    """Every measured replay recorded /proc's signals of its server's engine core (vLLM's EngineCore
    child), and the report weighed each replay for a slow host episode."""
    measured = [e for e in run["replays"] if e["phase"] == "measure"]
    assert len(measured) == len(run["windows"]) * len(run["loads"]) * len(run["arm_labels"])
    engines = {}
    for e in measured:
        h = HostSignals.from_json(e["host"], f"replay {e}")
        assert h.span_s > 0 and h.cpus >= 1 and h.busy_s > 0 and h.steal_s >= 0 and h.loadavg_1m >= 0
        assert h.engine_cpu_s > 0 and h.server_cpu_s >= h.engine_cpu_s
        engines.setdefault(e["arm"], set()).add(h.engine_pid)
    for label, pids in engines.items():
        (pid,) = pids  # one engine core per server, the same over its replays
        assert pid in hostprobe.tree_ticks(servers[label].proc.pid) and pid != servers[label].proc.pid
        assert hostprobe.ENGINE_TITLE in hostprobe.title(pid)
    slow = json.loads((run_dir / "report.json").read_text())["slow_host"]
    assert slow["replays"] == len(measured) and slow["not_recorded"] == []
    assert "## Slow host episodes" in (run_dir / "report.md").read_text()


def test_a_knee_search_on_real_servers_records_every_factor_and_why_it_stopped(
        short_cfg: RunConfig, servers: dict[str, VllmServer]) -> None:
    # 5-s windows from 1x up to at most 8x; on two cores the server, the client or the maximum may
    # end the search: whichever did, run.json's record must be what the records and the rule give
    kneed = dataclasses.replace(short_cfg, name="knee", window_s=5.0, knee_factors=(1.0, 2.0), knee_max=8.0)
    run_dir = run_experiment(kneed, servers=servers)
    run, k = _run(run_dir), _run(run_dir)["knee"]
    assert run["status"] == "complete"
    assert k["factors"] == knee.possible_factors([1.0, 2.0], 8.0)[:len(k["factors"])]
    searched = [r for r in read_records(run_dir / "requests.jsonl.xz") if r.tags["phase"] == "knee"]
    slos = load_slo_file(DEFAULT_SLO_FILE)
    for j, (f, late) in enumerate(zip(k["factors"], k["lateness"], strict=True)):
        at = [r for r in searched if r.tags["load"] == f]
        sent = [[x for r in at if r.tags["window"] == w and (x := lateness_ms(r)) is not None]
                for w in k["windows"]]
        assert late == {"factor": f, **knee.lateness_figures(sent)}
        attainment = {s.name: sum(meets(r, s) for r in at) / len(at) for s in slos}
        assert {n: pts[j] for n, pts in k["points"].items()} == {n: [f, a] for n, a in attainment.items()}
        client = knee.client_late(late, k["lateness_target_ms"])
        step = knee.next_factor(f, attainment, client, [1.0, 2.0], 8.0)
        last = j == len(k["factors"]) - 1
        assert step == ((None, k["stopped"]["reason"]) if last else (k["factors"][j + 1], None))
    assert k["stopped"]["factor"] == k["factors"][-1]
    late = k["lateness"][-1]
    line = knee.stop_line(k["stopped"], late, k["lateness_target_ms"])
    assert line in (run_dir / "report.md").read_text()


def test_server_that_dies_mid_run_stops_it_as_partial_with_a_report(
        short_cfg: RunConfig, servers: dict[str, VllmServer]) -> None:
    killed: list[str] = []

    def kill_in_last_window(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        if step.window == 1 and not killed:  # kill the first arm of window 1 two seconds into its replay
            killed.append(label)
            pgid = os.getpgid(live[label].proc.pid)
            threading.Timer(2.0, os.killpg, (pgid, signal.SIGKILL)).start()

    run_dir = run_experiment(dataclasses.replace(short_cfg, name="dies"), servers=servers,
                             before_replay=kill_in_last_window)
    run = _run(run_dir)
    assert run["status"] == "partial"
    assert f"server {killed[0]} died" in run["stopped_reason"] and "window 1" in run["stopped_reason"]
    assert "server-" in run["stopped_reason"]  # the log tail is quoted
    assert [e["done"] for e in run["schedule"]] == [run["schedule"][0]["order"], []]
    assert (run_dir / "requests.jsonl.xz").is_file()
    report_md = (run_dir / "report.md").read_text()
    assert "partial" in report_md
