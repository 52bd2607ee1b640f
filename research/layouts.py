"""Which resident layout reaches a verdict in the fewest GPU minutes on this GPU?

    python -m research.layouts --startcost OUT/startcost.json [--run RUN] [--out F.json]

A run compares patched with stock, the planted twin with patched and a second stock server with
stock (the A/A), each over instance pairs. Where four servers of a model do not fit the GPU, fewer
stay resident; each layout costs its server starts per instance (in waves: the kit starts servers
whose compile caches differ at once, experiments.runner.servers.cache_waves) and its replays per
compared window:

- `all`: the four resident at once (two start waves, four replays per window): where they fit;
- `trio`: {stock, patched, planted} then {stock, patched, stock-b}, the third swapped (two sets, three
  replays per window of a set: six per compared window; three waves per instance; the KV cache must
  fit three servers, so the top load is limited);
- `pairs`: {stock, stock-b}, {stock, patched}, {patched, planted} in turn (three sets of two: six
  replays per compared window; four waves per instance);
- `sleep`: the four resident with `--enable-sleep-mode`, one awake at a time (two waves, four
  replays per window, each paying a sleep and a wake).

The start and switch seconds come from `research.startcost` on the GPU; the variance components from
the committed prior (runtime_tables/instance-prior.json: instance variance between servers,
cell and request variance), the cell variance replaced by a run's own A/A or A/B cells with `--run`.
For each layout, experiments.stats.design gives the cheapest instances x windows reaching +-0.5% and
+-0.25% over instance pairs, and its GPU minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import runtime_tables
from common.jsonfile import read_json, write_json
from experiments.stats import design

PRIOR = runtime_tables.path("instance-prior.json")
TARGETS = (0.5, 0.25)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Server start waves per instance, replays per compared window and switch seconds per replay."""

    name: str
    waves: int
    replays: int
    switch: bool = False


LAYOUTS = (Layout("all", 2, 4), Layout("trio", 3, 6), Layout("pairs", 4, 6), Layout("sleep", 2, 4, True))


def wave_s(cost: dict, sleep_mode: bool) -> float:
    """Seconds of one start wave with a warm compile cache (the slowest of two at once), or the
    sleep-mode server's start."""
    return float(cost["sleep_mode_ready_s"] if sleep_mode else max(cost["wave_of_two_ready_s"]))


def switch_s(cost: dict) -> float:
    """Median seconds of one sleep plus one wake."""
    cycles = cost.get("sleep_cycles") or []
    return statistics.median(c["sleep_s"] + c["wake_s"] for c in cycles) if cycles else float("nan")


def costs_of(layout: Layout, cost: dict, base: design.Costs) -> design.Costs:
    """The prior's replay costs with this layout's starts, replays and switches."""
    start_min = layout.waves * wave_s(cost, layout.switch) / 60.0
    overhead = base.overhead_s + (switch_s(cost) if layout.switch else 0.0)
    return dataclasses.replace(base, start_min=start_min, overhead_s=overhead, arms=layout.replays)


def compare(cost: dict, prior: dict, cell_var: float | None) -> list[dict]:
    """Per layout and target: the cheapest design and its GPU minutes."""
    p = prior["plan"]
    comps = design.Components(**p["components"])
    if cell_var is not None:
        comps = dataclasses.replace(comps, cell_var=cell_var, request_var=0.0)
    base = design.Costs(**p["costs"])
    rows = []
    for layout in LAYOUTS:
        c = costs_of(layout, cost, base)
        for target in TARGETS:
            try:
                chosen = design.design_for_precision(comps, c, target)
                rows.append({"layout": layout.name, "target_pct": target, "instances": chosen["instances"],
                             "windows_per_instance": chosen["windows"], "gpu_minutes": chosen["gpu_minutes"],
                             "half_width_pct": chosen["half_width_pct"], "start_min": c.start_min})
            except ValueError as exc:
                rows.append({"layout": layout.name, "target_pct": target, "unreachable": str(exc)})
    return rows


def run_cell_var(run: Path) -> float:
    """The cell variance of a run's paired TPOT (the report's robust cell sd, `sd_cell_pct`, of its A/A
    comparison where it has one, else of its first), in log units squared."""
    rep = read_json(run / "report.json", None, "report")
    paired = rep["paired_latency"]
    aa = [lab for lab, arm in zip(rep["arm_labels"][1:], rep["arms"][1:]) if arm == rep["arms"][0]]
    sd_pct = paired[aa[0] if aa else next(iter(paired))]["tpot_ms"]["sd_cell_pct"]
    return math.log1p(sd_pct / 100.0) ** 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.layouts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--startcost", type=Path, required=True, help="research.startcost's JSON from the GPU")
    ap.add_argument("--run", type=Path, help="a run whose paired TPOT cells give the cell variance")
    ap.add_argument("--prior", type=Path, default=PRIOR, help=f"the variance prior (default {PRIOR})")
    ap.add_argument("--out", type=Path, help="write the rows here as JSON")
    a = ap.parse_args(argv)
    cost = read_json(a.startcost, 1, "start cost")
    rows = compare(cost, read_json(a.prior, 1, "instance floor"), run_cell_var(a.run) if a.run else None)
    for r in rows:
        print(json.dumps(r))
    if a.out:
        write_json(a.out, {"schema_version": 1, "startcost": str(a.startcost), "run": a.run and str(a.run),
                           "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
