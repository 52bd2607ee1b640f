"""The duet's control flow against stand-in servers (loadgen's fake vLLM, one process per arm and GPU):
every cell replayed to both arms at once on the placement's servers, tagged and recorded."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.analyze import analyze_run
from experiments.runner import duetrun
from experiments.runner.config import RunConfig, make_config
from experiments.runner.orchestrate import run_experiment
from experiments.stats import duet
from integration.launcher import VllmServer
from loadgen.records import read_records
from tests.experiments.test_orchestrate import _fake_server, _trace

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return make_config(_trace(tmp_path / "t.jsonl"), "cpu", windows=4, window_s=1.0, warmup_s=0.5,
                       loads=(1.0, 4.0), results_dir=tmp_path / "results", name="duet", progress=False,
                       layout="duet", seed=3)


@pytest.fixture
def fakes(cfg: RunConfig, tmp_path: Path) -> Iterator[dict[str, VllmServer]]:
    servers = {key: _fake_server(tmp_path / f"fake-{key}.log") for key in duetrun.slot_keys(cfg)}
    yield servers
    for s in servers.values():
        s.stop()


def test_every_cell_goes_to_both_arms_at_once_on_the_placement_servers(
        cfg: RunConfig, fakes: dict[str, VllmServer]) -> None:
    run_dir = run_experiment(cfg, servers=fakes, analyze=False)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete", run["stopped_reason"]
    assert run["layout"] == "duet" and run["duet"]["gpus"] == [0, 1] and "server slots" in run["duet"]["note"]
    sched = duet.from_record(run["duet"]["schedule"])
    assert sched == duet.placements(("stock", "patched"), (0, 1), 4, seed=3)
    assert run["duet"]["schedule"]["balance"] == {"stock": {"0": 2, "1": 2}, "patched": {"0": 2, "1": 2}}
    assert all(e["done"] == ["stock", "patched"] for e in run["schedule"])
    records = read_records(run_dir / "requests.jsonl.xz")
    measured = [r for r in records if r.tags["phase"] == "measure"]
    for r in measured:  # every record names the GPU its placement gave its arm
        assert r.tags["gpu"] == sched[r.tags["window"]].gpu_of(r.tags["arm"])
    replays = {(e["arm"], e["window"], e["load"]): e for e in run["replays"] if e["phase"] == "measure"}
    for (arm, w, load), e in replays.items():
        gpu = sched[w].gpu_of(arm)
        assert e["server"] == duetrun.slot_key(arm, gpu) and e["port"] == fakes[e["server"]].config.port
    for w in range(4):
        for load in (1.0, 4.0):
            spans = {}
            for arm in ("stock", "patched"):
                t0 = replays[(arm, w, load)]["t0_perf_ns"]
                sent = [t0 + r.sent_ns for r in measured
                        if (r.tags["arm"], r.tags["window"], r.tags["load"]) == (arm, w, load)]
                spans[arm] = (min(sent), max(sent))
            (a0, a1), (b0, b1) = spans.values()
            assert a0 <= b1 and b0 <= a1  # the two arms' sends of a cell overlap in time: replayed at once
    # every server was warmed up and burnt in once (the Latin rows), with the gpu tag
    warm = Counter((r.tags["arm"], r.tags["gpu"]) for r in records if r.tags["phase"] == "warmup")
    burn = Counter((r.tags["arm"], r.tags["gpu"]) for r in records if r.tags["phase"] == "burnin")
    assert set(warm) == set(burn) == {(a, g) for a in ("stock", "patched") for g in (0, 1)}
    assert len(set(warm.values())) == 1 and len(set(burn.values())) == 1
    assert {k: (v["label"], v["gpu"]) for k, v in run["servers"].items()} == {
        duetrun.slot_key(a, g): (a, g) for a in ("stock", "patched") for g in (0, 1)}
    report = analyze_run(run_dir, draw_plots=False)
    assert report["layout"]["name"] == "duet"
    assert report["paired_latency"]["patched"]["tpot_ms"]["covariate"] == "gpu"
