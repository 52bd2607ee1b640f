"""Do the knee search's windows stand for the measured ones? Re-derived from committed runs.

    python -m research.kneewindows experiments/results/h200-llama8b-confirm2 [more runs]
    python -m research.kneewindows RUN --quantiles 0.25,0.5,0.75 --quantiles 0.1,0.3,0.5,0.7,0.9

For each run and each quantile set, the windows `experiments.stats.knee.search_windows` would pick from the
measured windows' request counts, the baseline arm's attainment pooled over those windows at each
measured load minus the same over all measured windows (the bias a search on them carries), and the
knee both give. Reads the records only; what `SEARCH_QUANTILES` was chosen from.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from common.cliargs import fail
from experiments.core.runfile import read_run
from experiments.core.slo import load_slo_file
from experiments.stats import knee
from experiments.stats.runframe import load_run


def measured_requests(run_dir: Path) -> pd.DataFrame:
    """The measured requests of the run's first label, its baseline (experiments.stats.runframe)."""
    baseline = read_run(run_dir).arm_labels[0]
    df = load_run(run_dir)
    m = df[(df.phase == "measure") & (df.arm == baseline)]
    if m.empty:
        raise ValueError(f"{run_dir}: no measured requests of the baseline arm {baseline!r}")
    return m


def compare(run_dir: Path, quantiles: Sequence[float], slo: str = "interactive") -> dict:
    """Picks, per-load bias of the picks' pooled attainment against all windows', and both knees."""
    tiers = {t.name: t for t in load_slo_file()}
    if slo not in tiers:
        raise ValueError(f"--slo {slo!r}: not a tier of experiments/slos.toml ({', '.join(tiers)})")
    m = measured_requests(run_dir)
    # every load replays the same requests: the windows' counts at one of them
    counts = m[m.load == m.load.min()].groupby("window").size().sort_index().tolist()
    picks = knee.search_windows(counts, quantiles)
    every = knee.attainment_points(m, tiers[slo])
    picked = dict(knee.attainment_points(m[m.window.isin(picks)], tiers[slo]))
    return {"run": run_dir.name, "quantiles": tuple(quantiles), "windows": picks,
            "bias": {load: picked[load] - a for load, a in every},
            "knee_picked": knee.knee(sorted(picked.items())),
            "knee_all": knee.knee(every)}


def _quantiles(text: str) -> tuple[float, ...]:
    try:
        qs = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of numbers: {text!r}") from None
    if not qs or any(not 0 <= q <= 1 for q in qs):
        raise argparse.ArgumentTypeError(f"quantiles must lie in [0, 1]: {text!r}")
    return qs


def _knee_text(k: dict) -> str:
    return f"{k['load']:.2f}x ({k['status']})" if k["load"] is not None else k["status"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.kneewindows", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path,
                    help="run directories (each with run.json, requests.jsonl.xz)")
    ap.add_argument("--quantiles", action="append", type=_quantiles,
                    help="quantiles of request count to pick windows at; repeat to compare (default: "
                         "quartiles and the search's)")
    ap.add_argument("--slo", default="interactive",
                    help="SLO tier whose attainment is compared (default interactive)")
    args = ap.parse_args(argv)
    sets = args.quantiles or [(0.25, 0.5, 0.75), knee.SEARCH_QUANTILES]
    rows = []
    for run in args.runs:
        for qs in sets:
            try:
                r = compare(run, qs, args.slo)
            except (OSError, ValueError) as e:
                return fail(ap.prog, str(e))
            bias = ", ".join(f"{load:g}x {b:+.3f}" for load, b in r["bias"].items())
            print(f"{r['run']} quantiles {qs}: windows {r['windows']}; bias {bias}; knee "
                  f"{_knee_text(r['knee_picked'])} against {_knee_text(r['knee_all'])} over all windows")
            rows += [{"quantiles": qs, "abs_bias": abs(b)} for b in r["bias"].values()]
    summary = pd.DataFrame(rows).groupby("quantiles").abs_bias.agg(["mean", "max", "size"])
    for qs, s in summary.iterrows():
        print(f"quantiles {qs}: mean |bias| {s['mean']:.3f}, worst {s['max']:.3f} over {int(s['size'])} "
              "(run, load) cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
