"""The knee search on the baseline arm (phase "knee"): replay the windows experiments.stats.knee
.search_windows picks at each factor, pool their attainment per SLO tier and their send lateness, and
go on by experiments.stats.knee.next_factor: through the listed --knee factors, then at 1.5x the last
while every tier is still met, until a tier fails, the client sends a factor's replays late
(--knee-lateness-ms) or --knee-max is reached. What it returns is run.json's "knee".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from experiments.core.schedule import KNEE_PROMPT_SEEDS
from experiments.core.slo import meets
from experiments.runner.config import RunConfig
from experiments.runner.plan import Window
from experiments.stats import knee
from loadgen.records import RequestRecord, lateness_ms

log = logging.getLogger("experiments")

# Replays one window at a factor (the factor's index in the search second) and returns its records.
Replay = Callable[[float, int, Window], list[RequestRecord]]


def search(cfg: RunConfig, windows: Sequence[Window], replay: Replay) -> dict:
    """Search cfg.knee_factors and past them on the windows of the run; the record of every factor
    searched (attainment per tier in "points", send lateness in "lateness"), why the search stopped,
    the knees and the loads chosen (experiments.stats.knee.choose_loads)."""
    slos = list(cfg.slos)
    picked = [windows[i] for i in knee.search_windows([len(w.requests) for w in windows])]
    listed = list(cfg.knee_factors or ())
    points: dict[str, list[tuple[float, float]]] = {s.name: [] for s in slos}
    searched: list[float] = []
    lateness: list[dict] = []
    factor: float | None = listed[0]
    stopped: dict = {}
    while factor is not None:
        per_window = [replay(factor, len(searched), w) for w in picked]
        records = [r for rs in per_window for r in rs]
        for s in slos:
            points[s.name].append((factor, sum(meets(r, s) for r in records) / len(records)))
        late = knee.lateness_figures([[x for r in rs if (x := lateness_ms(r)) is not None]
                                      for rs in per_window])
        searched.append(factor)
        lateness.append({"factor": factor, **late})
        attainment = {name: p[-1][1] for name, p in points.items()}
        nxt, why = knee.next_factor(factor, attainment, knee.client_late(late, cfg.knee_lateness_ms), listed,
                                    cfg.knee_max)
        if why is not None:
            stopped = {"reason": why, "factor": factor}
            log.info("knee search: %s", knee.stop_line(stopped, late, cfg.knee_lateness_ms))
        elif nxt not in listed:
            log.info("knee search: every tier met at %gx; searching %gx too", factor, nxt)
        factor = nxt
    knees = {name: knee.knee(p) for name, p in knee.on_time(points, stopped).items()}
    chosen = knee.choose_loads(knees, slos, searched)
    return {"factors": searched, "listed": listed, "arm": cfg.labels[0], "windows": [w.id for w in picked],
            "points": points, "knees": knees, **chosen, "loads_before": list(cfg.loads),
            "prompt_seeds": KNEE_PROMPT_SEEDS, "max_factor": cfg.knee_max,
            "lateness_target_ms": cfg.knee_lateness_ms, "lateness": lateness, "stopped": stopped}
