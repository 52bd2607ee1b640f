"""Slow host episodes: the measured replays whose token spacing ran slower than their cell's other arms
while the host's own signals say the host was the cause. Named in the report, never adjusted away: the
kernel changes an arm's step rate, so no cell is corrected by an arm's own speed.

Per replay the runner records `HostSignals` (experiments.runner.hostprobe reads them from /proc); the
records give its token spacing (the median of its pooled inter-token gaps) and its output tokens. Each
signal is compared with the cell's other arms (the same requests at the same load, so the same batches):
the excess of a replay over the median of the others, less its arm's median excess at that load (the
arm's own offset, which holds the kernel's change). A replay is slow when its spacing excess passes
max(SPACING_FLOOR, ROBUST_Z robust sd of the run's spacing excesses); it ran in a slow host episode when
a host signal of the same replay passes too: the steal, the engine core's CPU time per output token or
the other processes' busy cores. An episode that slowed every arm of a cell leaves the spacing alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd
from scipy import stats as sps

from experiments.core.runfile import Run

# A replay's spacing (or CPU per token) excess counts above max(this log ratio, ROBUST_Z robust sd of the
# run's excesses): the H200 8B confirm runs' replays scatter 0.9% about their cells' other arms (robust
# sd), so 5% is over 5 sd there and above any norm kernel's effect (one replay of 288 passes in each;
# the H100 8B fuse-all runs scatter 0.5-1.0%, none of 64 passes); the H100 1B runs scatter 3.8-14%,
# where ROBUST_Z sd decides (python -m research.slowhost RUN).
SPACING_FLOOR = 0.05
ROBUST_Z = 3.5  # the modified z-score's customary outlier bound (Iglewicz and Hoaglin)
STEAL_POINTS = 1.0  # steal above the cell's other replays by this many % of the machine's CPU time
OTHER_CORES = 1.0  # other processes busy on this many cores more than in the cell's other replays
CELL = ["window", "load"]
RULE = ("a measured replay ran in a slow host episode when its token spacing (the median of its pooled "
        "inter-token gaps) was slower than the median of its cell's other arms by more than max("
        f"{100 * SPACING_FLOOR:g}%, {ROBUST_Z:g} robust sd of the run's replays), after the arm's own median "
        "offset at that load is taken off (the kernel's change of the step rate is the arm's, not an "
        "episode), and a host signal of the same replay says the host was the cause: steal at least "
        f"{STEAL_POINTS:g} point of the machine's CPU time above the cell's other replays, the engine "
        "core's CPU time per output token above theirs by the spacing's kind of threshold, or other "
        f"processes busy on at least {OTHER_CORES:g} core more. Nothing is adjusted: those replays stay in "
        "every figure. An episode that slowed every arm of a cell leaves their spacing alike and is not "
        "named here")


@dataclass(frozen=True)
class HostSignals:
    """What /proc said over one replay of a server the kit started (experiments.runner.hostprobe): the
    machine's CPU time and the server's, in seconds."""

    span_s: float  # the interval the machine's counters cover
    cpus: int  # CPUs in /proc/stat
    busy_s: float  # all CPUs' time neither idle nor waiting for I/O
    steal_s: float  # all CPUs' time the hypervisor gave to others
    loadavg_1m: float  # /proc/loadavg's 1-minute load at the end
    server_cpu_s: float  # user + system time of the server process and every descendant alive at the end
    engine_cpu_s: float | None  # of its engine-core process; None where none was found (or it restarted)
    engine_pid: int | None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping, where: str) -> HostSignals:
        """The signals of a run.json "host" entry; ValueError naming `where` and the keys wrong."""
        names = [f.name for f in fields(cls)]
        missing, unknown = [k for k in names if k not in d], sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(f"{where}: host entry lacks {missing}, has unknown {unknown}")
        return cls(**{k: d[k] for k in names})

    @property
    def steal_pct(self) -> float:
        """Steal in % of all CPUs' time over the replay."""
        return 100.0 * self.steal_s / (self.span_s * self.cpus) if self.span_s > 0 else math.nan

    @property
    def other_cores(self) -> float:
        """Cores' worth of busy time that the server's processes did not use (the kit, everything else)."""
        return (self.busy_s - self.server_cpu_s) / self.span_s if self.span_s > 0 else math.nan


