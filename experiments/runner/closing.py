"""How a run ends: its servers stopped however often Ctrl-C comes, how it ended written to run.json,
its records compressed, its analysis made; and where one of these cannot be done (a full disk, a
signal), what is left said in one line with the command that finishes the run.

While the replays run, SIGTERM and SIGHUP stop the run as Ctrl-C does (`sigterm_as_interrupt`). While
the servers stop, any of the three kills every server still running at once (its process group)
instead of raising, so none outlives the run, and the report is left to `finish_command`. During
the analysis, one stops the analysis alone.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from common.jsonfile import compress_file
from experiments.runner.environment import gpu_clocks
from experiments.runner.replays import headline
from experiments.runner.runrecord import RunRecord
from experiments.runner.servers import Server

log = logging.getLogger("experiments")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INTERRUPTED = "interrupted (Ctrl-C, SIGTERM or SIGHUP)"


class RunNotFinished(RuntimeError):
    """The run has stopped, but what it wrote is not whole (run.json, the records: a full disk); the
    message says what is left and how to finish it."""


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


def _attempt(problems: list[str], what: str, step) -> None:
    """Run `step`; an OSError (a full disk) is kept in `problems` as `what`, its reason in its `{}`."""
    try:
        step()
    except OSError as exc:
        problems.append(what.format(exc.strerror or exc))


def close(runner: Owner, record: RunRecord, status: str, reason: str | None) -> list[str]:
    """Stop the runner's servers (a signal meanwhile kills the rest at once, and the report is left
    to finish_command), record `status` and `reason` in run.json, compress the records and note the
    GPU's clocks; returns what could not be written, one clause each."""
    problems: list[str] = []
    with killing_on_signal(runner.owned_servers()) as came:
        runner.stop_owned()
        _attempt(problems, "run.json could not be updated ({}) and may still say 'running'",
                 lambda: record.finish(status, reason))
        _attempt(problems, "requests.jsonl could not be compressed ({}), its records staying whole in it",
                 lambda: compress_file(record.requests_path))  # requests.jsonl.xz, written whole or not
        _attempt(problems, "environment.json could not take the clocks after the run ({})",
                 lambda: record.set_environment_after(gpu_clocks()))
    if came:
        record.warn(f"{came[0]} while the run was closing: every server still running was killed at once")
        _left(record, f"not made: {came[0]} came while the run was closing", problems)
    return problems


def _left(record: RunRecord, why: str, problems: list[str]) -> None:
    """Say in run.json ("analysis_error") why the report is missing and the command that makes it."""
    record.no_report(f"{why}; the records are whole: finish the report with {finish_command(record.run_dir)}")
    _attempt(problems, "run.json could not say that the report is missing ({})", record.save)


def not_finished(record: RunRecord, reason: str | None, problems: Iterable[str]) -> RunNotFinished:
    """The error that says a run stopped with its files not whole, and how to finish it."""
    return RunNotFinished(f"{headline(reason or 'the run ended')}; then {'; '.join(problems)}: when "
                          f"{record.run_dir} can be written again, finish the report with "
                          f"{finish_command(record.run_dir)}")


def analyze(record: RunRecord) -> None:
    """Make the run's report (experiments.analyze, with the SLO tiers run.json records); a failure or a
    signal is kept in run.json as "analysis_error", with the command that finishes the report."""
    run_dir = record.run_dir
    try:
        from experiments.analyze import analyze_run  # the analysis half; imported late, it pulls in plotting

        analyze_run(run_dir)
        log.info("report: %s", run_dir / "report.md")
        return
    except KeyboardInterrupt:
        why = INTERRUPTED
        log.error("analysis %s", why)
    except Exception as exc:  # the data is on disk; say why the report is missing, keep the run
        log.exception("analysis failed")
        why = f"failed: {exc!r}"
    problems: list[str] = []
    _left(record, why, problems)
    if problems:
        raise not_finished(record, f"the analysis {why}", problems)
