"""The slow-host rule (experiments.stats.hostslow) on hand-made replays with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.core.runfile import Run
from experiments.stats import hostslow
from experiments.stats.hostslow import HostSignals

ARMS = ("stock", "patched", "stock-b")
TOKENS = 30  # output tokens of every replay (3 requests of 10)


def host(steal_s: float = 0.02, engine_cpu_s: float | None = 0.06, busy_s: float = 4.0) -> dict:
    """A replay's host entry: 10 s on 2 CPUs, the server 1 s of CPU time, the engine `engine_cpu_s`."""
    return HostSignals(span_s=10.0, cpus=2, busy_s=busy_s, steal_s=steal_s, loadavg_1m=1.0, server_cpu_s=1.0,
                       engine_cpu_s=engine_cpu_s, engine_pid=42).to_json()


def make_run(spacing: dict, hosts: dict | None = None, no_host: bool = False) -> tuple[pd.DataFrame, Run]:
    """(measured frame, run.json) of replays whose requests' token gaps all equal `spacing[(arm, w, load)]`
    ms, each replay's host entry from `hosts` (default host()); every entry None with `no_host`."""
    rows, replays = [], []
    for k, ((arm, window, load), gap) in enumerate(sorted(spacing.items())):
        rows += [{"arm": arm, "window": window, "load": load, "ok": True, "itl_ms": [gap] * 9,
                  "completion_tokens": 10} for _ in range(3)]
        entry = None if no_host else (hosts or {}).get((arm, window, load), host())
        replays.append({"arm": arm, "window": window, "load": load, "phase": "measure",
                        "started_s": 60.0 * k, "host": entry})
    return pd.DataFrame(rows), Run(replays=replays)


def quiet_run() -> dict:
    """Six windows at 1x: spacing 10 + w ms (the windows' batches differ), patched 2% faster everywhere
    (its kernel), and a +-0.5% wobble so the run has a spread."""
    wobble = (1.0, 1.005, 0.995)
    return {(arm, w, 1.0): (10.0 + w) * (0.98 if arm == "patched" else 1.0) * wobble[(i + w) % 3]
            for i, arm in enumerate(ARMS) for w in range(6)}


def test_host_signals_give_steal_share_and_the_other_processes_cores() -> None:
    h = HostSignals(span_s=2.0, cpus=4, busy_s=3.0, steal_s=0.4, loadavg_1m=1.5, server_cpu_s=1.0,
                    engine_cpu_s=0.8, engine_pid=7)
    assert h.steal_pct == pytest.approx(5.0) and h.other_cores == pytest.approx(1.0)
    assert HostSignals.from_json(h.to_json(), "x") == h
    with pytest.raises(ValueError, match=r"replay w3: host entry lacks \['engine_pid'\]"):
        HostSignals.from_json({k: v for k, v in h.to_json().items() if k != "engine_pid"}, "replay w3")


def test_cell_excess_is_against_the_median_of_the_cells_other_arms() -> None:
    t = pd.DataFrame({"arm": ["a", "b", "c", "a", "b", "c"], "window": [0, 0, 0, 1, 1, 1], "load": [1.0] * 6,
                      "x": [10.0, 10.0, 12.0, 20.0, 20.0, 20.0]})
    plain = hostslow.cell_excess(t, "x", own_offset=False)
    mid = math.log(10 / math.sqrt(120))  # a's others are 10 and 12: their median in log space
    assert plain.tolist() == pytest.approx([mid, mid, math.log(1.2), 0, 0, 0])
    centred = hostslow.cell_excess(t, "x")  # less each arm's median over its two windows
    assert centred[2] == pytest.approx(math.log(1.2) / 2) and centred[5] == pytest.approx(-math.log(1.2) / 2)
    assert hostslow.cell_excess(t, "x", log=False, own_offset=False).tolist() == pytest.approx(
        [-1, -1, 2, 0, 0, 0])


def test_threshold_is_the_floor_for_a_quiet_run_and_robust_z_sd_for_a_noisy_one() -> None:
    assert hostslow.threshold(pd.Series([0.0, 0.01, -0.01, 0.0])) == hostslow.SPACING_FLOOR
    noisy = pd.Series([-0.1, 0.0, 0.1, 0.2, -0.2, math.nan])  # MAD 0.1, robust sd 0.14826
    assert hostslow.threshold(noisy) == pytest.approx(3.5 * 0.1 * 1.482602218505602)


