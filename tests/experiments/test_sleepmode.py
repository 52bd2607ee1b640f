"""--sleep-mode: which server is awake, switched through vLLM's sleep endpoints (loadgen's fake server has
them; the CPU build of vLLM has no sleep mode), the switches in run.json, a failed switch a clean stop,
and a run in which only the replayed arm's server is awake."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import pytest

from common.jsonfile import read_json
from experiments.core.schedule import Step
from experiments.runner import readiness, sizing, sleepmode
from experiments.runner import servers as run_servers
from experiments.runner.config import ConfigError, RunConfig, make_config
from experiments.runner.orchestrate import run_experiment
from experiments.runner.plan import Plan, prepare
from experiments.runner.replays import StopRun
from experiments.runner.runrecord import RunRecord, make_run_dir
from integration.endpoint import Endpoint
from integration.launcher import VllmServer
from loadgen.fakeserver import FakeServerConfig
from loadgen.records import read_records, succeeded
from tests.experiments.test_orchestrate import _fake_server, _trace
from tests.loadgen.serving import serving

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each


def asleep(server) -> bool:
    """What the server itself says (GET /is_sleeping), not what the kit thinks."""
    with urllib.request.urlopen(f"{server.url}/is_sleeping", timeout=5) as resp:
        return json.loads(resp.read())["is_sleeping"]


def post(server, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{server.url}{path}", method="POST", data=b""),
                           timeout=5).close()


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return make_config(_trace(tmp_path / "t.jsonl"), "cpu", windows=2, window_s=1.0, warmup_s=0.5,
                       loads=(1.0, 4.0), results_dir=tmp_path / "results", name="run", progress=False,
                       arms=("stock", "patched", "stock"), sleep_mode=True)


@pytest.fixture
def plan(cfg: RunConfig) -> Plan:
    return prepare(cfg)


@pytest.fixture
def record(cfg: RunConfig, plan: Plan) -> RunRecord:
    return RunRecord.create(make_run_dir(cfg), plan, None)


@pytest.fixture
def fakes() -> Iterator[dict[str, Endpoint]]:
    """Three fake servers, awake, as the kit sees a server (Endpoint: url, is_alive)."""
    with ExitStack() as stack:
        yield {label: Endpoint(label, stack.enter_context(serving(FakeServerConfig())))
               for label in ("a", "b", "c")}


def test_only_puts_the_awake_ones_to_sleep_and_wakes_the_arm(plan: Plan, record: RunRecord, fakes) -> None:
    awake = sleepmode.Awake(plan, record, 0.0)
    assert awake.start_awake == 1  # no GPU: one server starts at a time
    awake.only("b", fakes, "window 0 at load 1 on b")  # all three said they were awake
    assert [asleep(fakes[k]) for k in "abc"] == [True, False, True]
    awake.only("c", fakes, "window 0 at load 1 on c")
    assert [asleep(fakes[k]) for k in "abc"] == [True, True, False]
    awake.only("c", fakes, "window 1 at load 1 on c")  # already the one awake: nothing to switch
    first, second = record.run.sleep_mode["switches"]
    assert record.run.sleep_mode["level"] == 1
    assert (first["before"], first["slept"], first["woken"], first["wake_s"]) == (
        "window 0 at load 1 on b", ["a", "c"], None, None)
    assert (second["slept"], second["woken"]) == (["b"], "c")
    assert all(s > 0 for s in first["sleep_s"] + second["sleep_s"] + [second["wake_s"]])
    assert len(first["sleep_s"]) == 2 and first["at_s"] >= 0
    awake.sleep(["a", "c"], fakes, "the next start group")  # only c is awake of the two
    assert record.run.sleep_mode["switches"][-1]["slept"] == ["c"]
    assert all(asleep(f) for f in fakes.values())


def test_a_server_that_joins_asleep_is_woken_before_its_replay(plan: Plan, record: RunRecord, fakes) -> None:
    post(fakes["a"], "/sleep?level=1")
    awake = sleepmode.Awake(plan, record, 0.0)
    awake.only("a", {"a": fakes["a"]}, "the warm-up on a")
    assert not asleep(fakes["a"])
    assert [(s["slept"], s["woken"]) for s in record.run.sleep_mode["switches"]] == [([], "a")]


def test_a_wake_that_fails_names_the_server_and_the_status(plan: Plan, record: RunRecord) -> None:
    with serving(FakeServerConfig(wake_fails_after=0)) as url:
        server = {"b": Endpoint("b", url)}
        post(server["b"], "/sleep?level=1")
        awake = sleepmode.Awake(plan, record, 0.0)
        with pytest.raises(StopRun, match=r"^sleep mode: POST /wake_up on server b answered HTTP 500$"):
            awake.only("b", server, "window 0 at load 1 on b")


def test_a_server_without_sleep_mode_stops_the_run_cleanly(cfg: RunConfig, tmp_path: Path) -> None:
    servers = {label: _fake_server(tmp_path / f"{label}.log", sleep_mode=False)
               for label in ("stock", "patched", "stock-b")}  # handed in, started without the endpoints
    try:
        run = json.loads((run_experiment(cfg, servers=servers) / "run.json").read_text())
    finally:
        for s in servers.values():
            s.stop()
    assert run["status"] == "partial"
    why = r"\(started without --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1\?\)$"
    assert re.match(r"sleep mode: GET /is_sleeping on server (stock|patched|stock-b) answered HTTP 404 "
                    + why, run["stopped_reason"])


def test_without_sleep_mode_nothing_is_switched_or_recorded(cfg: RunConfig, tmp_path: Path) -> None:
    off = dataclasses.replace(cfg, sleep_mode=False, name="off")
    plan = prepare(off)
    record = RunRecord.create(make_run_dir(off), plan, None)
    with serving(FakeServerConfig(sleep_mode=False)) as url:  # no sleep endpoints: any call would fail
        server = {"a": Endpoint("a", url)}
        awake = sleepmode.Awake(plan, record, 0.0)
        awake.only("a", server, "the warm-up on a")
        awake.sleep(["a"], server, "the next start group")
    assert awake.start_awake is None and record.run.sleep_mode is None
    assert off.to_json()["sleep_mode"] is False


def test_servers_start_with_sleep_mode_on(cfg: RunConfig) -> None:
    arm = cfg.arm_definitions[0]
    on = run_servers.server_config(cfg, arm)
    assert "--enable-sleep-mode" in on.extra_args and ("VLLM_SERVER_DEV_MODE", "1") in on.extra_env
    off = run_servers.server_config(dataclasses.replace(cfg, sleep_mode=False), arm)
    assert "--enable-sleep-mode" not in off.extra_args and "VLLM_SERVER_DEV_MODE" not in dict(off.extra_env)
    assert run_servers.start_groups(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    assert run_servers.start_groups(["a", "b", "c"], None) == [["a", "b", "c"]]
    assert run_servers.start_groups([], None) == []


@pytest.mark.evidence
def test_the_memory_and_switch_constants_are_the_h100_start_cost_record() -> None:
    path = Path(__file__).resolve().parents[2] / "experiments/results/h100-llama8b-startcost/startcost.json"
    cost = read_json(path, 1, "start cost")
    cycles = cost["sleep_cycles"]
    asleep_mib = {c["used_mib_asleep"] - cost["used_mib"]["one"] for c in cycles}  # one awake, one asleep
    assert asleep_mib == {sizing.ASLEEP_BYTES >> 20}
    assert readiness.FIRST_SLEEP_S == pytest.approx(cycles[0]["sleep_s"], abs=0.05)
    later = statistics.median(c["sleep_s"] for c in cycles[1:])
    assert readiness.SWITCH_S == pytest.approx(later + max(c["wake_s"] for c in cycles), abs=0.01)


@pytest.mark.parametrize(("change", "message"), [
    ({"one_at_a_time": True, "knee_factors": None}, "--sleep-mode: not with --one-at-a-time"),
    ({"endpoints": tuple(f"http://127.0.0.1:{p}" for p in (1, 2, 3))}, "--sleep-mode: not with --endpoint"),
    ({"layout": "duet", "gpus": (0, 1, 2)}, "--sleep-mode: not with --layout duet"),
])
def test_sleep_mode_is_refused_where_it_cannot_switch(cfg: RunConfig, change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        dataclasses.replace(cfg, **change)


def _start_fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[str],
                 started: dict[str, VllmServer], **per_label: dict) -> None:
    """Every server the run starts is a fake server (with `per_label`'s knobs); each start is an event
    that lists the servers already started that are awake."""

    def start_fake(c: RunConfig, label: str, arm: str, run_dir: Path, cpus: tuple = ()) -> VllmServer:
        awake = sorted(k for k, s in started.items() if s.is_alive() and not asleep(s))
        events.append(f"start {label} awake={awake}")
        started[label] = _fake_server(tmp_path / f"{label}-{len(started)}.log", **per_label.get(label, {}))
        return started[label]

    monkeypatch.setattr("experiments.runner.servers.start_arm", start_fake)


def test_only_the_replayed_arm_s_server_is_awake(cfg: RunConfig, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    started: dict[str, VllmServer] = {}
    _start_fakes(tmp_path, monkeypatch, events, started)

    def watch(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        awake = [k for k in live if not asleep(live[k])]
        events.append(f"w{step.window}@{step.load:g} {label} awake={awake}")

    try:
        run_dir = run_experiment(cfg, before_replay=watch)
    finally:
        for s in started.values():
            s.stop()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete", run["stopped_reason"]
    # each server started once the ones before it had been warmed up and put to sleep
    assert sorted(events[:3]) == ["start patched awake=[]", "start stock awake=[]", "start stock-b awake=[]"]
    measured = events[3:]
    assert len(measured) == 2 * 2 * 3 and all(e.endswith(f"awake=['{e.split()[1]}']") for e in measured)
    switches = run["sleep_mode"]["switches"]
    group_ends = [s for s in switches if s["before"] == "the next start group"]
    assert [s["slept"] for s in group_ends] == [[e.split()[1]] for e in events[:3]]  # each in its turn
    assert all(s["sleep_s"] and all(x > 0 for x in s["sleep_s"]) for s in group_ends)
    for s in switches[3:]:  # after the starts, before each replay: the one awake put to sleep, the arm woken
        arm = s["before"].rsplit(" on ", 1)[1]
        assert s["woken"] == arm and s["wake_s"] > 0 and arm not in s["slept"] and len(s["slept"]) <= 1
    replays = run["replays"]  # burn-in and measured: the first wakes its arm, then each change of arm
    assert len(switches) - 3 == 1 + sum(a["arm"] != b["arm"] for a, b in zip(replays, replays[1:]))
    records = read_records(run_dir / "requests.jsonl.xz")
    assert all(succeeded(r) for r in records)  # none was sent to a sleeping server (it answers 503)
    assert {frozenset(r.tags) for r in records} == {frozenset({"arm", "window", "load", "phase"}),
                                                   frozenset({"arm", "window", "load", "phase", "burnin"})}
    assert Counter(r.tags["phase"] for r in records) == {"warmup": 3 * 2, "burnin": 3 * 4, "measure": 3 * 16}


def test_a_failed_wake_stops_the_run_with_one_record_per_replayed_request(
        cfg: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: dict[str, VllmServer] = {}
    _start_fakes(tmp_path, monkeypatch, [], started, patched={"wake_fails_after": 1})  # the burn-in's wake
    try:
        run_dir = run_experiment(cfg)
    finally:
        for s in started.values():
            s.stop()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "partial"
    assert run["stopped_reason"] == "sleep mode: POST /wake_up on server patched answered HTTP 500"
    done = {(e["window"], e["load"], lab) for e in run["schedule"] for lab in e["done"]}
    assert done and len(done) < 2 * 2 * 3
    counts = Counter((r.tags["window"], r.tags["load"], r.tags["arm"])
                     for r in read_records(run_dir / "requests.jsonl.xz") if r.tags["phase"] == "measure")
    requests = {w["id"]: w["requests"] for w in run["windows"]}
    assert counts == {key: requests[key[0]] for key in done}  # every replayed request once, nothing more
    assert (run_dir / "report.md").is_file()
