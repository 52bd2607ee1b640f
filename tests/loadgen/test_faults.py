"""Faults injected into a replay against the fake server: a full disk, a hang-up, a silent server,
absurd or unwritable inputs, a damaged records file. Each leaves one record per scheduled request
(or nothing sent) and one line naming what went wrong; no timing is asserted."""

from __future__ import annotations

import asyncio
import gzip
import json
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loadgen.__main__ import main
from loadgen.fakeserver import FakeServerConfig, fake_server
from loadgen.records import read_records, succeeded
from loadgen.replay import ReplayOptions, ReplayStopped, ServerNotReady, replay
from tests.loadgen.serving import serving as fake_serving
from tests.mounts import tmpfs
from traces.trace import TraceRequest

FAST = FakeServerConfig(ttft_s=0.001, itl_s=0.001, model="tiny")


@contextmanager
def serving(cfg: FakeServerConfig = FAST) -> Iterator[str]:
    """The fake server (FAST unless told) on its own event loop in a thread; its URL."""
    with fake_serving(cfg) as url:
        yield url


def trace_file(path: Path, n: int, gap_s: float = 0.005, output_tokens: int = 20, **row) -> Path:
    path.write_text("".join(json.dumps({"timestamp": gap_s * i, "input_tokens": 5,
                                        "output_tokens": output_tokens, **row}) + "\n" for i in range(n)))
    return path


def cli(url: str, trace: Path, out: Path, *more: str) -> list[str]:
    return ["--url", url, "--trace", str(trace), "--out", str(out), "--no-progress", *more]


def test_dev_full_stops_the_replay_naming_the_file_exit_1(tmp_path, capsys):
    with serving() as url:
        assert main(cli(url, trace_file(tmp_path / "t.jsonl", 10), Path("/dev/full"))) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "stopped:" in err
    assert "could not store the record of request" in err and "/dev/full: No space left on device" in err
    assert "requests 10:" in out and "10 of this run's 10 records are not in it" in out


def test_a_full_filesystem_keeps_whole_lines_and_every_record(tmp_path):
    with tmpfs(tmp_path / "small", "size=8k") as small:
        out = small / "r.jsonl"
        reqs = [TraceRequest(0.005 * i, 5, 20) for i in range(100)]  # about 60 KB of records

        async def go():
            async with fake_server(FAST) as url:
                return await replay(url, reqs, ReplayOptions(out=out, progress=False))
        with pytest.raises(ReplayStopped, match=f"{out}: No space left on device") as got:
            asyncio.run(go())
        on_disk = read_records(out)  # every line whole: a torn one would not parse
        assert out.read_bytes().endswith(b"\n") and 0 < len(on_disk) < 100
    recs = got.value.records
    assert [r.index for r in recs] == list(range(100))  # still one record per request, in memory
    assert all(recs[r.index] == r for r in on_disk)
    assert recs[-1].error.startswith(("not sent: could not store the record",  # the schedule stopped
                                      "cancelled: could not store the record"))


def test_a_full_filesystem_under_the_cli_is_a_stopped_replay_not_a_bad_input(tmp_path, capsys):
    with tmpfs(tmp_path / "small", "size=8k") as small, serving() as url:
        code = main(cli(url, trace_file(tmp_path / "t.jsonl", 100), small / "r.jsonl",
                        "--summary-json", str(small / "s.json")))
        assert read_records(small / "r.jsonl")  # whole lines only
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 2  # was 2, "nothing was sent", after the replay had run
    assert "--summary-json" in err[0] and "No space left on device" in err[0] and "stopped:" in err[1]


