"""Windows, warm-up and clipping are decided, and bad traces rejected, before any server starts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.runner import cli as run_cli
from experiments.runner.config import ConfigError, make_config
from experiments.runner.plan import prepare
from integration.launcher import VllmServer
from traces.trace import MAX_TIMESTAMP_S, TraceError

REPO = Path(__file__).resolve().parents[2]


def _trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    path.write_text("".join(f'{{"timestamp": {t}, "input_tokens": {i}, "output_tokens": {o}}}\n'
                            for t, i, o in rows))
    return path


@pytest.fixture
def no_server_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: VllmServer) -> None:
        raise AssertionError("a server was started")

    monkeypatch.setattr(VllmServer, "start", refuse)


def test_bad_trace_fails_with_file_and_line_before_any_server(tmp_path: Path, no_server_starts: None,
                                                              capsys: pytest.CaptureFixture) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0.0, "input_tokens": 5, "output_tokens": 3}\n'
                     '{"timestamp": 1.0, "input_tokens": 0, "output_tokens": 3}\n')
    results = tmp_path / "results"
    code = run_cli.main(["--trace", str(trace), "--device", "cpu", "--results-dir", str(results)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{trace}:2:" in err and "input_tokens must be >= 1" in err
    assert not results.exists()


def test_windows_are_cut_rebased_and_clipped(tmp_path: Path) -> None:
    rows = [(t * 0.5, 3000, 300) for t in range(60)]  # 2 req/s for 30 s, long prompts and outputs
    cfg = make_config(_trace(tmp_path / "t.jsonl", rows), "cpu", windows=2, window_s=10.0, warmup_s=5.0,
                      loads=(1.0, 2.0))
    plan = prepare(cfg)
    assert [(w.start_s, len(w.requests)) for w in plan.windows] == [(5.0, 20), (15.0, 20)]
    assert plan.windows[1].requests[0].timestamp == 0.0
    assert all(r.input_tokens == 1024 and r.output_tokens == 32 for w in plan.windows for r in w.requests)
    assert len(plan.warmup) == 10 and plan.warmup_start_s == 0.0
    assert plan.clipped_requests == 50 and plan.trace_requests == 60
    assert len(plan.steps) == 4


def test_warmup_follows_the_windows_when_there_is_no_room_before(tmp_path: Path) -> None:
    rows = [(float(t), 10, 5) for t in range(40)]
    plan = prepare(make_config(_trace(tmp_path / "t.jsonl", rows), "cpu", windows=2, window_s=10.0,
                               warmup_s=5.0, start_s=0.0))
    assert plan.warmup_start_s == 20.0 and [r.timestamp for r in plan.warmup] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_windows_past_the_trace_end_or_empty_are_refused(tmp_path: Path, no_server_starts: None) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(0.0, 10, 5), (1.0, 10, 5), (50.0, 10, 5)])
    with pytest.raises(ConfigError, match="trace .* ends at 50 s"):
        prepare(make_config(trace, "cpu", windows=6, window_s=10.0, warmup_s=0.0, start_s=0.0))
    with pytest.raises(ConfigError, match=r"window 1 \[10, 20\) s .* has no requests"):
        prepare(make_config(trace, "cpu", windows=2, window_s=10.0, warmup_s=0.0, start_s=0.0))


@pytest.mark.parametrize("flag, key", [("--loads", "loads"), ("--knee", "knee_factors")])
def test_a_load_that_stretches_a_window_past_the_schedule_ceiling_is_refused(tmp_path: Path, flag: str,
                                                                             key: str) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(float(t), 10, 5) for t in range(40)])
    last = 9.0  # each 10 s window's last request, rebased: due at 9 / load s when replayed at that load
    cfg = make_config(trace, "cpu", windows=2, window_s=10.0, warmup_s=5.0, **{key: (1e-300, 1.0)})
    with pytest.raises(ConfigError, match=rf"^{flag} 1e-300: window 0 .* needs a load of at least") as exc:
        prepare(cfg)
    least = float(str(exc.value).rsplit(" ", 1)[1])  # the bound it names is one a run takes
    assert last / MAX_TIMESTAMP_S <= least < 1.01 * last / MAX_TIMESTAMP_S
    assert prepare(make_config(trace, "cpu", windows=2, window_s=10.0, warmup_s=5.0, **{key: (least, 1.0)}))
    with pytest.raises(ConfigError, match=rf"^{flag} "):
        prepare(make_config(trace, "cpu", windows=2, window_s=10.0, warmup_s=5.0,
                            **{key: (0.99 * last / MAX_TIMESTAMP_S, 1.0)}))


def test_a_top_load_that_stretches_the_warm_up_past_the_ceiling_is_refused(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(float(t), 10, 5) for t in range(40)])
    load = 5 / MAX_TIMESTAMP_S  # the 2 s windows' last requests (at 1 s) fit, the 20 s warm-up's (19 s) not
    cfg = make_config(trace, "cpu", windows=2, window_s=2.0, warmup_s=20.0, start_s=25.0, loads=(load,))
    with pytest.raises(ConfigError, match=rf"^--loads {load:g}: the warm-up stretch ") as exc:
        prepare(cfg)
    assert f"last request at {19 / load:g} s" in str(exc.value)


def test_windows_in_a_gap_say_where_requests_are_and_which_start_works(tmp_path: Path,
                                                                      no_server_starts: None) -> None:
    # 1 request/s over [0, 12), nothing for 200 s, 1 request/s over [212, 262): the default start (after a
    # 5-s warm-up) puts window 1 in the gap
    rows = [(float(t), 10, 5) for t in [*range(12), *range(212, 262)]]
    trace = _trace(tmp_path / "gap.jsonl", rows)
    cfg = make_config(trace, "cpu", windows=3, window_s=10.0, warmup_s=5.0)
    with pytest.raises(ConfigError) as exc:
        prepare(cfg)
    msg = str(exc.value)
    assert msg.startswith(f"window 1 [15, 25) s of {trace} has no requests; ")
    assert "its requests lie in 0-11 s (12 requests), 212-261 s (50 requests)" in msg
    m = re.search(r"--start-s (\d+) gives 3 windows of 10 s that all hold requests", msg)
    assert m, msg
    start = int(m.group(1))
    assert 212 <= start <= 231  # three windows and the 5 s warm-up before them inside the second span
    plan = prepare(make_config(trace, "cpu", windows=3, window_s=10.0, warmup_s=5.0, start_s=float(start)))
    assert all(w.requests for w in plan.windows) and plan.warmup


def test_a_trace_no_start_can_fill_says_so(tmp_path: Path) -> None:
    rows = [(float(t), 10, 5) for t in [*range(12), *range(212, 224)]]  # two 12-s spans, 200 s apart
    cfg = make_config(_trace(tmp_path / "gap.jsonl", rows), "cpu", windows=3, window_s=10.0, warmup_s=0.0)
    with pytest.raises(ConfigError, match="no --start-s gives 3 windows of 10 s that all hold requests: use "
                                          r"fewer or longer windows \(--windows, --window-s\)"):
        prepare(cfg)


def test_run_dry_run_in_a_gap_is_one_line_with_the_hint(tmp_path: Path, no_server_starts: None,
                                                         capsys: pytest.CaptureFixture) -> None:
    trace = _trace(tmp_path / "gap.jsonl", [(float(t), 10, 5) for t in [*range(12), *range(212, 262)]])
    argv = ["--trace", str(trace), "--device", "cpu", "--windows", "3", "--window-s", "10", "--warmup-s", "5",
            "--dry-run"]
    assert run_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no requests" in err and "--start-s" in err
    start = re.search(r"--start-s (\d+) gives", err).group(1)
    assert run_cli.main([*argv, "--start-s", start]) == 0
    assert '"windows"' in capsys.readouterr().out


@pytest.mark.parametrize("where", ["/proc", "/proc/a/b", "file/below"])
def test_results_dir_that_cannot_hold_a_run_is_one_line_naming_the_flag(
        tmp_path: Path, no_server_starts: None, capsys: pytest.CaptureFixture, where: str) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(float(t), 10, 5) for t in range(60)])
    (tmp_path / "file").write_text("not a folder")
    results = where if where.startswith("/") else str(tmp_path / where)
    code = run_cli.main(["--trace", str(trace), "--device", "cpu", "--results-dir", results, "--windows", "2",
                         "--window-s", "10", "--warmup-s", "5"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"python experiments/run.py: error: --results-dir {results}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "t.jsonl"]  # nothing left behind


def test_request_longer_than_max_model_len_is_named_by_line(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(0.0, 10, 5), (1.0, 900, 200), (2.0, 10, 5), (5.0, 10, 5)])
    cfg = make_config(trace, "cpu", windows=1, window_s=3.0, warmup_s=0.0, start_s=0.0, max_model_len=900)
    with pytest.raises(TraceError, match=rf"{trace}:2: input_tokens \+ output_tokens = 932"):
        prepare(cfg)


@pytest.mark.e2e
def test_script_runs_from_any_directory(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "experiments" / "run.py"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--kv-cache-memory-bytes" in out.stdout
