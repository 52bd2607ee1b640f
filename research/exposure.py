"""Where a treatment's cost lies: the paired TPOT change by a request's exposure to prefills.

A request's decode steps are pure decode steps unless another request's prefill joins them. Its
exposure is the number of other requests that became due while it decoded (first to last token in
the baseline's replay) per decode step (output tokens - 1): an estimate of the share of its steps
that carried a prefill. If a treatment costs more in mixed or prefill steps than in decode steps, the
per-request log TPOT ratio grows with exposure; if the cost sits in the decode steps (or in the
server as a whole), it does not. This is a diagnosis beside the report, not a verdict:

    python -m research.exposure experiments/results/h200-llama8b-confirm2 --arm planted:3us

prints, per load, the median change of the least, middle and most exposed third of the requests,
the decode time added per token (median and mean request) and the change of the total decode time,
and the slope of the change on exposure with cell (window, load) effects removed, with its 95% t
interval; then the same thirds by concurrency (how many other requests decoded beside it), with the
median decode time added per token: a delay of d per norm call in every step adds at most calls x d
per token to a request whose steps all carry it (a planted arm delays only the step sizes its policy
fuses), so more than that says the server passed on more than the step's delay. A slower step
also keeps a request decoding longer, so more prefills join its steps: the prefill feedback splits
the added time into that part (the extra arrivals times what an arrival costs a request in the
baseline) and the remainder, the one the calls x d bound applies to; that split is fitted across
requests, and research.plantedsim models the same feedback through the scheduler instead (on the
committed runs it finds much less of it). Pure functions; `main` reads the run with
experiments.load_run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from common.cliargs import fail
from common.tstats import t_interval
from experiments.stats.paired import PAIR_KEY, pct, request_pairs

THIRDS = ("least", "middle", "most")


def decode_arrivals(df: pd.DataFrame, arm: str) -> pd.Series:
    """Per request of `arm` (indexed by window, load, index): how many requests of its cell became due
    while it decoded (first to last token) in that arm's replay; NaN where it has no first or last token."""
    parts = []
    for _, g in df[df["arm"] == arm].groupby(["window", "load"]):
        due = np.sort(g["due_ms"].to_numpy())
        start, end = (g["due_ms"] + g["ttft_ms"]).to_numpy(), (g["due_ms"] + g["e2e_ms"]).to_numpy()
        count = np.searchsorted(due, end) - np.searchsorted(due, start)
        parts.append(pd.Series(np.where(np.isfinite(start) & np.isfinite(end), count, np.nan),
                               index=pd.MultiIndex.from_frame(g[PAIR_KEY])))
    return pd.concat(parts) if parts else pd.Series(dtype=float)


def exposure_frame(df: pd.DataFrame, baseline: str, treatment: str) -> pd.DataFrame:
    """Per request paired in both arms (measured rows of `df`, a goodput.records_frame with `ok`):
    window, load, index, the TPOT log ratio, the decode time added per token (us), the baseline's TPOT,
    decode steps and decode time (ms), its exposure to prefills (see the module text), its concurrency:
    how many other requests of its cell were decoding (first to last token) on average while it
    decoded, in the baseline's replay, and the requests that became due while it decoded in each arm's
    replay (`arrived`, `arrived_treated`). Only requests with a TPOT pair, so every one has at least
    one decode step."""
    pairs = request_pairs(df, baseline, treatment, "tpot_ms").set_index(PAIR_KEY)
    base = df[df["arm"] == baseline].set_index(PAIR_KEY)
    decoding = base[base["ok"] & base["ttft_ms"].notna() & base["e2e_ms"].notna()]
    spans = {cell: ((g["due_ms"] + g["ttft_ms"]).to_numpy(), (g["due_ms"] + g["e2e_ms"]).to_numpy())
             for cell, g in decoding.groupby(level=[0, 1])}
    base = base.loc[pairs.index]
    start, end = base["due_ms"] + base["ttft_ms"], base["due_ms"] + base["e2e_ms"]
    together = pd.Series(0.0, index=pairs.index)
    for cell, idx in pairs.groupby(level=[0, 1]).groups.items():
        s, e = start[idx].to_numpy(), end[idx].to_numpy()
        s_all, e_all = spans[cell]
        overlap = np.clip(np.minimum(e_all[None, :], e[:, None]) - np.maximum(s_all[None, :], s[:, None]),
                          0.0, None).sum(axis=1) - (e - s)  # less its own span
        together[idx] = overlap / np.where(e > s, e - s, np.nan)
    arrived = decode_arrivals(df, baseline).reindex(pairs.index)
    steps = base["output_tokens"] - 1
    return pairs.assign(added_us=1000.0 * base["tpot_ms"] * np.expm1(pairs["log_ratio"]),
                        tpot_ms=base["tpot_ms"], steps=steps, decode_ms=base["tpot_ms"] * steps,
                        exposure=arrived / steps, concurrency=together, arrived=arrived,
                        arrived_treated=decode_arrivals(df, treatment).reindex(pairs.index)).reset_index()


