"""--endpoint on real vLLM CPU servers the test starts itself: the run starts none, measures both with
the same design, records what each said of itself, and stops as partial when one stops answering."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from experiments.core.schedule import Step
from experiments.runner.config import RunConfig, make_config
from experiments.runner.orchestrate import run_experiment
from integration.launcher import VllmServer
from tests.conftest import start_server, tiny_server_config

pytestmark = pytest.mark.server
TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


@pytest.fixture(scope="module")
def user_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    logs = tmp_path_factory.mktemp("user-servers")
    started = [start_server(tiny_server_config("stock"), logs / "first.log")]
    try:
        started.append(start_server(tiny_server_config("stock"), logs / "second.log"))
        yield started
    finally:
        for s in started:
            s.stop()


def _cfg(servers: list[VllmServer], results: Path, name: str) -> RunConfig:
    return make_config(TRACE, "cpu", arms=("stock", "mine"), endpoints=tuple(f"{s.url}/v1" for s in servers),
                       windows=2, window_s=6.0, loads=(1.0, 2.0), warmup_s=3.0, results_dir=results,
                       name=name, progress=False)


def test_endpoints_are_measured_like_started_servers(user_servers: list[VllmServer], tmp_path: Path) -> None:
    run_dir = run_experiment(_cfg(user_servers, tmp_path, "ends"))
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete", run["stopped_reason"]
    assert not list(run_dir.glob("server-*.log"))  # the kit started no server
    assert all(s.is_alive() for s in user_servers)  # and stopped none
    assert {lab: s["started_by"] for lab, s in run["servers"].items()} == {"stock": "user", "mine": "user"}
    assert [run["servers"][lab]["endpoint"] for lab in ("stock", "mine")] == [s.url for s in user_servers]
    assert all(e["done"] == e["order"] for e in run["schedule"]) and len(run["schedule"]) == 4
    assert {b["arm"] for b in run["replays"] if b["phase"] == "burnin"} == {"stock", "mine"}
    env = json.loads((run_dir / "environment.json").read_text())
    for lab in ("stock", "mine"):
        assert env["endpoints"][lab]["model"]["id"] == "tiny-llama"
        assert "vllm:cache_config_info" in env["endpoints"][lab]["metrics_info"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "complete" and not report["missing"]
    assert report["paired_latency"]["mine"]["tpot_ms"]["n_cells"] == 4
    assert "what the user declared" in report["arm_definitions"]["mine"]["identity"]
    md = (run_dir / "report.md").read_text()
    assert ("**Servers started by the user** — stock, mine" in md
            and "It said of itself: model tiny-llama" in md)


def test_an_endpoint_that_stops_answering_stops_the_run_as_partial(user_servers: list[VllmServer],
                                                                  tmp_path: Path) -> None:
    def stop_second(step: Step, label: str, live: Mapping) -> None:
        if step.window == 1 and label == "mine":
            user_servers[1].stop()

    run_dir = run_experiment(_cfg(user_servers, tmp_path, "dies"), before_replay=stop_second)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "partial"
    assert run["stopped_reason"].startswith(f"endpoint mine at {user_servers[1].url} no longer answers")
    assert "started outside the kit: no log here" in run["stopped_reason"]
    md = (run_dir / "report.md").read_text()
    assert md.startswith("# RMSNorm A/B goodput report (partial)")  # the first line says it
    assert md.index("**PARTIAL RUN**") < md.index("## Comparisons")