def test_a_slow_replay_with_steal_is_an_episode_one_without_a_host_signal_is_not() -> None:
    spacing = quiet_run()
    spacing[("stock-b", 3, 1.0)] *= 1.3  # slowed with the hypervisor taking 4% of the machine
    spacing[("stock", 5, 1.0)] *= 1.3  # slowed, the host as in its cell's other replays
    for arm in ARMS:  # a whole cell slowed alike: its spacing does not tell it
        spacing[(arm, 4, 1.0)] *= 1.5
    df, run = make_run(spacing, {("stock-b", 3, 1.0): host(steal_s=0.8)})
    s = hostslow.episodes(df, run)
    assert s["replays"] == 18 and s["not_recorded"] == []
    assert s["thresholds"]["spacing_pct"] == pytest.approx(100 * math.expm1(hostslow.SPACING_FLOOR))
    assert [(e["arm"], e["window"]) for e in s["slow"]] == [("stock-b", 3), ("stock", 5)]
    steal, quiet = s["slow"]
    assert steal["spacing_excess_pct"] == pytest.approx(30.0, abs=1.0)
    assert steal["steal_pct"] == pytest.approx(4.0) and steal["steal_excess_points"] == pytest.approx(3.9)
    assert steal["causes"] == ["steal"] and steal["episode"]
    assert quiet["causes"] == [] and not quiet["episode"] and s["episodes"] == 1
    assert steal["started_s"] == 60.0 * sorted(spacing).index(("stock-b", 3, 1.0))


def test_more_engine_cpu_per_token_or_other_busy_cores_name_the_host() -> None:
    spacing = quiet_run()
    spacing[("stock", 2, 1.0)] *= 1.4
    spacing[("patched", 1, 1.0)] *= 1.4
    df, run = make_run(spacing, {("stock", 2, 1.0): host(engine_cpu_s=0.09),  # 3 ms a token against 2
                                 ("patched", 1, 1.0): host(busy_s=19.0)})  # others on 1.5 more cores
    s = hostslow.episodes(df, run)
    by_arm = {e["arm"]: e for e in s["slow"]}
    assert by_arm["stock"]["causes"] == ["CPU per token"]
    assert by_arm["stock"]["cpu_per_token_ms"] == pytest.approx(3.0)
    assert by_arm["stock"]["cpu_excess_pct"] == pytest.approx(50.0, abs=1.0)
    assert by_arm["patched"]["causes"] == ["other load"]
    assert by_arm["patched"]["other_cores_excess"] == pytest.approx(1.5)
    assert s["episodes"] == 2


def test_an_arms_own_faster_or_slower_steps_are_never_an_episode() -> None:
    spacing = {k: v * (1.25 if k[0] == "patched" else 1.0) for k, v in quiet_run().items()}
    df, run = make_run(spacing, {k: host(steal_s=0.8) for k in spacing if k[0] == "patched"})
    assert hostslow.episodes(df, run)["slow"] == []


def test_runs_without_host_entries_get_none_and_endpoints_say_what_was_not_recorded() -> None:
    spacing = quiet_run()
    spacing[("stock", 5, 1.0)] *= 1.3
    df, run = make_run(spacing)
    assert hostslow.episodes(df, Run(replays=[{k: v for k, v in e.items() if k != "host"}
                                             for e in run.replays])) is None
    assert hostslow.episodes(df, Run()) is None
    df, run = make_run(spacing, no_host=True)  # servers the user started: only the client's view
    s = hostslow.episodes(df, run)
    assert s["not_recorded"] == ["host signals (servers the user started): not recorded in 18 of 18 replays"]
    assert [(e["arm"], e["causes"], e["episode"]) for e in s["slow"]] == [("stock", None, False)]
    df, run = make_run(spacing, {("stock", 1, 1.0): host(engine_cpu_s=None)})
    assert hostslow.episodes(df, run)["not_recorded"] == [
        "the engine core's CPU time: not recorded in 1 of 18 replays"]