def by_third(frame: pd.DataFrame, column: str = "exposure") -> list[dict]:
    """Per load: for the third of the requests lowest, middle and highest in `column` (exposure or
    concurrency), n, its mean, the median baseline TPOT (ms), the median decode time added per token
    (us) and the median change (%)."""
    rows = []
    for load, g in frame.groupby("load", sort=True):
        third = pd.qcut(g[column].rank(method="first"), 3, labels=list(THIRDS))
        for name, part in g.groupby(third, observed=True):
            rows.append({"load": float(load), "third": str(name), "n": len(part),
                         column: float(part[column].mean()), "tpot_ms": float(part["tpot_ms"].median()),
                         "added_us": float(part["added_us"].median()),
                         "median_change_pct": float(pct(part["log_ratio"].median()))})
    return rows


def slope(frame: pd.DataFrame, confidence: float = 0.95) -> dict:
    """Least-squares slope of the log ratio (%) on exposure within cells (both demeaned per window and
    load), with its t interval; None fields when the exposure does not vary."""
    cells = frame.groupby(["window", "load"])
    y = 100.0 * (frame["log_ratio"] - cells["log_ratio"].transform("mean")).to_numpy()
    x = (frame["exposure"] - cells["exposure"].transform("mean")).to_numpy()
    dof = len(frame) - cells.ngroups - 1
    sxx = float(x @ x)
    if dof < 1 or sxx == 0.0:
        return {"slope_pct": None, "ci95_pct": None, "n": len(frame), "cells": cells.ngroups}
    b = float(x @ y) / sxx
    resid = y - b * x
    se = float(np.sqrt(resid @ resid / dof / sxx))
    return {"slope_pct": b, "ci95_pct": list(t_interval(b, se, dof, confidence)), "n": len(frame),
            "cells": cells.ngroups}


def prefill_feedback(frame: pd.DataFrame) -> list[dict]:
    """Per load, for all requests and for each concurrency third of an exposure_frame: the decode time
    added per token (us) split into the part a longer decode bought from other requests' prefills and
    the rest. A treatment that slows the steps keeps a request decoding longer, so more requests become
    due meanwhile and their prefills join its steps. Each such arrival costs a request `cost_ms` of
    decode time in the baseline (least squares per load of decode time on decode steps and arrivals,
    no intercept); cost_ms x (arrivals in the treatment's replay - in the baseline's) per decode step is
    the feedback, and added - feedback the remainder, which a planted delay of d per norm call bounds
    by calls x d. The fit is cross-sectional (a request that decodes long also sees more arrivals), so
    this is a diagnosis, not a verdict."""
    rows = []
    for load, g in frame.dropna(subset=["arrived", "arrived_treated"]).groupby("load", sort=True):
        x = g[["steps", "arrived"]].to_numpy(dtype=float)
        if len(g) < 3 or np.linalg.matrix_rank(x) < 2:
            continue
        cost_ms = float(np.linalg.lstsq(x, g["decode_ms"].to_numpy(dtype=float), rcond=None)[0][1])
        feedback = 1000.0 * cost_ms * (g["arrived_treated"] - g["arrived"]) / g["steps"]
        third = pd.qcut(g["concurrency"].rank(method="first"), 3, labels=list(THIRDS))
        thirds = g.groupby(third, observed=True).groups
        parts = [("all", g.index), *((str(name), idx) for name, idx in thirds.items())]
        for name, idx in parts:
            added, fb = g.loc[idx, "added_us"], feedback.loc[idx]
            rows.append({"load": float(load), "part": name, "n": len(idx), "cost_ms": cost_ms,
                         "added_us_median": float(added.median()), "added_us_mean": float(added.mean()),
                         "feedback_us_mean": float(fb.mean()),
                         "remainder_us_median": float((added - fb).median()),
                         "remainder_us_mean": float((added - fb).mean())})
    return rows


