"""--pin-cpus and --start-order: the core split, the rotated start order at every instance, the server
process on its cores, and the refusals; --knee none."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from experiments.core.schedule import Step
from experiments.runner import cli as run_cli
from experiments.runner import placement
from experiments.runner.config import ConfigError, RunConfig, make_config
from experiments.runner.flagtypes import knee_list
from experiments.runner.orchestrate import run_experiment
from integration import arms
from integration.launcher import MODELS_DIR, ServerConfig, VllmServer, free_port
from loadgen.records import read_records
from tests.experiments.test_orchestrate import _fake_server, _trace

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return make_config(_trace(tmp_path / "t.jsonl"), "cpu", windows=2, window_s=1.0, warmup_s=0.5,
                       loads=(1.0,), results_dir=tmp_path / "results", name="run", progress=False,
                       arms=("stock", "stock", "stock"))


@pytest.fixture
def fake_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[VllmServer]]:
    """Every server the run starts is loadgen's fake server: (the labels in start order, the servers)."""
    events: list[str] = []
    started: list[VllmServer] = []

    def start_fake(c: RunConfig, label: str, arm: str, run_dir: Path, cpus: tuple = ()) -> VllmServer:
        events.append(label)
        started.append(_fake_server(tmp_path / f"{label}-{len(started)}.log"))
        return started[-1]

    monkeypatch.setattr("experiments.runner.servers.start_arm", start_fake)
    return events, started


def test_split_gives_every_server_its_own_cores_and_the_kit_the_rest() -> None:
    split = placement.split_cores(["a", "b", "c", "d"], range(16))
    assert split == {"a": (0, 1, 2), "b": (3, 4, 5), "c": (6, 7, 8), "d": (9, 10, 11),
                     placement.KIT: (12, 13, 14, 15)}
    two = placement.split_cores(["a", "b"], [7, 3, 5, 1, 9])  # in core order, whatever order given
    assert two == {"a": (1,), "b": (3,), placement.KIT: (5, 7, 9)}
    with pytest.raises(ConfigError, match="--pin-cpus: 2 cores cannot give each of 2 servers"):
        placement.split_cores(["a", "b"], [0, 1])


def test_rotate_changes_who_starts_first_waves_does_not() -> None:
    order = ("a", "b", "c")
    assert [placement.rotated(order, i, "rotate") for i in range(4)] == [
        ("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"), ("a", "b", "c")]
    assert {placement.rotated(order, i, "waves") for i in range(3)} == {order}


def test_plan_refuses_what_it_cannot_place(cfg: RunConfig) -> None:
    assert placement.placement_for(cfg).cpus == {}  # off by default: nothing pinned
    pinned = placement.placement_for(dataclasses.replace(cfg, pin_cpus=True), cores=range(8))
    assert pinned.of("stock-a") == (0, 1) and pinned.of(placement.KIT) == (6, 7)
    duet = dataclasses.replace(cfg, layout="duet", gpus=(0, 1, 2), start_order="rotate")
    with pytest.raises(ConfigError, match="--start-order rotate: not with --layout duet"):
        placement.placement_for(duet, 2)
    rotate = dataclasses.replace(cfg, start_order="rotate")
    assert placement.placement_for(rotate, 2).start_order == "rotate"
    with pytest.raises(ConfigError, match="not with one server instance per arm .* --instances 2"):
        placement.placement_for(rotate)  # it would start once: nothing to rotate
    with pytest.raises(ConfigError, match="not with --one-at-a-time"):
        placement.placement_for(dataclasses.replace(rotate, one_at_a_time=True), 2)
    with pytest.raises(ConfigError, match="--start-order must be one of"):
        dataclasses.replace(cfg, start_order="random")


def test_the_run_record_holds_the_flags_on_or_off(cfg: RunConfig) -> None:
    off = cfg.to_json()
    assert off["pin_cpus"] is False and off["start_order"] == "waves"
    on = dataclasses.replace(cfg, pin_cpus=True, start_order="rotate").to_json()
    assert on["pin_cpus"] is True and on["start_order"] == "rotate"


