"""The command line and the benchmark's plumbing, against the fake server (no timing asserted)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from loadgen.__main__ import main
from loadgen.bench import schedule
from loadgen.fakeserver import FakeServerConfig
from loadgen.records import read_records, succeeded
from tests.loadgen.serving import serving

FAKE = ("from loadgen.fakeserver import FakeServerConfig as C, serve_forever as s; "
        "s(C(ttft_s=0.01, itl_s=0.05), {port})")


@pytest.fixture
def server_url() -> Iterator[str]:
    """The fake server on its own event loop in a thread (the CLI runs its own loop)."""
    with serving(FakeServerConfig(model="tiny")) as url:
        yield url


def write_trace(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_cli_window_speedup_clip_and_summary(server_url, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [{"timestamp": 0.1 * i, "input_tokens": 50 + i, "output_tokens": 30}
                        for i in range(10)])
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    argv = ["--url", server_url, "--trace", str(trace), "--out", str(out), "--start", "0.2", "--duration",
            "0.5", "--speedup", "2", "--max-output-tokens", "4", "--tag", "arm=stock", "--no-progress",
            "--summary-json", str(summary)]
    assert main(argv) == 0
    recs = sorted(read_records(out), key=lambda r: r.index)
    assert [r.input_tokens for r in recs] == [52, 53, 54, 55, 56]  # trace seconds 0.2 .. 0.6
    assert [r.due_ns for r in recs] == [0, 50_000_000, 100_000_000, 150_000_000, 200_000_000]
    assert all(succeeded(r) and r.completion_tokens == 4 and r.tags == {"arm": "stock"} for r in recs)
    assert json.loads(summary.read_text())["completed"] == 5
    assert "completed 5, failed 0" in capsys.readouterr().out
    assert main(argv) == 2  # refuses to mix runs in one file
    assert "exists and is not empty" in capsys.readouterr().err


def test_cli_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--url", "--trace", "--out", "--start", "--duration", "--speedup", "--timeout", "--seed",
                 "--model", "--max-connections", "--vocab-size", "--tag", "--no-progress"):
        assert flag in text


def test_bench_schedules():
    const = schedule(200, 1.0, "constant", 8, 4, seed=0)
    assert len(const) == 200 and const[1].timestamp == 0.005 and const[-1].timestamp == 0.995
    a, b = schedule(200, 5.0, "poisson", 8, 4, seed=3), schedule(200, 5.0, "poisson", 8, 4, seed=3)
    assert a == b and a[0].timestamp == 0.0 and a[-1].timestamp < 5.0
    gaps = np.diff([r.timestamp for r in a])
    assert abs(gaps.mean() - 1 / 200) < 3 * (1 / 200) / np.sqrt(len(gaps))  # within 3 standard errors


def _run_cli(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as got:
        main(argv)
    return got.value.code, capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [
    ("--speedup", "0"), ("--timeout", "0"), ("--max-connections", "0"), ("--connect-timeout", "-1"),
    ("--vocab-size", "0"), ("--duration", "0"), ("--start", "-1"), ("--max-input-tokens", "0"),
    ("--speedup", "nan"), ("--dead-after", "-1"), ("--url", "localhost:8000"),
    ("--vocab-size", str(10**20)), ("--vocab-size", str(2**31 + 1)),
])
def test_bad_flag_is_one_line_naming_it_exit_2(flag, value, tmp_path, capsys):
    argv = ["--url", "http://127.0.0.1:1", "--trace", "t.jsonl", "--out", str(tmp_path / "r.jsonl"),
            flag, value]
    code, err = _run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and f"argument {flag}" in err and "Traceback" not in err


def test_bad_trace_line_names_file_and_line_exit_2(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [{"timestamp": 0.0, "input_tokens": 5, "output_tokens": 2},
                        {"timestamp": 0.1, "input_tokens": 5, "output_tokens": 2, "hash_ids": [-2]}])
    argv = ["--url", "http://127.0.0.1:1", "--trace", str(trace), "--out", str(tmp_path / "r.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{trace}:2: hash_ids must be >= 0, got -2" in err
    assert main([*argv[:3], str(tmp_path / "missing.jsonl"), *argv[4:]]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_out_in_a_missing_folder_and_unreachable_url_exit_2(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [{"timestamp": 0.0, "input_tokens": 5, "output_tokens": 2}])
    assert main(["--url", "http://127.0.0.1:1", "--trace", str(trace), "--out",
                 str(tmp_path / "no" / "r.jsonl")]) == 2
    assert "--out" in capsys.readouterr().err
    # the model list cannot be read: nothing was sent
    assert main(["--url", f"http://127.0.0.1:{_closed_port()}", "--trace", str(trace), "--out",
                 str(tmp_path / "r.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--url" in err and "/v1/models" in err


def test_url_with_v1_and_dead_server_exit_1(server_url, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [{"timestamp": 0.5 * i, "input_tokens": 5, "output_tokens": 2} for i in range(20)])
    assert main(["--url", server_url + "/v1/", "--trace", str(trace), "--out", str(tmp_path / "a.jsonl"),
                 "--no-progress", "--speedup", "20"]) == 0
    out = tmp_path / "b.jsonl"
    argv = ["--url", f"http://127.0.0.1:{_closed_port()}", "--model", "m", "--trace", str(trace), "--out",
            str(out), "--no-progress", "--dead-after", "2"]
    assert main(argv) == 1
    assert "server is unreachable" in capsys.readouterr().err
    recs = read_records(out)
    assert sorted(r.index for r in recs) == list(range(20))
    assert sum(r.error.startswith("not sent: the server is unreachable") for r in recs) >= 15


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_one_record_per_request(sig, tmp_path):
    port = _closed_port()
    server = subprocess.Popen([sys.executable, "-c", FAKE.format(port=port)])
    try:
        trace = tmp_path / "t.jsonl"
        write_trace(trace, [{"timestamp": 0.1 * i, "input_tokens": 5, "output_tokens": 40}
                            for i in range(60)])
        out = tmp_path / "r.jsonl"
        cli = subprocess.Popen([sys.executable, "-m", "loadgen", "--url", f"http://127.0.0.1:{port}",
                                "--model", "fake-model", "--trace", str(trace), "--out", str(out),
                                "--no-progress", "--dead-after", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not out.is_file() or len(out.read_text().splitlines()) < 3:  # some finished
            assert cli.poll() is None, cli.communicate()
            time.sleep(0.05)
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
    assert cli.returncode == 1, err
    assert f"stopped by {sig.name}" in err and "Traceback" not in err
    recs = read_records(out)
    assert sorted(r.index for r in recs) == list(range(60))
    assert any(succeeded(r) for r in recs)
    assert recs[-1].error == f"not sent: the replay was stopped by {sig.name}"
