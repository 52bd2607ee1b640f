"""What each placement lever does to the A/A over server instances, from A/A runs of one design.

    python -m research.instancelevers baseline=experiments/results/h100-aa3-baseline \\
        pin=experiments/results/h100-aa3-pin rotate=experiments/results/h100-aa3-rotate \\
        --out experiments/results/instance-levers.json

Each run is an A/A of several servers of one build, restarted into several instances
(`--arms stock,stock,stock --instances N`), that differs from the first (the baseline) in one lever
(`--pin-cpus`, `--start-order rotate`, ...). Per lever: each server's offset in each instance block
(the mean over the block's cells of its cell-median log TPOT minus the cell's mean over the servers:
its instance effect plus the cells' noise), the variance of those offsets pooled over the blocks
(instances x (servers - 1) degrees of freedom, every server alike), its ratio to the baseline run's
with a 95% F interval, and what the GPU recorded (SM clock after every measured replay; the restart
cost). A lever is called lower only when that interval lies below 1. Beside it, per A/A comparison,
its report's row over instance pairs (the interval over instances and within pairs, the variance
components). Writes the JSON and a markdown table beside it.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from common.cliargs import OneLineParser, command_line, fail
from common.jsonfile import ResultFileError, read_json, write_json, write_text
from experiments.core.runfile import read_run
from experiments.stats import instances
from experiments.stats.runframe import load_run


def lever_arg(text: str) -> tuple[str, Path]:
    """'NAME=RUN_DIR' -> (NAME, RUN_DIR)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=RUN_DIR like pin=experiments/results/h100-aa3-pin, got {text!r}")
    return name, Path(path)


def offset_components(df: pd.DataFrame) -> dict:
    """From load_run's frame: the variance of a server's offset within an instance block pooled over
    the blocks (`offset_var`, instances x (servers - 1) df: an instance's effect plus its cells'
    noise), the cells' share of it (`cell_noise_var`: the residuals' scatter over a block's cells,
    J / (J - 1) x var / n, the centring undone) and the instance variance the moments leave
    (`instance_var`, floored at 0)."""
    m = df[(df["phase"] == "measure") & df["succeeded"] & (df["tpot_ms"] > 0)]
    cells = (m.assign(log_tpot=np.log(m["tpot_ms"]))
             .groupby(["instance", "window", "load", "arm"])["log_tpot"].median().unstack("arm").dropna())
    resid = cells.sub(cells.mean(axis=1), axis=0).stack().rename("r").reset_index()
    by = resid.groupby(["instance", "arm"])["r"]
    offsets, n, servers = by.mean(), by.size(), cells.shape[1]
    dof = int((offsets.groupby(level="instance").size() - 1).sum())
    total = float((offsets ** 2).sum()) / dof  # offsets sum to 0 within a block: centred already
    noise = servers / (servers - 1) * float((by.var(ddof=1) / n).mean())
    per_block = [{arm: 100 * float(v) for arm, v in offsets.xs(i, level="instance").items()}
                 for i in offsets.index.unique(level="instance")]
    return {"offset_var": total, "df": dof, "cell_noise_var": noise, "instance_var": max(total - noise, 0.0),
            "servers": servers, "cells_per_block": float(n.mean()), "offsets_pct": per_block}


def ratio_interval(var: float, df: int, base_var: float, base_df: int) -> list[float]:
    """95% interval of the variance ratio var / base_var (F with df, base_df)."""
    r = var / base_var
    return [r / float(sps.f.ppf(0.975, df, base_df)), r / float(sps.f.ppf(0.025, df, base_df))]


def read_lever(name: str, run_dir: Path) -> dict:
    """One lever's rows and run-level figures, from its report.json and run.json."""
    report = read_json(run_dir / "report.json", 1, "report")
    run = read_run(run_dir)
    if not report.get("aa", {}).get("is_aa"):
        raise ValueError(f"{run_dir}: not an A/A run (every arm must run the baseline's build)")
    rows = (report.get("over_instances") or {}).get("rows") or []
    if not rows or not instances.measured_own(report["over_instances"]):
        raise ValueError(f"{run_dir}: no rows over this run's own server instances (--instances 2 or more)")
    measured = [r["gpu"] for r in run.replays if r.get("phase") == "measure" and r.get("gpu")]
    at_max = sum(g.get("clocks.sm") == g.get("clocks.max.sm") for g in measured)
    starts = [e["ready_s"] for entries in run.instances["arms"].values() for e in entries
              if e["index"] > 0]
    parts = offset_components(load_run(run_dir))
    return {"lever": name, "run": run_dir.name, "gpu": report["gpu"], "model": report["model"]["name"],
            "flags": {k: run.config[k] for k, off in (("pin_cpus", False), ("start_order", "waves"))
                      if run.config.get(k, off) != off},  # the levers set
            "placement": run.placement, "rows": rows, **parts,
            "sm_clock_at_max": [at_max, len(measured)],
            "restart_ready_s_median": statistics.median(starts) if starts else None}


