"""Slow host episodes in report.json and report.md (experiments.reporting.hostreport): named for a run
whose replays carry host signals, absent from a run recorded before them."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.analyze import analyze_run
from experiments.core.slo import SLO
from experiments.reporting.schema import read_report
from experiments.stats.hostslow import HostSignals
from tests.experiments.synthetic_run import write_run

CHAT = SLO("chat", 2000.0, 100.0)
SLOW = ("patched", 2, 2.0)  # the replay that ran while the hypervisor took the machine


def cell(arm: str, window: int, load: float, rng) -> list[tuple[float, float, None]]:
    """40 requests; TPOT 20 ms with a small wobble per cell, 30 ms in the slow replay."""
    tpot = 30.0 if (arm, window, load) == SLOW else 20.0 * (1 + 0.004 * ((window + len(arm)) % 3))
    return [(100.0, tpot, None)] * 40


def host(arm: str, window: int, load: float) -> dict:
    steal = 1.2 if (arm, window, load) == SLOW else 0.02
    return HostSignals(span_s=20.0, cpus=4, busy_s=30.0, steal_s=steal, loadavg_1m=1.0, server_cpu_s=18.0,
                       engine_cpu_s=15.0, engine_pid=99).to_json()


def test_a_replay_in_a_slow_host_episode_is_named_not_adjusted(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", cell, itl=True, host=host)
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    s = r["slow_host"]
    assert s["replays"] == 24 and s["episodes"] == 1 and s["not_recorded"] == []
    (e,) = s["slow"]
    assert (e["arm"], e["window"], e["load"], e["causes"]) == ("patched", 2, 2.0, ["steal"])
    assert e["steal_pct"] == 1.5 and e["itl_p50_ms"] == 30.0
    assert read_report(run_dir / "report.json").slow_host == s
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    head, body = md.split("## Comparisons", 1)
    assert "**Slow host episodes** — 1 of 24 measured replays ran in one" in head
    assert "## Slow host episodes" in body and f"Rule: {s['rule']}." in body
    assert "| patched | 2 | 2x | 0.8 | 30.00 | +" in body and "| yes: steal |" in body
    plain = write_run(tmp_path / "plain", cell, itl=True)  # no host entries
    unflagged = analyze_run(plain, [CHAT], draw_plots=False)
    assert unflagged["paired_latency"] == r["paired_latency"]  # the episode's replay kept, not adjusted


def test_a_run_without_host_signals_has_no_entry_and_no_section(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", cell, itl=True)
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    assert "slow_host" not in r and "slow_host" not in json.loads((run_dir / "report.json").read_text())
    assert "Slow host" not in (run_dir / "report.md").read_text(encoding="utf-8")


def test_servers_the_user_started_get_the_spacing_and_say_the_host_was_not_recorded(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", cell, itl=True, host=lambda arm, w, load: None)
    s = analyze_run(run_dir, [CHAT], draw_plots=False)["slow_host"]
    assert s["episodes"] == 0 and [e["causes"] for e in s["slow"]] == [None]
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert ("Not recorded: host signals (servers the user started): not recorded in 24 of 24 replays."
            in md) and "| host not recorded |" in md and "**Slow host episodes**" not in md
