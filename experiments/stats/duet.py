"""The duet layout: every arm on a GPU of its own, the same window replayed to all arms at once.

On one GPU the arms take turns, so a paired difference carries the time between the turns (drift,
the position effect). With N arms on N GPUs of one host, each window is replayed to every arm at
the same time, which removes order and drift from the difference; the GPUs themselves may differ,
so the arms change GPUs between windows (a crossover) and the GPU becomes a covariate.

The placement schedule is a sequence of Latin squares: in every block of N consecutive windows
each arm runs on each GPU exactly once, the blocks' row order drawn from a seeded generator and
recorded. The comparison is the paired per-request one of experiments.stats.paired, with the GPU in place
of the arm order: y = mu + beta * (gpu index of treatment - gpu index of baseline) + e, so mu is
the change with the GPU bias removed and beta the GPU bias. Pure: no I/O, no servers.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from experiments.stats import paired


@dataclass(frozen=True)
class Placement:
    """Which arm runs on which GPU during one window: `gpus[i]` serves `arms[i]`."""

    window: int
    arms: tuple[str, ...]
    gpus: tuple[int, ...]

    def gpu_of(self, arm: str) -> int:
        """The GPU that serves `arm` in this window."""
        return self.gpus[self.arms.index(arm)]

    def to_json(self) -> dict:
        """{"window", "placement": {arm: gpu}} as run.json keeps it."""
        return {"window": self.window, "placement": dict(zip(self.arms, self.gpus))}


def placements(arms: Sequence[str], gpus: Sequence[int], windows: int, seed: int) -> list[Placement]:
    """The crossover schedule of `windows` windows: blocks of len(gpus) windows, each a Latin
    square (every arm once on every GPU) whose rows are shuffled by random.Random(seed).

    Needs as many GPUs as arms, all distinct; a final partial block is the start of a shuffled one."""
    arms, gpus = tuple(arms), tuple(gpus)
    if len(arms) < 2 or len(set(arms)) != len(arms):
        raise ValueError(f"a duet needs two or more distinct arms, got {list(arms)}")
    if len(gpus) != len(arms) or len(set(gpus)) != len(gpus):
        raise ValueError(f"a duet needs one distinct GPU per arm: {len(arms)} arms, GPUs {list(gpus)}")
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    rng = random.Random(seed)
    rows = latin_rows(gpus)
    out: list[Placement] = []
    while len(out) < windows:
        shifts = list(range(len(rows)))
        rng.shuffle(shifts)
        for shift in shifts:
            if len(out) == windows:
                break
            out.append(Placement(len(out), arms, rows[shift]))
    return out


def latin_rows(gpus: Sequence[int]) -> list[tuple[int, ...]]:
    """The rows of the cyclic Latin square on `gpus`: row k gives arm i the GPU gpus[(i + k) % n], so
    across the rows every arm runs once on every GPU (the warm-up and burn-in reach every server so)."""
    n = len(gpus)
    return [tuple(gpus[(i + shift) % n] for i in range(n)) for shift in range(n)]


def balance(schedule: Sequence[Placement]) -> dict[str, dict[int, int]]:
    """Windows each arm spent on each GPU: {arm: {gpu: windows}}."""
    out: dict[str, dict[int, int]] = {}
    for p in schedule:
        for arm, gpu in zip(p.arms, p.gpus):
            out.setdefault(arm, {}).setdefault(gpu, 0)
            out[arm][gpu] += 1
    return out


def gpu_sequences(schedule: Sequence[Placement],
                  loads: Sequence[float]) -> dict[tuple[int, float], list[str]]:
    """{(window, load): the arms ordered by the GPU index serving them}: the covariate
    experiments.stats.paired reads as an order (its "position" is then the GPU's effect)."""
    out = {}
    for p in schedule:
        by_gpu = [arm for _, arm in sorted(zip(p.gpus, p.arms))]
        out.update({(p.window, float(load)): by_gpu for load in loads})
    return out


def compare(df: pd.DataFrame, baseline: str, treatment: str, schedule: Sequence[Placement],
            loads: Sequence[float], seed: int = 0) -> dict[str, dict]:
    """Paired per-request comparison of TPOT, TTFT and E2E for a duet run, the GPU as covariate.

    Each metric's result is experiments.stats.paired.compare_metric's, with its position fields renamed:
    `gpu_bias_pct` (the change a later GPU index shows against an earlier one) and its interval."""
    seq = gpu_sequences(schedule, loads)
    out = {}
    for metric in paired.METRICS:
        res = paired.compare_metric(df, baseline, treatment, metric, seq, seed)
        res["gpu_bias_pct"] = res.pop("position_pct")
        res["gpu_bias_ci95_pct"] = res.pop("position_ci95_pct")
        if "position_reason" in res:
            res["gpu_bias_reason"] = res.pop("position_reason").replace("arm order", "GPU placement")
        res["covariate"] = "gpu"
        out[metric] = res
    return out


def schedule_record(schedule: Sequence[Placement], seed: int) -> dict:
    """What run.json keeps of the schedule: the seed, every window's placement and the balance."""
    return {"seed": seed, "windows": [p.to_json() for p in schedule],
            "balance": {arm: {str(g): n for g, n in per.items()} for arm, per in balance(schedule).items()}}


def from_record(record: Mapping) -> list[Placement]:
    """The schedule back from schedule_record's dict (for re-analysis)."""
    return [Placement(int(w["window"]), tuple(w["placement"]), tuple(int(g) for g in w["placement"].values()))
            for w in record["windows"]]
