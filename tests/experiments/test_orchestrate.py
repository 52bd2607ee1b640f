"""The run's control flow against stand-in servers (loadgen's fake vLLM, one process per arm): fast.

Covers what the real-server tests cannot afford: Ctrl-C, a window whose requests all fail, the
run.json record after each replay, and a missing /metrics recorded as a warning, not a crash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from experiments.core.schedule import Step
from experiments.runner.config import RunConfig, make_config
from experiments.runner.orchestrate import run_experiment
from experiments.stats import knee
from experiments.stats.runframe import load_run
from integration import arms
from integration.launcher import MODELS_DIR, ServerConfig, VllmServer, free_port
from loadgen.records import LATENESS_TARGET_P99_MS, lateness_ms, read_records

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each

LENIENT_MS = 1000.0  # a lateness target no replay here misses: the test is of what the attainment does
FAKE = "from loadgen.fakeserver import FakeServerConfig as C, serve_forever as s; s(C(**{kw}), {port})"


def _trace(path: Path) -> Path:
    """4 req/s for 6 s, short requests: windows of 1 s hold 4."""
    path.write_text("".join(f'{{"timestamp": {t * 0.25}, "input_tokens": 8, "output_tokens": 4}}\n'
                            for t in range(25)))
    return path


def _fake_server(log: Path, code: str = FAKE, **kw: object) -> VllmServer:
    """A VllmServer object whose process is loadgen's fake server (no /metrics, answers in ms), started
    by `code` (FAKE, formatted with `kw` and the port)."""
    port = free_port()
    stock = arms.get("stock")
    server = VllmServer(ServerConfig(model_dir=MODELS_DIR / "tiny-llama", arm=stock, port=port), log)
    server.proc = subprocess.Popen([sys.executable, "-c", code.format(kw=kw, port=port)],
                                   stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    server.model_name = "fake-model"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{server.url}/v1/models", timeout=1).close()
            return server
        except OSError:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                server.stop()
                raise RuntimeError(f"fake server did not come up: {log.read_text()}")
            time.sleep(0.1)


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return make_config(_trace(tmp_path / "t.jsonl"), "cpu", windows=2, window_s=1.0, warmup_s=0.5,
                       loads=(1.0, 4.0), results_dir=tmp_path / "results", name="run", progress=False)


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[dict[str, VllmServer]]:
    servers = {label: _fake_server(tmp_path / f"fake-{label}.log") for label in ("stock", "patched")}
    yield servers
    for s in servers.values():
        s.stop()


def _run(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_complete_run_records_every_replay(cfg: RunConfig, fakes: dict[str, VllmServer]) -> None:
    seen: list[tuple[int, float, str, list]] = []

    def watch(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        done = [e["done"] for e in _run(cfg.results_dir / "run")["schedule"]]
        seen.append((step.window, step.load, label, done))

    run = _run(run_experiment(cfg, servers=fakes, before_replay=watch))
    assert run["status"] == "complete"
    assert [(w, ld, lab) for w, ld, lab, _ in seen] == [
        (e["window"], e["load"], lab) for e in run["schedule"] for lab in e["order"]]
    assert Counter(tuple(e["order"]) for e in run["schedule"] if e["load"] == 1.0) == {
        ("stock", "patched"): 1, ("patched", "stock"): 1}  # balanced at each load
    # run.json is saved after each replay
    assert seen[3][3][:2] == [run["schedule"][0]["order"], run["schedule"][1]["order"][:1]]
    assert run["order"] == {"method": "randomised balanced per load (experiments.core.schedule)", "seed": 0}
    assert run["step_histograms"] == {}
    assert any("/metrics" in w for w in run["warnings"])
    # burn-in: window 0 at the highest load on both (handed-in, not yet burnt-in) servers, then measured
    burnin = [(b["window"], b["load"], sorted(b["done"])) for b in run["burnin"]]
    assert burnin == [(0, 4.0, ["patched", "stock"])]
    assert [r["phase"] for r in run["replays"]] == ["burnin"] * 2 + ["measure"] * 8
    assert all(r["gpu"] is None and r["wall_s"] > 0 for r in run["replays"])  # no GPU here
    records = read_records(cfg.results_dir / "run" / "requests.jsonl.xz")
    phases = Counter(r.tags["phase"] for r in records)
    assert phases == {"warmup": 2 * 2, "burnin": 2 * 4, "measure": 2 * 2 * (4 + 4)}
    assert {r.tags["load"] for r in records if r.tags["phase"] == "warmup"} == {4.0}  # the highest load
    assert all(fakes[s].is_alive() for s in fakes)  # servers handed in are left running
    report = json.loads((cfg.results_dir / "run" / "report.json").read_text())
    assert report["records"]["burnin_excluded"] == 8 and report["burnin"][0]["load"] == 4.0


def test_interleaved_aa_arm_runs_in_the_same_schedule(cfg: RunConfig, fakes: dict[str, VllmServer],
                                                      tmp_path: Path) -> None:
    three = dataclasses.replace(cfg, arms=("stock", "patched", "stock"), windows=2)
    servers = {**fakes, "stock-b": _fake_server(tmp_path / "fake-stock-b.log")}
    try:
        run = _run(run_experiment(three, servers=servers))
    finally:
        servers["stock-b"].stop()
    assert run["status"] == "complete" and run["arm_labels"] == ["stock", "patched", "stock-b"]
    assert all(sorted(e["done"]) == ["patched", "stock", "stock-b"] for e in run["schedule"])
    report = json.loads((cfg.results_dir / "run" / "report.json").read_text())
    assert report["comparison"] == ["stock", "patched"]
    assert report["noise_floor"]["source"] == "this run: stock-b vs stock (interleaved)"
    assert set(report["paired_latency"]) == {"patched", "stock-b"}


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)  # the handler raises in this thread before the sleep ends


def _sighup() -> None:  # a closed terminal
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(1)


def _sigterm_mid_replay() -> None:
    threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGTERM)).start()  # 0.4 s into a 1-s replay


@pytest.mark.parametrize("stop", [_ctrl_c, _sigterm, _sighup, _sigterm_mid_replay])
def test_ctrl_c_or_sigterm_stops_the_run_as_partial(cfg: RunConfig, fakes: dict[str, VllmServer],
                                                    stop) -> None:
    def interrupt(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        if step.window == 1:
            stop()

    previous = signal.getsignal(signal.SIGTERM)
    run = _run(run_experiment(cfg, servers=fakes, before_replay=interrupt))
    assert signal.getsignal(signal.SIGTERM) is previous
    assert run["status"] == "partial"
    assert run["stopped_reason"].startswith("interrupted (Ctrl-C, SIGTERM or SIGHUP) in window 1 at load 1 "
                                            "on patched")
    assert [bool(e["done"]) for e in run["schedule"]] == [True, True, False, False]
    assert (cfg.results_dir / "run" / "report.md").is_file()


def test_window_whose_requests_all_fail_stops_the_run(cfg: RunConfig, tmp_path: Path) -> None:
    good = _fake_server(tmp_path / "good.log")
    bad = _fake_server(tmp_path / "bad.log", max_model_len=4)  # every prompt is too long: HTTP 400
    try:
        run = _run(run_experiment(cfg, servers={"stock": good, "patched": bad}))
    finally:
        good.stop()
        bad.stop()
    assert run["status"] == "partial"
    assert "requests of the warm-up failed on patched" in run["stopped_reason"]
    assert "HTTP 400" in run["stopped_reason"] or "400" in run["stopped_reason"]


def test_handed_in_servers_need_both_labels(cfg: RunConfig, fakes: dict[str, VllmServer]) -> None:
    with pytest.raises(ValueError, match="every label"):
        run_experiment(cfg, servers={"stock": fakes["stock"]})
    assert not (cfg.results_dir / "run").exists()


def test_existing_run_directory_is_never_overwritten(cfg: RunConfig) -> None:
    (cfg.results_dir / "run").mkdir(parents=True)
    (cfg.results_dir / "run" / "run.json").write_text("{}")
    with pytest.raises(ValueError, match="already exists"):
        run_experiment(cfg)


def test_one_at_a_time_restarts_arms_per_block(cfg: RunConfig, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[VllmServer] = []
    events: list[str] = []

    def start_fake(c: RunConfig, label: str, arm: str, run_dir: Path, cpus: tuple = ()) -> VllmServer:
        events.append(f"start {label}")
        started.append(_fake_server(tmp_path / f"{label}-{len(started)}.log"))
        return started[-1]

    def watch(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        events.append(f"w{step.window}@{step.load:g} {label} "
                      f"up={sorted(k for k, s in live.items() if s.is_alive())}")

    monkeypatch.setattr("experiments.runner.servers.start_arm", start_fake)
    one = dataclasses.replace(cfg, one_at_a_time=True, blocks=2, loads=(1.0,))
    try:
        run = _run(run_experiment(one, before_replay=watch))
    finally:
        for s in started:
            s.stop()
    assert run["status"] == "complete" and run["resident"] is False
    assert events == ["start stock", "w0@1 stock up=['stock']",
                      "start patched", "w0@1 patched up=['patched']",
                      "w1@1 patched up=['patched']", "start stock", "w1@1 stock up=['stock']"]  # BA reuses B
    assert [e["block"] for e in run["schedule"]] == [0, 1]
    assert run["servers"]["stock"]["starts"] == 2 and not any(s.is_alive() for s in started)


def test_knee_search_chooses_the_loads_measured(cfg: RunConfig, fakes: dict[str, VllmServer],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # the fake servers answer in ms at any load: make every SLO fail above 3x, so the knee is at 2.2x
    monkeypatch.setattr("experiments.runner.kneesearch.meets", lambda r, slo: r.tags["load"] < 3)
    kneed = dataclasses.replace(cfg, knee_factors=(1.0, 2.0, 4.0, 8.0), windows=2,
                                knee_lateness_ms=LENIENT_MS)
    run = _run(run_experiment(kneed, servers=fakes))
    assert run["status"] == "complete"
    k = run["knee"]
    assert [f for f, _ in k["points"]["interactive"]] == [1.0, 2.0, 4.0]  # stopped once every tier failed
    assert k["tier"] == "interactive" and k["knee"] == pytest.approx(2.2) and k["loads"] == [1.0, 1.8, 2.8]
    assert run["loads"] == [1.0, 1.8, 2.8] and {e["load"] for e in run["schedule"]} == {1.0, 1.8, 2.8}
    assert all(sorted(e["done"]) == ["patched", "stock"] for e in run["schedule"])
    # the burn-in follows the search, at the highest load it chose, so it pairs with a measured cell
    phases = [r["phase"] for r in run["replays"]]
    assert phases[:3] == ["knee"] * 3 and "burnin" not in phases[:phases.index("measure") - 2]
    assert [(b["window"], b["load"]) for b in run["burnin"]] == [(0, 2.8)]
    report = json.loads((cfg.results_dir / "run" / "report.json").read_text())
    assert report["burnin"] and all(b["tpot_p50_ms_vs_measured_pct"] is not None for b in report["burnin"])
    records = read_records(cfg.results_dir / "run" / "requests.jsonl.xz")
    assert {r.tags["arm"] for r in records if r.tags["phase"] == "knee"} == {"stock"}
    counts = [w["requests"] for w in run["windows"]]
    searched = {r.tags["window"] for r in records if r.tags["phase"] == "knee"}
    assert searched == set(knee.search_windows(counts))
    assert k["windows"] == knee.search_windows(counts)
    md = (cfg.results_dir / "run" / "report.md").read_text()
    assert "## Knee search" in md and "Measured at 1x, 1.8x, 2.8x: around the interactive knee (2.2x)" in md


def test_knee_search_goes_past_its_list_while_every_tier_is_met(cfg: RunConfig, fakes: dict[str, VllmServer],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # every SLO met below 5x: the listed 1x and 2x meet everything, so the search goes on at 3x, 4.5x
    # (met) and 6.8x (every tier fails), and the knee lies between 4.5x and 6.8x
    monkeypatch.setattr("experiments.runner.kneesearch.meets", lambda r, slo: r.tags["load"] < 5)
    kneed = dataclasses.replace(cfg, knee_factors=(1.0, 2.0), windows=2, knee_lateness_ms=LENIENT_MS)
    run = _run(run_experiment(kneed, servers=fakes))
    k = run["knee"]
    assert k["listed"] == [1.0, 2.0] and k["factors"] == [1.0, 2.0, 3.0, 4.5, 6.8]
    assert [f for f, _ in k["points"]["interactive"]] == k["factors"]
    assert [e["factor"] for e in k["lateness"]] == k["factors"] and k["max_factor"] == 64.0
    assert k["stopped"] == {"reason": "knee", "factor": 6.8}
    assert k["tier"] == "interactive" and 4.5 < k["knee"] < 6.8 and k["loads"][0] == 1.0
    md = (cfg.results_dir / "run" / "report.md").read_text()
    assert "searched on at 3x, 4.5x, 6.8x" in md and "The search stopped at 6.8x: a tier's attainment" in md


def test_knee_search_stops_at_its_maximum_factor_with_every_tier_met(cfg: RunConfig,
                                                                      fakes: dict[str, VllmServer]) -> None:
    # the fake servers answer in ms: every tier is met at every factor, up to --knee-max
    kneed = dataclasses.replace(cfg, knee_factors=(1.0, 2.0), knee_max=4.0, windows=2,
                                knee_lateness_ms=LENIENT_MS)
    run = _run(run_experiment(kneed, servers=fakes))
    k = run["knee"]
    assert k["factors"] == [1.0, 2.0, 3.0, 4.0] and k["stopped"] == {"reason": "maximum", "factor": 4.0}
    assert k["loads"] is None and run["loads"] == [1.0, 4.0]  # no knee: measured at --loads
    md = (cfg.results_dir / "run" / "report.md").read_text()
    assert "The search stopped at its maximum factor, 4x (--knee-max), with every tier still met." in md


def _burst_trace(path: Path, n: int = 300) -> Path:
    """A few requests in the warm-up stretch, then `n` requests due at one instant in each of two
    windows of 1 s from 0.5 s: more than a client can send within its 2-ms lateness target at any
    speed-up."""
    line = '{{"timestamp": {t}, "input_tokens": 8, "output_tokens": 4}}\n'
    path.write_text("".join(line.format(t=t) for t in [0.1, 0.2] + [0.6] * n + [1.6] * n + [2.6]))
    return path


def test_knee_search_stops_where_the_client_sends_late_and_says_so(tmp_path: Path,
                                                                    fakes: dict[str, VllmServer]) -> None:
    burst = make_config(_burst_trace(tmp_path / "burst.jsonl"), "cpu", windows=2, window_s=1.0,
                        warmup_s=0.5, loads=(1.0,), knee_factors=(1.0, 2.0), results_dir=tmp_path / "results",
                        name="burst", progress=False)
    run_dir = run_experiment(burst, servers=fakes)
    k = _run(run_dir)["knee"]
    assert k["factors"] == [1.0] and k["stopped"] == {"reason": "client", "factor": 1.0}
    assert k["lateness_target_ms"] == LATENESS_TARGET_P99_MS and k["loads"] is None
    searched = [r for r in read_records(run_dir / "requests.jsonl.xz") if r.tags["phase"] == "knee"]
    per_window = [[lateness_ms(r) for r in searched if r.tags["window"] == w] for w in (0, 1)]
    assert k["lateness"] == [{"factor": 1.0, **knee.lateness_figures(per_window)}]
    assert k["lateness"][0]["median_replay_p99_ms"] > LATENESS_TARGET_P99_MS
    md = (run_dir / "report.md").read_text()
    assert "**The client limited the knee search** — its replays at 1x were sent late" in md
    assert "The client, not the server, is the limit: at 1x the knee search's replays were sent late" in md


def test_knee_needs_resident_servers(cfg: RunConfig) -> None:
    with pytest.raises(ValueError, match="--knee needs resident servers"):
        dataclasses.replace(cfg, knee_factors=(1.0, 2.0), one_at_a_time=True)
    with pytest.raises(ValueError, match="--knee must be two or more increasing"):
        dataclasses.replace(cfg, knee_factors=(2.0, 1.0))


def test_instances_restart_every_arm_between_blocks(cfg: RunConfig, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[VllmServer] = []
    events: list[str] = []

    def start_fake(c: RunConfig, label: str, arm: str, run_dir: Path, cpus: tuple = ()) -> VllmServer:
        events.append(f"start {label}")
        started.append(_fake_server(tmp_path / f"{label}-{len(started)}.log"))
        return started[-1]

    def watch(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        events.append(f"w{step.window}")

    monkeypatch.setattr("experiments.runner.servers.start_arm", start_fake)
    run_dir = run_experiment(cfg, before_replay=watch, n_instances=2)
    run = _run(run_dir)
    assert run["status"] == "complete" and not any(s.is_alive() for s in started)
    first = events[:2]
    assert sorted(first) == ["start patched", "start stock"]
    assert events[2:6] == ["w0"] * 4 and events[6:8] == first and events[8:] == ["w1"] * 4  # same order
    assert {lab: s["starts"] for lab, s in run["servers"].items()} == {"stock": 2, "patched": 2}
    inst = run["instances"]
    assert inst["count"] == 2 and set(inst["arms"]) == {"stock", "patched"} and inst["windows"] == [[0], [1]]
    for entries in inst["arms"].values():
        assert [e["index"] for e in entries] == [0, 1]
        assert all(e["ready_s"] > 0 and e["pid"] and "gpu_state" in e for e in entries)
        assert entries[0]["pid"] != entries[1]["pid"]
    assert all("port" in d for d in inst["differences"].values())  # a fresh port each start
    assert [b["done"] for b in run["burnin"]] and len(run["burnin"]) == 2  # each instance burnt in
    records = read_records(run_dir / "requests.jsonl.xz")
    assert {r.tags["instance"] for r in records} == {0, 1}
    assert all(r.tags["instance"] == r.tags["window"] for r in records if r.tags["phase"] == "measure")
    unmeasured = Counter((r.tags["phase"], r.tags["instance"]) for r in records
                         if r.tags["phase"] != "measure")
    assert unmeasured == {("warmup", 0): 2 * 2, ("warmup", 1): 2 * 2,  # 2 arms x 2 requests
                          ("burnin", 0): 2 * 4, ("burnin", 1): 2 * 4}
    measured = Counter((r.tags["arm"], r.tags["window"], r.tags["load"], r.index)
                       for r in records if r.tags["phase"] == "measure")
    scheduled = {(lab, w["id"], ld, i) for lab in ("stock", "patched") for w in run["windows"]
                 for ld in run["loads"] for i in range(w["requests"])}
    assert set(measured) == scheduled and set(measured.values()) == {1}  # one record per request
    assert run["analysis_error"] is None and (run_dir / "report.json").is_file()
    df = load_run(run_dir)
    measured_df = df[df["phase"] == "measure"]
    assert measured_df.groupby("instance")["window"].agg(set).to_dict() == {0: {0}, 1: {1}}


def test_one_instance_leaves_records_and_run_json_as_they_were(cfg: RunConfig,
                                                                fakes: dict[str, VllmServer]) -> None:
    run_dir = run_experiment(cfg, servers=fakes, analyze=False)
    assert _run(run_dir)["instances"] is None and _run(run_dir)["instance_design"] is None
    assert all("instance" not in r.tags for r in read_records(run_dir / "requests.jsonl.xz"))


@pytest.mark.parametrize(("change", "n", "message"), [
    ({}, 3, "--windows 2 is not a multiple"),
    ({"one_at_a_time": True, "blocks": 1}, 2, "give --blocks 2"),
    ({}, 0, "must be 1 or more"),
])
def test_instances_refused_before_a_server_starts(cfg: RunConfig, change: dict, n: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_experiment(dataclasses.replace(cfg, **change), n_instances=n)
    assert not (cfg.results_dir / "run").exists()
