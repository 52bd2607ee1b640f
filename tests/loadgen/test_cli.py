"""The command line and the benchmark's plumbing, against the fake server (no timing asserted)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from loadgen.__main__ import main
from loadgen.bench import schedule
from loadgen.fakeserver import FakeServerConfig, fake_server
from loadgen.records import read_records, succeeded


@pytest.fixture
def server_url() -> Iterator[str]:
    """The fake server on its own event loop in a thread (the CLI runs its own loop)."""
    ready: list[str] = []
    stop = threading.Event()

    async def serve() -> None:
        async with fake_server(FakeServerConfig(model="tiny")) as url:
            ready.append(url)
            while not stop.is_set():
                await asyncio.sleep(0.02)

    t = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    t.start()
    while not ready:
        t.join(0.01)
    yield ready[0]
    stop.set()
    t.join(5)


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