def added_per_token(frame: pd.DataFrame) -> list[dict]:
    """Per load of an exposure_frame: the decode time the treatment added per decode token (us; median
    and mean over requests) and the change of the total decode time (%), which weights each request by
    its decode time, beside the median request's TPOT change (%). The two differ where the change is
    not the same for short- and long-TPOT requests, so a prediction of totals is not one of the median
    request."""
    rows = []
    for load, g in frame.groupby("load", sort=True):
        added_ms = (g["added_us"] * g["steps"]).sum() / 1000.0
        rows.append({"load": float(load), "n": len(g), "added_us_median": float(g["added_us"].median()),
                     "added_us_mean": float(g["added_us"].mean()),
                     "total_change_pct": float(100.0 * added_ms / g["decode_ms"].sum()),
                     "median_request_change_pct": float(pct(g["log_ratio"].median()))})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.exposure", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a run directory (run.json and requests.jsonl.xz)")
    ap.add_argument("--arm", required=True, help="the treatment arm's label, as the report names it")
    ap.add_argument("--baseline", default=None, help="the baseline arm's label (default: the run's first)")
    a = ap.parse_args(argv)
    from common.jsonfile import ResultFileError
    from experiments.core.runfile import read_run
    from experiments.stats.runframe import load_run

    try:
        run = read_run(a.run)
        df = load_run(a.run)
    except (FileNotFoundError, ValueError, ResultFileError) as exc:
        return fail(ap.prog, str(exc))
    baseline = a.baseline or run.arm_labels[0]
    labels = set(df["arm"])
    for flag, label in (("--arm", a.arm), ("--baseline", baseline)):
        if label not in labels:
            return fail(ap.prog, f"{flag} {label!r} is not an arm of {a.run} "
                                 f"(arms: {', '.join(sorted(labels))})")
    measured = df[df["phase"] == "measure"].rename(columns={"succeeded": "ok"})
    frame = exposure_frame(measured, baseline, a.arm)
    print(f"{a.arm} vs {baseline}, TPOT paired per request, by exposure to prefills "
          "(requests due during its decode, per decode step)")
    for row in by_third(frame):
        print(f"  {row['load']:g}x {row['third']:>6} third: n {row['n']:4d}, exposure {row['exposure']:.3f}, "
              f"median change {row['median_change_pct']:+.2f}%")
    for row in added_per_token(frame):
        print(f"  {row['load']:g}x added decode time per token: median {row['added_us_median']:+.0f} us, "
              f"mean {row['added_us_mean']:+.0f} us; total decode time {row['total_change_pct']:+.2f}%, "
              f"median request {row['median_request_change_pct']:+.2f}%")
    print(f"{a.arm} vs {baseline}, by concurrency (other requests decoding beside it in {baseline}'s "
          "replay)")
    for row in by_third(frame, "concurrency"):
        print(f"  {row['load']:g}x {row['third']:>6} third: n {row['n']:4d}, "
              f"beside {row['concurrency']:5.1f} others, TPOT {row['tpot_ms']:.2f} ms, "
              f"added {row['added_us']:+.0f} us per token, "
              f"median change {row['median_change_pct']:+.2f}%")
    print(f"{a.arm} vs {baseline}, decode time added per token less what its longer decode bought from "
          "others' prefills (prefill feedback)")
    for row in prefill_feedback(frame):
        print(f"  {row['load']:g}x {row['part']:>6}: n {row['n']:4d}, {row['cost_ms']:.1f} ms per arrival; "
              f"added median {row['added_us_median']:+.0f} / mean {row['added_us_mean']:+.0f} us, "
              f"feedback mean {row['feedback_us_mean']:+.0f} us, remainder median "
              f"{row['remainder_us_median']:+.0f} / mean {row['remainder_us_mean']:+.0f} us")
    s = slope(frame)
    if s["slope_pct"] is None:
        print("  slope: none (exposure does not vary)")
    else:
        lo, hi = s["ci95_pct"]
        print(f"  slope within cells: {s['slope_pct']:+.2f}% per unit of exposure, 95% CI "
              f"[{lo:+.2f}, {hi:+.2f}] ({s['n']} requests, {s['cells']} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
