"""Resident sets: fewer servers on the GPU at once than the run has arms (`--resident K`).

The comparisons a run must measure together (experiments.stats.comparisons.required_pairs: the
baseline with the primary arm and every other arm, a planted arm with its twin instead, the A/A) are
covered by sets of at most K labels (experiments.core.schedule.cover), the first holding the baseline
(the knee search runs on it) and each label's sets consecutive, so that every arm starts once per
server instance. Every instance block of windows is cut into one equal sub-block per set; a
sub-block's cells are replayed by that set's arms only (experiments.core.schedule.build_schedule).
The runner swaps servers between sets: it stops those the next set does not hold and starts the ones
it lacks (each warmed up and burnt in as a fresh server is); at a new instance it stops every server
and starts the first set's. run.json "resident_sets" records the sets; its schedule records each
cell's order, which holds only the arms that replay it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from experiments.core.runfile import Run
from experiments.core.schedule import cover
from experiments.runner.config import ConfigError, RunConfig
from experiments.runner.servers import start_waves
from experiments.stats.comparisons import required_pairs

Sets = tuple[tuple[str, ...], ...]


def run_like(cfg: RunConfig) -> Run:
    """What experiments.stats reads of a run's arms (run.json's arm_labels, arms, arm_definitions), from
    the config, before any run.json exists."""
    return Run(arm_labels=list(cfg.labels), arms=list(cfg.arms),
               arm_definitions={lab: arm.to_json() for lab, arm in cfg.arms_by_label})


def sets(cfg: RunConfig, most: int | None = None) -> Sets:
    """The run's resident sets in the order they take the GPU: every label as one set unless --resident
    (or `most`, a count decided before the run's config is made: readiness.sized) is below the number of
    arms; ConfigError when no order of sets of that size covers the comparisons."""
    most = cfg.resident if most is None else most
    if most is None or most >= len(cfg.labels):
        return (tuple(cfg.labels),)
    try:
        return cover(cfg.labels, required_pairs(run_like(cfg)), most)
    except ValueError as exc:
        raise ConfigError(f"--resident {most}: {exc}") from None


def describe(found: Sets) -> str:
    """The sets as text: 'stock, stock-b | stock, patched'."""
    return " | ".join(", ".join(s) for s in found)


def check(cfg: RunConfig, n_instances: int) -> None:
    """ConfigError when the windows of every instance do not split into one equal sub-block per set,
    naming the multiple of --windows to give."""
    found = sets(cfg)
    per = len(found) * n_instances
    if len(found) > 1 and cfg.windows % per:
        raise ConfigError(f"--resident {cfg.resident}: --windows {cfg.windows} does not split into "
                          f"{n_instances} instance(s) x {len(found)} resident sets ({describe(found)}), "
                          f"every set replaying the same number of windows: give a multiple of {per}")


def fit_windows(windows: int, n_instances: int, windows_given: bool, found: Sets) -> int:
    """The run's windows: a default --windows rounded up to the next multiple of instances x resident
    sets `found` (said on stderr by the CLI); as they are when given (check refuses them) or already split."""
    per = len(found) * n_instances
    if windows_given or windows % per == 0:
        return windows
    return math.ceil(windows / per) * per


def new_per_set(found: Sets) -> list[list[str]]:
    """The servers each set starts in one instance: the first set's, then each later set's new ones."""
    return [[lab for lab in s if lab not in up] for up, s in zip(((),) + tuple(found[:-1]), found)]


def start_waves_per_instance(cfg: RunConfig, found: Sets) -> int:
    """Server start waves in one instance: each set's new servers (new_per_set), in the waves of
    experiments.runner.servers.start_waves (a wave's servers start together: one start time)."""
    return sum(len(start_waves(cfg, new)) for new in new_per_set(found) if new)


def servers_per_instance(found: Sets) -> int:
    """Servers started in one instance (new_per_set)."""
    return sum(len(new) for new in new_per_set(found))


def replays_per_window(found: Sequence[Sequence[str]]) -> float:
    """Arms that replay each cell, on average over the sets (each set replays an equal share)."""
    return sum(len(s) for s in found) / len(found)
