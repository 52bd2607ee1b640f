"""Where a paired latency interval's width comes from: single requests' scatter, or whole cells'.

    python -m research.cellnoise experiments/results/h200-llama8b-confirm --arms stock,stock-b

For two arms of a run (an A/A pair shows the floor), per load: the paired cells (window x load),
paired requests per cell, the per-request sd of the log ratio (experiments.stats.paired.request_pairs), the
sd of a cell's median that this per-request scatter alone predicts (1.2533 x sd / sqrt(n), the
median's large-sample factor), and the sd of the cell medians observed around their load's mean.
Where the two agree, the floor falls with the number of paired requests (longer windows or more of
them); where the observed sd is larger, cells carry noise of their own (a replay's server state)
that only more cells average out. Then the per-request sd by output length, where the scatter sits,
and the cell-to-cell sd the paired analysis's median gives against a Hodges-Lehmann or mean summary
of the same cells (which summary makes the narrowest interval on this run's noise).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from common.cliargs import fail
from experiments.core.rundir import RECORD_FILES, load_records
from experiments.stats import goodput, paired

MEDIAN_FACTOR = math.sqrt(math.pi / 2)  # sd of a sample median / sd of a sample mean, normal data
OUTPUT_BINS = (1, 8, 32, 64, 128, 1 << 20)  # output tokens: (1, 8], (8, 32], ...
METRICS = ("tpot_ms", "ttft_ms", "e2e_ms")


def paired_requests(frame: pd.DataFrame, baseline: str, other: str, metric: str) -> pd.DataFrame:
    """The measured requests both arms completed: window, load, index, log_ratio, output_tokens."""
    measured, _ = goodput.split_phases(frame)
    pairs = paired.request_pairs(measured, baseline, other, metric)
    tokens = measured.loc[measured["arm"] == baseline, [*paired.PAIR_KEY, "output_tokens"]]
    return pairs.merge(tokens, on=paired.PAIR_KEY, how="left")


def per_load(pairs: pd.DataFrame) -> list[dict]:
    """Per load: cells, requests per cell, per-request sd, predicted and observed sd of cell medians
    (fractions of the log ratio; cells of one request give no per-request sd and are left out)."""
    rows = []
    for load, g in pairs.groupby("load", sort=True):
        cells = g.groupby("window")["log_ratio"]
        n, sd = cells.size(), cells.std()
        keep = n >= 2
        medians = cells.median()[keep]
        predicted = MEDIAN_FACTOR * sd[keep] / np.sqrt(n[keep])
        rows.append({"load": float(load), "cells": int(keep.sum()),
                     "requests_per_cell": float(n[keep].mean()),
                     "per_request_sd": float(g["log_ratio"].std()),
                     "predicted_cell_sd": float(np.sqrt((predicted ** 2).mean())) if keep.any() else math.nan,
                     "observed_cell_sd": float(medians.std()) if keep.sum() >= 2 else math.nan})
    return rows


def by_output_tokens(pairs: pd.DataFrame) -> list[dict]:
    """Per-request sd of the log ratio per output-length bin (OUTPUT_BINS), bins with 2+ requests."""
    bins = pd.cut(pairs["output_tokens"], OUTPUT_BINS)
    out = []
    for interval, g in pairs.groupby(bins, observed=True):
        if len(g) >= 2:
            out.append({"output_tokens": f"{int(interval.left) + 1}-{int(interval.right)}",
                        "requests": len(g), "per_request_sd": float(g["log_ratio"].std())})
    return out


def hodges_lehmann(values: np.ndarray) -> float:
    """Median of the Walsh averages (x_i + x_j) / 2, i <= j: the one-sample Hodges-Lehmann estimate."""
    i, j = np.triu_indices(len(values))
    return float(np.median((values[i] + values[j]) / 2.0))


SUMMARIES = {"median": np.median, "Hodges-Lehmann": hodges_lehmann, "mean": np.mean}


def summary_spread(pairs: pd.DataFrame) -> dict[str, float]:
    """Per cell summary (median, the paired analysis's; Hodges-Lehmann; mean): the sd of the cells'
    values around their load's mean, pooled over loads (cells of 2+ requests). The smaller it is, the
    narrower the paired interval that summary gives over the same cells."""
    g = pairs.groupby(["load", "window"])["log_ratio"]
    keep = g.size() >= 2
    out = {}
    for name, fn in SUMMARIES.items():
        cell = g.agg(lambda v, f=fn: f(v.to_numpy()))[keep]
        resid = cell - cell.groupby(level="load").transform("mean")
        dof = len(cell) - cell.index.get_level_values("load").nunique()
        out[name] = float(np.sqrt((resid ** 2).sum() / dof)) if dof > 0 else math.nan
    return out


def render(run_dir: Path, baseline: str, other: str, metric: str, loads: list[dict], bins: list[dict],
           spread: dict[str, float]) -> str:
    """The console text: one line per load, one per output-length bin, one per cell summary (percent)."""
    lines = [f"{run_dir}: {other} vs {baseline}, per-request log ratio of {metric}"]
    for r in loads:
        lines.append(f"  load {r['load']:g}x: {r['cells']} cells of {r['requests_per_cell']:.0f} paired "
                     f"requests; per request sd {100 * r['per_request_sd']:.2f}%; cell medians sd "
                     f"{100 * r['observed_cell_sd']:.2f}% observed, {100 * r['predicted_cell_sd']:.2f}% "
                     "from the per-request scatter alone")
    lines.append("  per request sd by output tokens: " + ", ".join(
        f"{b['output_tokens']}: {100 * b['per_request_sd']:.1f}% ({b['requests']})" for b in bins))
    lines.append("  cell-to-cell sd by cell summary (pooled over loads): " + ", ".join(
        f"{name} {100 * v:.2f}%" for name, v in spread.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the decomposition of one run's paired metric for two of its arms."""
    ap = argparse.ArgumentParser(
        prog="python -m research.cellnoise", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="a run directory with requests.jsonl.xz")
    ap.add_argument("--arms", default="stock,stock-b",
                    help="BASELINE,OTHER: the two arm labels to pair (default stock,stock-b: the run's A/A)")
    ap.add_argument("--metric", choices=METRICS, default="tpot_ms", help="latency metric (default tpot_ms)")
    a = ap.parse_args(argv)
    names = a.arms.split(",")
    if len(names) != 2 or not all(names):
        ap.error(f"--arms {a.arms!r}: expected two labels, BASELINE,OTHER")
    records, source = load_records(a.run_dir)
    if source is None:
        return fail(ap.prog, f"{a.run_dir}: no {', '.join(RECORD_FILES)}")
    frame = goodput.records_frame(records, [])
    absent = [n for n in names if n not in set(frame["arm"])]
    if absent:
        return fail(ap.prog, f"{a.run_dir}/{source}: no records of arm {absent[0]!r} (arms: "
                             f"{', '.join(sorted(set(frame['arm'])))})")
    pairs = paired_requests(frame, names[0], names[1], a.metric)
    print(render(a.run_dir, names[0], names[1], a.metric, per_load(pairs), by_output_tokens(pairs),
                 summary_spread(pairs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