def test_knee_none_measures_at_the_loads(tmp_path: Path) -> None:
    assert knee_list("none") == () and knee_list("5,8") == (5.0, 8.0)
    cfg = make_config(_trace(tmp_path / "t.jsonl"), "cpu", knee_factors=())
    assert cfg.knee_factors is None


def test_a_pinned_server_process_runs_on_its_cores(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    server = VllmServer(ServerConfig(model_dir=MODELS_DIR / "tiny-llama", arm=arms.get("stock"),
                                     port=free_port(), cpus=(core,)), tmp_path / "server.log")
    server.start()
    try:
        assert os.sched_getaffinity(server.proc.pid) == {core}  # set before vLLM's code runs
    finally:
        server.stop()


def test_pinned_restores_the_kit_s_own_cores() -> None:
    before = os.sched_getaffinity(0)
    with placement.pinned([min(before)]):
        assert os.sched_getaffinity(0) == {min(before)}
    assert os.sched_getaffinity(0) == before


def test_rotate_starts_a_different_server_first_at_every_instance(
        cfg: RunConfig, fake_starts: tuple[list[str], list[VllmServer]]) -> None:
    events, started = fake_starts

    def watch(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        events.append(f"w{step.window}")

    rotate = dataclasses.replace(cfg, start_order="rotate")
    run = json.loads((run_experiment(rotate, before_replay=watch, n_instances=2, analyze=False)
                      / "run.json").read_text())
    assert run["status"] == "complete" and not any(s.is_alive() for s in started)
    first, second = run["placement"]["starts"]  # the first start in the first window's arm order
    assert sorted(first) == ["stock-a", "stock-b", "stock-c"] and second == first[1:] + first[:1]
    assert [e for e in events if not e.startswith("w")] == first + second  # started in that order
    assert run["placement"]["pin_cpus"] == {} and run["placement"]["start_order"] == "rotate"


@pytest.mark.parametrize(("flags", "message"), [
    (("--endpoint", "stock=http://127.0.0.1:9", "--endpoint", "patched=http://127.0.0.1:10", "--pin-cpus"),
     "--pin-cpus: not with --endpoint"),
    (("--layout", "duet", "--start-order", "rotate"), "--start-order rotate: not with --layout duet"),
    (("--start-order", "rotate"), "--start-order rotate: not with one server instance per arm"),
])
def test_cli_refuses_placement_it_cannot_do_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        flags: tuple, message: str) -> None:
    code = run_cli.main(["--trace", str(_trace(tmp_path / "t.jsonl")), "--device", "cpu", *flags,
                         "--results-dir", str(tmp_path), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_one_at_a_time_instances_start_every_arm_afresh_in_every_block(
        cfg: RunConfig, fake_starts: tuple[list[str], list[VllmServer]]) -> None:
    events, started = fake_starts
    one = dataclasses.replace(cfg, arms=("stock", "patched"), one_at_a_time=True, blocks=2)
    run_dir = run_experiment(one, n_instances=2, analyze=False)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and not any(s.is_alive() for s in started)
    assert sorted(events) == ["patched", "patched", "stock", "stock"]  # none carried into the next block
    assert run["instances"]["windows"] == [[0], [1]]
    blocks = {e["window"]: e["block"] for e in run["schedule"]}
    measured = [r for r in read_records(run_dir / "requests.jsonl.xz") if r.tags["phase"] == "measure"]
    assert measured and all(r.tags["instance"] == blocks[r.tags["window"]] for r in measured)
    assert {lab: [e["index"] for e in v] for lab, v in run["instances"]["arms"].items()} == {
        "stock": [0, 1], "patched": [0, 1]}


@pytest.mark.evidence
def test_the_report_says_where_the_servers_sat() -> None:
    results = Path(__file__).resolve().parents[2] / "experiments" / "results"
    pin = (results / "h100-aa3-pin" / "report.md").read_text()
    assert "on cores of its own (stock-a 0-3; stock-b 4-7; stock-c 8-11; kit 12-15)" in pin
    rotate = (results / "h100-aa3-rotate" / "report.md").read_text()
    assert "start order rotate (starts: stock-b, stock-c, stock-a / stock-c, stock-a, stock-b / " in rotate
    assert "Placement:" not in (results / "h100-aa3-baseline" / "report.md").read_text()
