"""What each placement lever does to the A/A over server instances, from A/A runs of one design.

    python -m research.instancelevers baseline=experiments/results/h100-aa3-baseline \\
        pin=experiments/results/h100-aa3-pin rotate=experiments/results/h100-aa3-rotate \\
        --out experiments/results/instance-levers.json

Each run is an A/A of several servers of one build, restarted into several instances
(`--arms stock,stock,stock --instances N`), that differs from the first (the baseline) in one lever
(`--pin-cpus`, `--start-order rotate`, ...). Per A/A comparison its report's row over instance pairs:
the estimate, the interval over instances and within pairs, and the variance components (instance,
cell, request). Per lever: the variance of the instance-pair means that the interval over instances
carries (from each row's interval, pooled over the run's rows), its ratio to the baseline's with a
95% F interval, and what the GPU recorded (SM clock after every measured replay; the restart cost).
The rows of one run share its first server, so their pooled degrees of freedom overstate the
information and the F interval is narrower than it should be: a lever is called lower only when even
that interval lies below 1. Writes the JSON and a markdown table beside it.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from scipy import stats as sps

from common.cliargs import OneLineParser, command_line, fail
from common.jsonfile import ResultFileError, read_json, write_json, write_text
from experiments.stats import instances


def lever_arg(text: str) -> tuple[str, Path]:
    """'NAME=RUN_DIR' -> (NAME, RUN_DIR)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=RUN_DIR like pin=experiments/results/h100-aa3-pin, got {text!r}")
    return name, Path(path)


def pair_mean_var(row: dict) -> float:
    """The variance of one instance pair's mean log ratio that a row's interval over instances implies:
    n (half-width / t)^2 on the log scale."""
    lo, hi = (math.log1p(x / 100) for x in row["ci95_pct"])
    t = float(sps.t.ppf(0.975, row["df"]))
    return row["instance_pairs"] * ((hi - lo) / 2 / t) ** 2


def ratio_interval(var: float, df: int, base_var: float, base_df: int) -> list[float]:
    """95% interval of the variance ratio var / base_var (F with df, base_df)."""
    r = var / base_var
    return [r / float(sps.f.ppf(0.975, df, base_df)), r / float(sps.f.ppf(0.025, df, base_df))]


def read_lever(name: str, run_dir: Path) -> dict:
    """One lever's rows and run-level figures, from its report.json and run.json."""
    report = read_json(run_dir / "report.json", 1, "report")
    run = read_json(run_dir / "run.json", 1, "run record")
    if not report.get("aa", {}).get("is_aa"):
        raise ValueError(f"{run_dir}: not an A/A run (every arm must run the baseline's build)")
    rows = (report.get("over_instances") or {}).get("rows") or []
    if not rows or not instances.measured_own(report["over_instances"]):
        raise ValueError(f"{run_dir}: no rows over this run's own server instances (--instances 2 or more)")
    measured = [r["gpu"] for r in run.get("replays", []) if r.get("phase") == "measure" and r.get("gpu")]
    at_max = sum(g.get("clocks.sm") == g.get("clocks.max.sm") for g in measured)
    starts = [e["ready_s"] for entries in run["instances"]["arms"].values() for e in entries
              if e["index"] > 0]
    variances = [pair_mean_var(r) for r in rows]
    return {"lever": name, "run": run_dir.name, "gpu": report["gpu"], "model": report["model"]["name"],
            "flags": {k: v for k, v in run["config"].items() if k in ("pin_cpus", "start_order")},
            "placement": run.get("placement"), "rows": rows,
            "pair_mean_var": statistics.fmean(variances),
            "df": sum(r["instance_pairs"] - 1 for r in rows),
            "sm_clock_at_max": [at_max, len(measured)],
            "restart_ready_s_median": statistics.median(starts) if starts else None}


def compare(levers: list[dict]) -> list[dict]:
    """Each lever's pooled pair-mean variance against the first's: ratio, F interval and a verdict."""
    base = levers[0]
    base.update(ratio_to_baseline=1.0, ratio_ci95=None, verdict="baseline")
    for lev in levers:  # the largest ratio these degrees of freedom could call lower
        lev["detectable_ratio"] = float(sps.f.ppf(0.025, lev["df"], base["df"]))
    for lev in levers[1:]:
        lo, hi = ratio_interval(lev["pair_mean_var"], lev["df"], base["pair_mean_var"], base["df"])
        lev.update(ratio_to_baseline=lev["pair_mean_var"] / base["pair_mean_var"], ratio_ci95=[lo, hi],
                   verdict="lower" if hi < 1 else "higher" if lo > 1 else "not distinguishable")
    return levers


def markdown(doc: dict) -> str:
    """The levers' table and the rows behind it."""
    lines = [f"# Placement levers and the A/A over server instances\n\n`{doc['command']}`\n",
             "Per lever: the variance of an instance pair's mean log ratio (paired TPOT) that the "
             "interval over instances carries, pooled over the run's A/A rows, as a ratio to the first "
             "lever's with a 95% F interval on the pooled degrees of freedom (the rows share the run's "
             "first server, so the interval is narrower than it should be). Components: sd in % of a "
             "cell's log ratio.\n",
             "| lever | run | sd of a pair mean | df | ratio to baseline | 95% F interval | verdict | "
             "lower if the ratio is below | SM clock at max after a replay | restart (median s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for lev in doc["levers"]:
        ci = "-" if lev["ratio_ci95"] is None else "[{:.2f}, {:.2f}]".format(*lev["ratio_ci95"])
        at, n = lev["sm_clock_at_max"]
        lines.append(f"| {lev['lever']} | {lev['run']} | {100 * math.sqrt(lev['pair_mean_var']):.2f}% | "
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
