"""/proc read around a replay (experiments.runner.hostprobe): the parsers on literal text, and a probe of
a real process tree whose grandchild carries the engine core's title and burns CPU between the reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from experiments.runner import hostprobe
from experiments.stats.hostslow import HostSignals
from integration.endpoint import Endpoint

STAT = textwrap.dedent("""\
    cpu  22234 5 4239 29213 704 1 114 793 0 0
    cpu0 6439 0 1815 19772 195 0 40 420 0 0
    cpu1 15795 5 2424 9441 509 1 74 373 0 0
    intr 1 2 3
    ctxt 99
""")


def test_machine_ticks_of_proc_stat() -> None:
    t = hostprobe.machine_ticks(STAT)
    total = 22234 + 5 + 4239 + 29213 + 704 + 1 + 114 + 793
    assert t == hostprobe.MachineTicks(total=total, busy=total - 29213 - 704, steal=793, cpus=2)
    with pytest.raises(ValueError, match="no \"cpu\" line"):
        hostprobe.machine_ticks("intr 1 2 3\n")


def test_process_ticks_read_past_a_name_with_spaces_and_parentheses() -> None:
    line = "4242 (VLLM::Engine) x) S 4200 4200 4200 0 -1 4194560 500 0 0 0 731 112 5 6 20 0 9 0 1 2 3"
    assert hostprobe.process_ticks(line) == (4200, 731 + 112)


CHILD = """
import sys
print("ready", flush=True)
sys.stdin.readline()
sum(range(20_000_000))  # CPU time between the probe's two reads
print("done", flush=True)
sys.stdin.readline()
"""
PARENT = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]])
"""


def test_probe_of_a_process_tree_finds_the_engine_core_and_its_cpu_time() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, "VLLM::" + hostprobe.ENGINE_TITLE],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"  # the grandchild runs, waiting on the shared stdin
        probe = hostprobe.Probe(proc.pid)
        assert probe.engine is not None and probe.engine != proc.pid and len(probe.ticks) == 2
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        h = HostSignals.from_json(probe.finish(), "probe")
    finally:
        proc.stdin.write("end\n")
        proc.stdin.close()
        proc.wait()
    assert h.engine_pid == probe.engine and h.engine_cpu_s > 0
    assert h.server_cpu_s >= h.engine_cpu_s and h.span_s > 0 and h.busy_s >= 0 and h.steal_s >= 0
    assert h.cpus == hostprobe.machine_ticks(open("/proc/stat").read()).cpus and h.loadavg_1m >= 0


def test_an_endpoint_has_no_process_to_read() -> None:
    probe = hostprobe.Probe.of(Endpoint("user", "http://127.0.0.1:9/v1"))
    assert probe.pid is None and probe.finish() is None