def test_a_file_size_limit_stops_the_cli_with_whole_lines(tmp_path):
    def limited():  # writes past 4 KiB fail with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out, trace = tmp_path / "r.jsonl", trace_file(tmp_path / "t.jsonl", 40)
    with serving() as url:
        done = subprocess.run([sys.executable, "-m", "loadgen", *cli(url, trace, out)],
                              capture_output=True, text=True, preexec_fn=limited, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and f"{out}: File too large" in done.stderr
    assert out.read_bytes().endswith(b"\n") and 0 < len(read_records(out)) < 40
    assert "records are not in it" in done.stdout


@pytest.mark.e2e
def test_sighup_stops_like_sigterm_with_a_record_per_request(tmp_path):
    out = tmp_path / "r.jsonl"
    with serving(FakeServerConfig(ttft_s=0.01, itl_s=0.05, model="tiny")) as url:
        proc = subprocess.Popen([sys.executable, "-m", "loadgen",
                                 *cli(url, trace_file(tmp_path / "t.jsonl", 60, gap_s=0.1, output_tokens=40),
                                      out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not out.is_file() or len(out.read_text().splitlines()) < 3:  # some finished
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "stopped by SIGHUP" in err and "Traceback" not in err
    recs = read_records(out)
    assert sorted(r.index for r in recs) == list(range(60)) and any(succeeded(r) for r in recs)
    assert recs[-1].error == "not sent: the replay was stopped by SIGHUP"


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """A server that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s


def _url(s: socket.socket) -> str:
    return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_silent_server_is_given_up_at_the_probe_timeout(silent, tmp_path, capsys):
    out, silent_url = tmp_path / "r.jsonl", _url(silent)
    reqs = [TraceRequest(0.1 * i, 5, 2) for i in range(5)]
    with pytest.raises(ServerNotReady, match="never answered") as got:
        asyncio.run(replay(silent_url, reqs, ReplayOptions(out=out, progress=False, probe_timeout_s=0.3)))
    assert [r.index for r in got.value.records] == list(range(5)) == [r.index for r in read_records(out)]
    assert all(r.error.startswith("not sent: no model list: GET ") and r.sent_ns is None
               for r in read_records(out))
    assert main(cli(silent_url, trace_file(tmp_path / "t.jsonl", 5), tmp_path / "c.jsonl",
                    "--probe-timeout", "0.3")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "never answered" in err and "recorded as not sent" in err
    assert len(read_records(tmp_path / "c.jsonl")) == 5


def test_a_signal_while_the_server_is_silent_records_every_request(silent, tmp_path):
    out, trace = tmp_path / "r.jsonl", trace_file(tmp_path / "t.jsonl", 5)
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", *cli(_url(silent), trace, out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    silent.settimeout(120)
    conn, _ = silent.accept()  # the CLI's GET /v1/models has connected and waits for an answer
    with conn:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "stopped by SIGTERM" in err and "Traceback" not in err, err
    recs = read_records(out)
    assert [r.index for r in recs] == list(range(5))
    assert all(r.error == "not sent: the replay was stopped by SIGTERM" for r in recs)


def test_an_absurd_trace_row_is_refused_with_its_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_tokens": 5, "output_tokens": 2}\n'
                     '{"timestamp": 1, "input_tokens": 1000000000, "output_tokens": 2}\n')
    assert main(cli("http://127.0.0.1:9", trace, tmp_path / "r.jsonl")) == 2
    assert f"{trace}:2: input_tokens 1,000,000,000 is past the ceiling" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("speedup, timestamp", [("1e-300", 1.0), ("1", 1e308)])
def test_a_schedule_past_the_ceiling_is_one_line_not_an_overflow(tmp_path, capsys, speedup, timestamp):
    from traces.info import main as info

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_tokens": 5, "output_tokens": 2}\n'
                     f'{{"timestamp": {timestamp!r}, "input_tokens": 5, "output_tokens": 2}}\n')
    assert main(cli("http://127.0.0.1:9", trace, tmp_path / "r.jsonl", "--speedup", speedup)) == 2
    assert info([str(trace), "--speedup", speedup, "--out", str(tmp_path / "slice.jsonl")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("past the ceiling of 1,000,000,000 s" in line for line in err), err
    assert all(("--speedup 1e-300: " in line) == (speedup == "1e-300") for line in err), err
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "slice.jsonl").exists()


def test_a_long_reply_is_named_long():
    async def go():
        async with fake_server(FakeServerConfig(ttft_s=0.001, itl_s=0.001, extra_tokens=1)) as url:
            return await replay(url, [TraceRequest(0.0, 5, 7)], ReplayOptions(progress=False))
    (r,) = asyncio.run(go())
    assert not succeeded(r) and r.error == "long reply: 8 tokens, 7 asked (finish_reason=length)"


def test_a_usage_count_that_is_not_an_integer_keeps_each_record_and_names_it(tmp_path, capsys):
    cfg = FakeServerConfig(ttft_s=0.001, itl_s=0.001, model="tiny", usage_as_text=True)
    out = tmp_path / "r.jsonl"
    with serving(cfg) as url:
        assert main(cli(url, trace_file(tmp_path / "t.jsonl", 20, output_tokens=8), out)) == 1
    recs = read_records(out)
    assert sorted(r.index for r in recs) == list(range(20))  # on disk in finish order
    for r in recs:  # the reply's timings kept, the count left out and named
        assert r.status == 200 and r.n_chunks == 8 and r.first_token_ns < r.last_token_ns <= r.end_ns
        assert r.completion_tokens is None and r.prompt_tokens is None
        assert r.error == 'bad usage chunk: prompt_tokens is "5", not an integer >= 0'
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--summary-json", "--out"])
def test_outputs_are_checked_before_anything_is_sent(flag, tmp_path, capsys):
    trace, out = trace_file(tmp_path / "t.jsonl", 3), tmp_path / "r.jsonl"
    bad = {"--summary-json": ["--summary-json", str(tmp_path)], "--out": ["--append"]}[flag]
    with serving() as url:
        argv = cli(url, trace, trace if flag == "--out" else out, *bad)
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and ("is a folder" in err or "is the input file" in err)
    assert not out.exists() and len(trace.read_text().splitlines()) == 3


def test_a_read_only_folder_is_refused_before_work(tmp_path, capsys):
    from traces.info import main as info

    trace = trace_file(tmp_path / "t.jsonl", 3)
    with tmpfs(tmp_path / "ro", "ro,size=4k") as ro:
        assert info([str(trace), "--out", str(ro / "slice.jsonl")]) == 2
        assert main(cli("http://127.0.0.1:9", trace, ro / "r.jsonl")) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("not writable" in line for line in err)


def test_uvloop_missing_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where it is not installed
    assert main(cli("http://127.0.0.1:9", trace_file(tmp_path / "t.jsonl", 3), tmp_path / "r.jsonl",
                    "--event-loop", "uvloop")) == 2
    assert "--event-loop uvloop: the uvloop package is not installed" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_run_with_duplicated_records_is_refused_by_the_analysis(tmp_path, capsys):
    from experiments.analyze import main as analyze
    from tests.experiments.synthetic_run import write_run

    reqs = [TraceRequest(0.01 * i, 5, 4) for i in range(40)]
    run_dir = write_run(tmp_path / "run", lambda *a: [(1.0, 1.0, None)] * 40, windows=1, loads=(1.0,),
                        warmup=0, duration_s=0.4)
    records = run_dir / "requests.jsonl"
    records.unlink()

    async def go():
        for arm in ("stock", "patched"):
            async with fake_server(FAST) as url:
                await replay(url, reqs, ReplayOptions(out=records, progress=False,
                             tags={"arm": arm, "window": 0, "load": 1.0, "phase": "measure"}))
    asyncio.run(go())
    lines = records.read_text().splitlines(keepends=True)
    with gzip.open(run_dir / "requests.jsonl.gz", "wt") as f:
        f.writelines(lines + lines[:30])  # 30 lines written twice
    records.unlink()
    assert analyze([str(run_dir), "--slo", "loose:60000:10000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "30 records repeat" in err and not (run_dir / "report.md").exists()
    assert analyze([str(run_dir), "--slo", "loose:60000:10000", "--accept-damaged"]) == 0
    assert "(damaged)" in (run_dir / "report.md").read_text()
