"""What the two runners (orchestrate's and the duet's) share about one replay: the hook before it, the
error that stops a run, how its outcome is settled into records, and the GPU's state after it."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from experiments.core.schedule import Step
from experiments.runner.environment import gpus
from experiments.runner.runrecord import RunRecord
from experiments.runner.servers import Server, died
from loadgen.records import RequestRecord, succeeded
from loadgen.replay import ReplayStopped

LOG_TAIL_LINES = 30
TAIL_INTRO = "; last lines of "  # a stop's reason ends with the server's log tail, introduced so


def headline(reason: str) -> str:
    """A stop's reason without the server log tail it may end with (its first line, up to TAIL_INTRO)."""
    return reason.splitlines()[0].split(TAIL_INTRO)[0] if reason else reason
# Called before every measured replay with the step, the arm label and the live servers.
BeforeReplay = Callable[[Step, str, Mapping[str, Server]], None]


class StopRun(RuntimeError):
    """The run cannot go on (a server died, a replay failed); the message is the stopped_reason."""


def settle(record: RunRecord, label: str, server: Server, what: str,
           outcome: list[RequestRecord] | BaseException) -> list[RequestRecord]:
    """The records of one replay of `what` on `label`, its prompt lengths checked into run.json; StopRun
    when it stopped early (a dead server says so), failed, or no request succeeded. An outcome that is
    not a replay error (KeyboardInterrupt, a cancellation) is raised as it is."""
    tail = f"{TAIL_INTRO}server-{label}.log:\n{server.log_tail(LOG_TAIL_LINES)}"
    if isinstance(outcome, ReplayStopped):  # every request has its record on disk; a dead server says so
        record.check_prompt_tokens(label, outcome.records)
        if server.is_alive():
            raise StopRun(f"replay of {what} on {label} stopped: {outcome.reason}{tail}")
        raise StopRun(f"{died(label, server)} in {what}: {outcome.reason}{tail}")
    if isinstance(outcome, (OSError, RuntimeError, ValueError)):
        raise StopRun(f"replay of {what} on {label} failed: {outcome!r}{tail}")
    if isinstance(outcome, BaseException):
        raise outcome
    record.check_prompt_tokens(label, outcome)
    if not server.is_alive():
        raise StopRun(f"{died(label, server)} in {what}{tail}")
    if not any(succeeded(r) for r in outcome):
        first = next((r.error or f"HTTP {r.status}, {r.completion_tokens} of {r.output_tokens} tokens"
                      for r in outcome), "no records")
        raise StopRun(f"all {len(outcome)} requests of {what} failed on {label}; first error: {first}{tail}")
    return outcome


def gpu_state(index: int = 0) -> dict | None:
    """Clocks, temperature and power of GPU `index` (nvidia-smi's numbering) now, None without it."""
    found = gpus() or []
    if len(found) <= index:
        return None
    return {k: v for k, v in found[index].items() if k.startswith(("clocks", "temperature", "power"))}
