"""How a run ends: its servers stopped however often Ctrl-C comes, how it ended written to run.json,
its records compressed.

While the replays run, SIGTERM and SIGHUP stop the run as Ctrl-C does (`sigterm_as_interrupt`). While
the servers stop, any of the three kills every server still running at once (its process group)
instead of raising, so none outlives the run, and the report is left to `finish_command`.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from experiments.runner.environment import gpu_clocks
from experiments.runner.runrecord import RunRecord
from experiments.runner.servers import Server

log = logging.getLogger("experiments")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Owner(Protocol):
    """A runner: the servers it started, and how it stops them."""

    def owned_servers(self) -> list[Server]: ...

    def stop_owned(self) -> None: ...


def finish_command(run_dir: Path) -> str:
    """The command that makes a run's report from what it wrote."""
    return f"python -m experiments.analyze {run_dir} --in-place"


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM and SIGHUP (a closed terminal) like Ctrl-C while the run is on, so the servers
    (own sessions) are stopped too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def killing_on_signal(servers: Sequence[Server]) -> Iterator[list[str]]:
    """While it lasts, Ctrl-C, SIGTERM and SIGHUP kill every one of `servers` at once instead of
    raising; the names of the signals that came are in the list yielded."""
    came: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def kill(signum: int, frame: object) -> None:
        came.append(signal.Signals(signum).name)
        for server in servers:
            server.kill()

    previous = {sig: signal.signal(sig, kill) for sig in SIGNALS}
    try:
        yield came
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def compress(path: Path) -> Path | None:
    """gzip `path` to `path`.gz and remove it; None when there is nothing to compress."""
    if not path.is_file():
        return None
    gz = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return gz


def close(runner: Owner, record: RunRecord, status: str, reason: str | None) -> None:
    """Stop the runner's servers (a signal meanwhile kills the rest at once, and the report is left
    to finish_command), record `status` and `reason` in run.json, compress the records and note the
    GPU's clocks."""
    with killing_on_signal(runner.owned_servers()) as came:
        runner.stop_owned()
        record.finish(status, reason)
        compress(record.requests_path)
        record.set_environment_after(gpu_clocks())
    if came:
        record.warn(f"{came[0]} while the run was closing: every server still running was killed at once")
        _left(record, f"not made: {came[0]} came while the run was closing")


def _left(record: RunRecord, why: str) -> None:
    """Say in run.json ("analysis_error") why the report is missing and the command that makes it."""
    record.data["analysis_error"] = (f"{why}; the records are whole: finish the report with "
                                     f"{finish_command(record.run_dir)}")
    record.save()
