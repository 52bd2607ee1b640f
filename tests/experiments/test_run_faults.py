"""How a run ends when it cannot end as planned: Ctrl-C again while its servers stop, a full disk,
SIGTERM during its analysis. Against fake servers (loadgen's); no server outlives the run, run.py
ends in one line with exit status 1, and what the run leaves says how to finish it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from experiments.core.schedule import Step
from experiments.runner import cli as run_cli
from experiments.runner.config import RunConfig, make_config
from experiments.runner.orchestrate import run_experiment
from integration.launcher import VllmServer
from loadgen.fakeserver import FakeServerConfig
from loadgen.records import read_whole_records
from tests.experiments.test_orchestrate import _fake_server, _trace
from tests.loadgen.serving import serving
from tests.mounts import tmpfs

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each

REPO = Path(__file__).resolve().parents[2]
FAST = FakeServerConfig(ttft_s=0.001, itl_s=0.001, model="tiny-llama")
# a server that, asked to stop (SIGTERM), goes on serving while the user presses Ctrl-C again (SIGINT
# to the run, its parent)
SLOW_TO_STOP = ("import os, signal; from aiohttp import web; "
                "from loadgen.fakeserver import FakeServerConfig, make_app; "
                "signal.signal(signal.SIGTERM, lambda *a: os.kill(os.getppid(), signal.SIGINT)); "
                "web.run_app(make_app(FakeServerConfig()), host='127.0.0.1', port={port}, "
                "handle_signals=False, print=None, access_log=None)")


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return make_config(_trace(tmp_path / "t.jsonl"), "cpu", windows=2, window_s=1.0, warmup_s=0.5,
                       loads=(1.0, 4.0), results_dir=tmp_path / "results", name="run", progress=False)


def _group_gone(server: VllmServer) -> bool:
    try:
        os.killpg(server.proc.pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ctrl_c_again_while_the_servers_stop_kills_them_all_and_the_run_ends_whole(
        cfg: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[VllmServer] = []

    def start_slow_to_stop(c: RunConfig, label: str, arm: str, run_dir: Path, cpus: tuple = ()) -> VllmServer:
        started.append(_fake_server(tmp_path / f"{label}.log", SLOW_TO_STOP))
        return started[-1]

    def ctrl_c(step: Step, label: str, live: Mapping[str, VllmServer]) -> None:
        if step.window == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr("experiments.runner.servers.start_arm", start_slow_to_stop)
    try:
        run_dir = run_experiment(cfg, before_replay=ctrl_c)
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C escaped the run while its servers stopped")
    finally:
        orphans = [s for s in started if not _group_gone(s)]
        for s in orphans:
            os.killpg(s.proc.pid, signal.SIGKILL)
    assert len(started) == 2 and orphans == []
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "partial" and run["stopped_reason"].startswith("interrupted")
    assert any(w.startswith("SIGINT while the run was closing") for w in run["warnings"])
    assert (run_dir / "requests.jsonl.xz").is_file() and not (run_dir / "requests.jsonl").exists()
    assert "python -m experiments.analyze" in run["analysis_error"] and not (run_dir / "report.md").exists()


def test_a_full_disk_under_a_run_ends_in_one_line_with_the_records_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t * 0.05}, "input_tokens": 8, "output_tokens": 4}}\n'
                             for t in range(200)))
    with tmpfs(tmp_path / "small", "size=64k") as small, serving(FAST) as a, serving(FAST) as b:
        code = run_cli.main(["--trace", str(trace), "--device", "cpu", "--endpoint", f"stock={a}",
                             "--endpoint", f"patched={b}", "--windows", "2", "--window-s", "2",
                             "--warmup-s", "0.5", "--loads", "1,4", "--results-dir", str(small),
                             "--name", "run", "--no-progress"])
        run_dir = small / "run"
        records, torn = read_whole_records(run_dir / "requests.jsonl")
        left = sorted(p.name for p in run_dir.iterdir())
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "run.py: error:" in line]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "No space left on device" in errors[0] and "requests.jsonl" in errors[0]
    assert f"python -m experiments.analyze {run_dir} --in-place" in errors[0]
    assert "requests.jsonl.xz" not in left and records and not torn  # no empty .xz; whole lines kept


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_once_the_run_has_ended_leaves_the_command_that_finishes_its_report(
        sig: signal.Signals, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    with serving(FAST) as a, serving(FAST) as b:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "experiments" / "run.py"), "--trace", str(trace), "--device", "cpu",
             "--endpoint", f"stock={a}", "--endpoint", f"patched={b}", "--windows", "2", "--window-s", "1",
             "--warmup-s", "0.5", "--loads", "1,4", "--results-dir", str(tmp_path / "r"), "--name", "run",
             "--no-progress"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        run_json = tmp_path / "r" / "run" / "run.json"
        while proc.poll() is None and not (run_json.is_file() and '"status": "running"' not in
                                           run_json.read_text()):
            time.sleep(0.02)  # until the replays have ended: the servers stop, the analysis begins
        proc.send_signal(sig)
        out, err = proc.communicate()
    errors = [line for line in err.splitlines() if "run.py: error:" in line]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert f"python -m experiments.analyze {run_json.parent} --in-place" in errors[0]
    run = json.loads(run_json.read_text())
    assert run["status"] == "complete" and "python -m experiments.analyze" in run["analysis_error"]
