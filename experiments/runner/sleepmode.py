"""--sleep-mode: every arm's server resident on one GPU, only the replayed arm's awake (vLLM's sleep mode).

The kit starts every server with `--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1
(servers.SLEEP_MODE_ARGS and SLEEP_MODE_ENV: vLLM's POST /sleep, POST /wake_up and GET /is_sleeping),
in groups of as many as fit the GPU awake beside the others asleep (the plan's memory, `start_awake`;
servers.start_groups). The runner puts each group to sleep once its servers are healthy and warmed
up, before the next group starts, and before every replay (warm-up, knee search, burn-in, measured)
`Awake.only` makes that arm's server the one awake: the server that was awake is put to sleep
(level 1: weights to host memory, KV cache dropped, the CUDA graphs kept), the arm's is woken, the
others stay asleep. A server's first sleep pins its host buffers (10.4 s for the 8B shape on an
H100, 0.36 s after: readiness.FIRST_SLEEP_S), so it falls in its start group, before anything is
measured. Every switch and its seconds go to run.json "sleep_mode" (`Switch`); a sleep or wake that
fails stops the run, naming the server and the HTTP status.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from experiments.runner.plan import Plan
from experiments.runner.replays import StopRun
from experiments.runner.runrecord import RunRecord
from experiments.runner.servers import Server, died

LEVEL = 1  # weights offloaded to host memory, KV cache discarded: the level that wakes fastest
CALL_TIMEOUT_S = 300.0  # one sleep or wake (a first sleep of the 8B shape took 10.4 s)


@dataclass(frozen=True)
class Switch:
    """One change of the awake server, `at_s` seconds into the run: `slept` put to sleep (each taking
    its `sleep_s`), then `woken` woken in `wake_s` (None: none), before `before` (a replay as the
    runner names it, or the next start group)."""

    before: str
    at_s: float
    slept: tuple[str, ...]
    sleep_s: tuple[float, ...]
    woken: str | None
    wake_s: float | None

    def to_json(self) -> dict:
        return {**asdict(self), "slept": list(self.slept), "sleep_s": list(self.sleep_s)}


def start_awake(plan: Plan) -> int:
    """How many servers start (awake) at once with --sleep-mode: the plan's memory says on a GPU;
    elsewhere one."""
    return (plan.design.get("memory") or {}).get("start_awake", 1)


def call(label: str, server: Server, method: str, path: str) -> tuple[float, bytes]:
    """`method path` on `label`'s server: its seconds and the body; StopRun naming the server and the
    HTTP status, or why nothing answered."""
    started = time.perf_counter()
    request = urllib.request.Request(f"{server.url}{path}", method=method,
                                     data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        hint = " (started without --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1?)" if exc.code == 404 else ""
        raise StopRun(f"sleep mode: {method} {path} on server {label} answered HTTP {exc.code}{hint}") \
            from None
    except OSError as exc:
        why = f"no answer ({exc})" if server.is_alive() else died(label, server)
        raise StopRun(f"sleep mode: {method} {path} on server {label}: {why}") from None
    return round(time.perf_counter() - started, 3), body


class Awake:
    """Which of the run's servers are awake, switched by vLLM's endpoints with the plan's --sleep-mode,
    the switches in run.json; without it every server stays awake and nothing is switched or recorded.
    A server it has not seen yet (just started, or handed in) is asked GET /is_sleeping first."""

    def __init__(self, plan: Plan, record: RunRecord, t_start: float) -> None:
        self.on, self.t_start = plan.cfg.sleep_mode, t_start
        self.known: set[str] = set()
        self.awake: set[str] = set()
        self.start_awake = start_awake(plan) if self.on else None  # the size of servers.start_groups' groups
        self.switches: list[dict] = record.sleep_switches(LEVEL) if self.on else []

    def forget(self, label: str) -> None:
        """A server that was stopped (a new one of `label` is asked again)."""
        self.known.discard(label)
        self.awake.discard(label)

    def only(self, label: str, servers: Mapping[str, Server], before: str) -> None:
        """`label`'s server the only one awake: any other awake put to sleep, then it woken if asleep."""
        self._learn(servers)
        self._switch(servers, sorted(self.awake - {label}), None if label in self.awake else label, before)

    def sleep(self, labels: Iterable[str], servers: Mapping[str, Server], before: str) -> None:
        """Those of `labels` that are awake put to sleep."""
        self._learn(servers)
        self._switch(servers, sorted(self.awake.intersection(labels)), None, before)

    def _learn(self, servers: Mapping[str, Server]) -> None:
        """Ask each server not seen yet whether it sleeps (StopRun when it cannot say)."""
        for label in sorted(set(servers) - self.known) if self.on else ():
            _, body = call(label, servers[label], "GET", "/is_sleeping")
            try:
                asleep = json.loads(body)["is_sleeping"]
            except (ValueError, KeyError, TypeError):
                raise StopRun(f"sleep mode: GET /is_sleeping on server {label} answered {body[:200]!r}, not "
                              '{"is_sleeping": true|false}') from None
            self.known.add(label)
            if not asleep:
                self.awake.add(label)

    def _switch(self, servers: Mapping[str, Server], sleep: list[str], wake: str | None, before: str) -> None:
        if not self.on or (not sleep and wake is None):
            return
        at_s = round(time.time() - self.t_start, 3)
        sleep_s = []
        for label in sleep:
            sleep_s.append(call(label, servers[label], "POST", f"/sleep?level={LEVEL}")[0])
            self.awake.discard(label)
        wake_s = None
        if wake is not None:
            wake_s = call(wake, servers[wake], "POST", "/wake_up")[0]
            self.awake.add(wake)
        self.switches.append(Switch(before, at_s, tuple(sleep), tuple(sleep_s), wake, wake_s).to_json())