def compare(levers: list[dict]) -> list[dict]:
    """Each lever's pooled offset variance against the first's: ratio, F interval and a verdict."""
    base = levers[0]
    base.update(ratio_to_baseline=1.0, ratio_ci95=None, verdict="baseline")
    for lev in levers:  # the largest ratio these degrees of freedom could call lower
        lev["detectable_ratio"] = float(sps.f.ppf(0.025, lev["df"], base["df"]))
    for lev in levers[1:]:
        lo, hi = ratio_interval(lev["offset_var"], lev["df"], base["offset_var"], base["df"])
        lev.update(ratio_to_baseline=lev["offset_var"] / base["offset_var"], ratio_ci95=[lo, hi],
                   verdict="lower" if hi < 1 else "higher" if lo > 1 else "not distinguishable")
    return levers


def markdown(doc: dict) -> str:
    """The levers' table and the rows behind it."""
    lines = [f"# Placement levers and the A/A over server instances\n\n`{doc['command']}`\n",
             "Per lever: the sd of a server's offset within an instance block (its mean cell-median log "
             "TPOT minus the cells' mean over the servers: instance effect plus cell noise), pooled over "
             "the blocks, split by moments into its cells' noise and the instance sd, and its variance as a "
             "ratio to the first lever's with a 95% F interval. Below, "
             "each A/A comparison's row over instance pairs; components: sd in % of a cell's log ratio.\n",
             "| lever | run | sd of a server's offset | of it: cells, instance | df | ratio to baseline | "
             "95% F interval | verdict | lower if the ratio is below | SM clock at max after a replay | "
             "restart (median s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lev in doc["levers"]:
        ci = "-" if lev["ratio_ci95"] is None else "[{:.2f}, {:.2f}]".format(*lev["ratio_ci95"])
        at, n = lev["sm_clock_at_max"]
        sd = {k: 100 * math.sqrt(lev[k]) for k in ("offset_var", "cell_noise_var", "instance_var")}
        lines.append(f"| {lev['lever']} | {lev['run']} | {sd['offset_var']:.2f}% | "
                     f"{sd['cell_noise_var']:.2f}%, {sd['instance_var']:.2f}% | "
                     f"{lev['df']} | {lev['ratio_to_baseline']:.2f} | {ci} | {lev['verdict']} | "
                     f"{lev['detectable_ratio']:.2f} | {at} of {n} | {lev['restart_ready_s_median']:.1f} |")
    lines += ["", "| lever | comparison | change | over instances | within pairs | instance sd | cell sd | "
              "request sd |", "|---|---|---|---|---|---|---|---|"]
    for lev in doc["levers"]:
        for r in lev["rows"]:
            c, (lo, hi), (wlo, whi) = r["components_sd_pct"], r["ci95_pct"], r["within_pair_ci95_pct"]
            lines.append(f"| {lev['lever']} | {r['comparison']} | {r['estimate_pct']:+.2f}% | "
                         f"[{lo:+.2f}, {hi:+.2f}]% | [{wlo:+.2f}, {whi:+.2f}]% | {c['instance_var']:.2f}% | "
                         f"{c['cell_var']:.2f}% | {c['request_var']:.2f}% |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write the levers' table."""
    ap = OneLineParser(prog="python -m research.instancelevers", description=__doc__.split("\n\n")[0])
    ap.add_argument("levers", nargs="+", metavar="NAME=RUN_DIR",
                    help="an A/A run per lever, the baseline (no lever) first")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write (markdown beside it, .md)")
    a = ap.parse_args(argv)
    try:
        levers = compare([read_lever(*lever_arg(text)) for text in a.levers])
    except (OSError, ValueError, KeyError, ResultFileError) as exc:
        return fail(ap.prog, str(exc))
    if len({(lev["gpu"], lev["model"]) for lev in levers}) > 1:
        return fail(ap.prog, "the runs differ in GPU or model: compare levers within one design")
    doc = {"schema_version": 1, "command": command_line(ap.prog, argv), "metric": "tpot_ms", "levers": levers}
    write_json(a.out, doc)
    write_text(a.out.with_suffix(".md"), markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
