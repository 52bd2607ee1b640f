"""What tells a slow host, read from /proc around one replay (experiments.stats.hostslow.HostSignals):
the machine's busy and stolen CPU time (/proc/stat) and load (/proc/loadavg), and the CPU time of the
server's process tree and of its engine-core process (/proc/<pid>/stat). Only for servers the kit
started: of a server the user started (--endpoint) the kit knows no process, and records none.

    probe = Probe.of(server)
    ...replay...
    entry["host"] = probe.finish()   # a HostSignals' JSON, or None for an endpoint
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from experiments.runner.servers import Server
from experiments.stats.hostslow import HostSignals
from integration.launcher import VllmServer

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
ENGINE_TITLE = "EngineCore"  # in vLLM's engine-core process title (VLLM::EngineCore, VLLM::EngineCore_DP0)


@dataclass(frozen=True)
class MachineTicks:
    """The "cpu" line of /proc/stat: ticks summed over every CPU since boot."""

    total: int  # user nice system idle iowait irq softirq steal (guest time is inside user and nice)
    busy: int  # total less idle and iowait
    steal: int
    cpus: int  # "cpuN" lines


def machine_ticks(text: str) -> MachineTicks:
    """MachineTicks of /proc/stat's text; ValueError naming what is missing."""
    lines = text.splitlines()
    head = next((ln.split() for ln in lines if ln.startswith("cpu ")), None)
    if head is None or len(head) < 9:
        raise ValueError("/proc/stat: no \"cpu\" line with 8 counters")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in head[1:9])
    total = user + nice + system + idle + iowait + irq + softirq + steal
    cpus = sum(ln.startswith("cpu") and ln[3:4].isdigit() for ln in lines)
    return MachineTicks(total, total - idle - iowait, steal, cpus)


def process_ticks(text: str) -> tuple[int, int]:
    """(parent pid, user + system ticks) of a /proc/<pid>/stat line (its name may hold spaces and ")")."""
    rest = text[text.rindex(")") + 2:].split()  # from the state on: the line's 4th field is rest[1]
    return int(rest[1]), int(rest[11]) + int(rest[12])


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):  # a process that just ended
        return None


def tree_ticks(root: int, proc: Path = PROC) -> dict[int, int]:
    """pid -> user + system ticks of `root` and every descendant alive now (empty when root is gone)."""
    parent, ticks = {}, {}
    for entry in proc.iterdir():
        text = _read(entry / "stat") if entry.name.isdigit() else None
        if text:
            parent[int(entry.name)], ticks[int(entry.name)] = process_ticks(text)
    found: dict[int, int] = {}
    for pid in ticks:
        p = pid
        while p not in found and p != root and p in parent and p > 1:
            p = parent[p]
        if p == root or p in found:
            found[pid] = ticks[pid]
    return found


def title(pid: int, proc: Path = PROC) -> str:
    """A process's command line (as setproctitle leaves it) and name, "" when it is gone."""
    cmdline = (_read(proc / str(pid) / "cmdline") or "").replace("\0", " ")
    return f"{cmdline} {(_read(proc / str(pid) / 'comm') or '').strip()}"


def engine_pid(root: int, ticks: dict[int, int], proc: Path = PROC) -> int | None:
    """The descendant of `root` among `ticks` whose title holds ENGINE_TITLE (the lowest pid), None when
    none does."""
    return next((pid for pid in sorted(ticks) if pid != root and ENGINE_TITLE in title(pid, proc)), None)


class Probe:
    """/proc read when made and again at finish(), for the server process `pid` (None: an endpoint)."""

    def __init__(self, pid: int | None, proc: Path = PROC) -> None:
        self.pid, self.proc = pid, proc
        if pid is not None:
            self.machine = self._machine()
            self.ticks = tree_ticks(pid, proc)
            self.engine = engine_pid(pid, self.ticks, proc)

    @classmethod
    def of(cls, server: Server) -> Probe:
        """The probe of an arm's server: its process when the kit started it, none for an endpoint."""
        own = isinstance(server, VllmServer) and server.proc is not None
        return cls(server.proc.pid if own else None)

    def _machine(self) -> MachineTicks:
        return machine_ticks((self.proc / "stat").read_text(encoding="utf-8"))

    def finish(self) -> dict | None:
        """The HostSignals since the probe was made, as run.json keeps them; None for an endpoint."""
        if self.pid is None:
            return None
        machine, ticks = self._machine(), tree_ticks(self.pid, self.proc)
        loadavg = float((self.proc / "loadavg").read_text(encoding="utf-8").split()[0])
        span = (machine.total - self.machine.total) / machine.cpus
        server = sum(t - self.ticks.get(pid, 0) for pid, t in ticks.items())
        engine = self.engine if self.engine in ticks and self.engine in self.ticks else None
        return HostSignals(
            span_s=round(span * TICK_S, 3), cpus=machine.cpus,
            busy_s=round((machine.busy - self.machine.busy) * TICK_S, 3),
            steal_s=round((machine.steal - self.machine.steal) * TICK_S, 3), loadavg_1m=loadavg,
            server_cpu_s=round(server * TICK_S, 3),
            engine_cpu_s=None if engine is None else round((ticks[engine] - self.ticks[engine]) * TICK_S, 3),
            engine_pid=engine).to_json()