def replay_table(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per measured replay (arm, window, load): its token spacing (itl_p50_ms: the median of
    the pooled gaps of its succeeded requests, NaN where none were kept) and its output tokens."""
    rows = []
    for (arm, window, load), g in measured.groupby(["arm", "window", "load"], sort=True):
        gaps = [x for lst in g.loc[g["ok"], "itl_ms"] for x in lst]
        rows.append({"arm": arm, "window": int(window), "load": float(load),
                     "itl_p50_ms": float(np.median(gaps)) if gaps else math.nan,
                     "tokens": int(g["completion_tokens"].fillna(0).sum())})
    return pd.DataFrame(rows, columns=["arm", "window", "load", "itl_p50_ms", "tokens"])


HOST_COLUMNS = ["started_s", "host", "steal_pct", "cpu_per_token_ms", "other_cores"]


def with_host(table: pd.DataFrame, run: Run) -> pd.DataFrame | None:
    """`table` with each replay's start and host signals from run.json's replays (host: recorded or not;
    steal_pct, cpu_per_token_ms: engine-core CPU time per output token, other_cores; NaN where not
    recorded); None when no replay carries a "host" entry (runs recorded before it)."""
    entries = {(e["arm"], int(e["window"]), float(e["load"])): e for e in run.replays
               if e.get("phase") == "measure"}
    if not any("host" in e for e in entries.values()):
        return None
    extra = []
    for arm, window, load, tokens in zip(table["arm"], table["window"], table["load"], table["tokens"]):
        e = entries.get((arm, window, load)) or {}
        h = (None if e.get("host") is None else
             HostSignals.from_json(e["host"], f"run.json replay of {arm} window {window} at {load:g}x"))
        cpu = None if h is None or h.engine_cpu_s is None or not tokens else 1e3 * h.engine_cpu_s / tokens
        extra.append({"started_s": e.get("started_s", math.nan), "host": h is not None,
                      "steal_pct": math.nan if h is None else h.steal_pct,
                      "cpu_per_token_ms": math.nan if cpu is None else cpu,
                      "other_cores": math.nan if h is None else h.other_cores})
    return pd.concat([table, pd.DataFrame(extra, index=table.index, columns=HOST_COLUMNS)], axis=1)


def cell_excess(table: pd.DataFrame, column: str, log: bool = True, own_offset: bool = True) -> pd.Series:
    """Each replay's `column` against the median of its cell's other arms (a log ratio, or a difference
    with `log` False), less its arm's median excess at that load with `own_offset`; NaN where the replay
    or every other arm of its cell has no value."""
    values = np.log(table[column].where(table[column] > 0)) if log else table[column]
    excess = pd.Series(math.nan, index=table.index)
    for _, cell in table.groupby(CELL, sort=False):
        for i in cell.index:
            others = values[cell.index.drop(i)].dropna()
            if len(others) and not math.isnan(values[i]):
                excess[i] = values[i] - float(others.median())
    if own_offset:
        excess -= excess.groupby([table["arm"], table["load"]]).transform("median")
    return excess


def threshold(excess: pd.Series) -> float:
    """max(SPACING_FLOOR, ROBUST_Z robust sd of the excesses) (the floor alone for fewer than 3)."""
    x = excess.dropna().to_numpy()
    sd = float(sps.median_abs_deviation(x, scale="normal")) if len(x) >= 3 else 0.0
    return max(SPACING_FLOOR, ROBUST_Z * sd)


def _not_recorded(table: pd.DataFrame) -> list[str]:
    """What the replays lack: token gaps, host signals (servers the user started), the engine core's CPU
    time (among the replays with host signals)."""
    n = len(table)
    lacking = (("token gaps", int(table["itl_p50_ms"].isna().sum())),
               ("host signals (servers the user started)", int((~table["host"]).sum())),
               ("the engine core's CPU time", int((table["host"] & table["cpu_per_token_ms"].isna()).sum())))
    return [f"{what}: not recorded in {k} of {n} replays" for what, k in lacking if k]


def episodes(measured: pd.DataFrame, run: Run) -> dict | None:
    """report.json's "slow_host": the rule, its thresholds, what was not recorded, and every replay whose
    spacing was slow, with its host signals and whether it ran in a slow host episode; None for a run
    whose replays carry no host entry (experiments.runner.hostprobe came later)."""
    table = with_host(replay_table(measured), run)
    if table is None:
        return None
    table["spacing"] = cell_excess(table, "itl_p50_ms")
    table["cpu"] = cell_excess(table, "cpu_per_token_ms")
    table["steal"] = cell_excess(table, "steal_pct", log=False, own_offset=False)
    table["others"] = cell_excess(table, "other_cores", log=False, own_offset=False)
    limit = {"spacing": threshold(table["spacing"]), "cpu": threshold(table["cpu"])}
    slow = [_slow_entry(row, limit["cpu"]) for _, row in
            table[table["spacing"] > limit["spacing"]].sort_values(["window", "load", "arm"]).iterrows()]
    return {"rule": RULE, "replays": len(table),
            "thresholds": {"spacing_pct": _pct(limit["spacing"]), "cpu_per_token_pct": _pct(limit["cpu"]),
                           "steal_points": STEAL_POINTS, "other_cores": OTHER_CORES},
            "not_recorded": _not_recorded(table), "slow": slow, "episodes": sum(s["episode"] for s in slow)}


def _slow_entry(row: pd.Series, cpu_limit: float) -> dict:
    """A slow replay's entry: its spacing and host signals against its cell's other arms, the causes the
    signals name (None where the host was not recorded) and whether it ran in a slow host episode."""
    causes = [name for name, fired in (
        ("steal", row["steal"] >= STEAL_POINTS), ("CPU per token", row["cpu"] > cpu_limit),
        ("other load", row["others"] >= OTHER_CORES)) if fired] if row["host"] else None
    return {"arm": row["arm"], "window": int(row["window"]), "load": float(row["load"]),
            "started_s": _num(row["started_s"]), "itl_p50_ms": _num(row["itl_p50_ms"]),
            "spacing_excess_pct": _pct(row["spacing"]), "steal_pct": _num(row["steal_pct"]),
            "steal_excess_points": _num(row["steal"]), "cpu_per_token_ms": _num(row["cpu_per_token_ms"]),
            "cpu_excess_pct": _pct(row["cpu"]), "other_cores_excess": _num(row["others"]),
            "causes": causes, "episode": bool(causes)}


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _pct(x: float) -> float | None:
    """A log ratio as a change in %."""
    return None if x is None or math.isnan(x) else 100.0 * math.expm1(x)
