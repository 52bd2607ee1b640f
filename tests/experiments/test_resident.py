"""--resident K: the runner swaps the servers of resident sets within every instance (stand-in servers),
the plan counts each swap as a start, and what cannot work is refused in one line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from experiments.core.schedule import Step
from experiments.runner import cli as run_cli
from experiments.runner import instances, resident
from experiments.runner.config import DEVICE_DEFAULTS, RunConfig
from experiments.runner.orchestrate import run_experiment
from integration.launcher import VllmServer
from loadgen.records import read_records
from tests.experiments.test_config import TRACE
from tests.experiments.test_orchestrate import _trace
from tests.experiments.test_placement import cfg, fake_starts  # noqa: F401 (fixtures)

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each


def test_sets_swap_within_every_instance_and_tag_each_record_with_its_instance(
        cfg: RunConfig, fake_starts: tuple[list[str], list[VllmServer]]) -> None:  # noqa: F811
    events, started = fake_starts
    up: list[tuple[int, str, set[str]]] = []

    def watch(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        up.append((step.window, label, {lab for lab, s in live.items() if s.is_alive()}))

    two = dataclasses.replace(cfg, arms=("stock", "patched", "stock"), resident=2, windows=4)
    run_dir = run_experiment(two, before_replay=watch, n_instances=2)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and not any(s.is_alive() for s in started)
    assert run["resident_sets"] == [["stock", "patched"], ["stock", "stock-b"]]
    assert run["config"]["resident"] == 2
    # window 0 on the first set, window 1 on the second (patched stopped, stock-b started), then again
    ab, aa = {"stock", "patched"}, {"stock", "stock-b"}
    sets = {0: ab, 1: aa, 2: ab, 3: aa}
    assert [(w, lab) for w, lab, _ in up] == [(e["window"], lab) for e in run["schedule"]
                                              for lab in e["order"]]
    assert all(live == sets[w] for w, _, live in up)  # never more than two servers up
    assert all(set(e["order"]) == sets[e["window"]] and e["set"] == e["window"] % 2 for e in run["schedule"])
    assert sorted(events[:2]) == ["patched", "stock"] and events[2] == "stock-b"  # instance 0, then its swap
    assert sorted(events[3:5]) == ["patched", "stock"] and events[5:] == ["stock-b"]  # instance 1 restarts
    assert {lab: s["starts"] for lab, s in run["servers"].items()} == {"stock": 2, "patched": 2, "stock-b": 2}
    assert {lab: [e["index"] for e in v] for lab, v in run["instances"]["arms"].items()} == {
        "stock": [0, 1], "patched": [0, 1], "stock-b": [0, 1]}
    assert run["instances"]["windows"] == [[0, 1], [2, 3]]
    burnins = [(b["window"], sorted(b["done"])) for b in run["burnin"]]  # every fresh server burnt in once
    assert burnins == [(0, ["patched", "stock"]), (1, ["stock-b"])] * 2
    records = read_records(run_dir / "requests.jsonl.xz")
    measured = [r for r in records if r.tags["phase"] == "measure"]
    assert {(r.tags["window"], r.tags["arm"]) for r in measured} == {(w, lab) for w, s in sets.items()
                                                                      for lab in s}
    assert all(r.tags["instance"] == r.tags["window"] // 2 for r in measured)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "complete" and report["missing"] == []  # no cell expected of an absent arm
    assert set(report["paired_latency"]) == {"patched", "stock-b"}
    assert report["design"]["not_measured_together"] == []  # both comparisons share the baseline's cells


@pytest.fixture
def gpu_default() -> RunConfig:
    return RunConfig(trace=TRACE, device="cuda", arms=("stock", "patched", "planted:3us", "stock"),
                     **{**DEVICE_DEFAULTS["cuda"], "resident": 2})


def test_each_swap_is_a_start_in_the_plan_and_the_design(gpu_default: RunConfig) -> None:
    sets = resident.sets(gpu_default)
    every = dataclasses.replace(gpu_default, resident=None)
    assert resident.start_waves_per_instance(every, resident.sets(every)) == 2  # stock-b, planted wait
    assert resident.start_waves_per_instance(gpu_default, sets) == 4  # two, then patched, then planted
    _, costs, _ = instances.prior(gpu_default)
    _, costs_every, _ = instances.prior(every)
    assert costs.start_min == pytest.approx(2 * costs_every.start_min)
    assert costs.arms == 2 and costs_every.arms == 4  # arms replaying each window
    assert instances.layout(gpu_default).sets == 3
    assert instances.layout(gpu_default).shared == pytest.approx(1 / 3)  # every compared pair: one set of 3
    assert instances.layout(every).shared == 1.0
    three = dataclasses.replace(gpu_default, resident=3)  # stock, patched, planted | stock, patched, stock-b
    assert resident.start_waves_per_instance(three, resident.sets(three)) == 3
    assert (instances.layout(three).sets, instances.layout(three).shared) == (2, 0.5)  # the twin, the A/A


def _main(tmp_path: Path, *flags: str) -> int:
    return run_cli.main(["--trace", str(_trace(tmp_path / "t.jsonl")), "--device", "cpu", "--results-dir",
                         str(tmp_path / "r"), "--no-progress", "--dry-run", "--warmup-s", "0.5", *flags])


@pytest.mark.parametrize(("flags", "message"), [
    (("--resident", "1"), "--resident must be an int >= 2 (one server at a time is --one-at-a-time)"),
    (("--resident", "2", "--one-at-a-time"), "--resident 2: not with --one-at-a-time"),
    (("--resident", "2", "--layout", "duet"), "--resident 2: not with --layout duet"),
    (("--resident", "2", "--endpoint", "stock=http://127.0.0.1:9", "--endpoint", "patched=http://127.0.0.1:10"),
     "--resident 2: not with --endpoint"),
    (("--resident", "2", "--arms", "stock,patched,stock", "--windows", "3", "--window-s", "1"),
     "--resident 2: --windows 3 does not split into 1 instance(s) x 2 resident sets (stock, patched | stock, "
     "stock-b), every set replaying the same number of windows: give a multiple of 2"),
])
def test_what_cannot_work_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, flags: tuple,
                                                 message: str) -> None:
    assert _main(tmp_path, *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_as_many_as_the_arms_is_every_arm_resident(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _main(tmp_path, "--arms", "stock,patched,stock", "--resident", "3", "--window-s", "1") == 0
    plan = json.loads(capsys.readouterr().out)
    assert "resident_sets" not in plan and all(len(e["order"]) == 3 for e in plan["schedule"])
