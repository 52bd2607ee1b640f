"""How far does a replay's token spacing stray from its cell's other arms? Re-derived from committed runs.

    python -m research.slowhost experiments/results/h200-llama8b-confirm2 [more runs]

For each run whose records kept their token gaps: the measured replays' spacing excess over their
cells' other arms, less each arm's own median at that load (experiments.stats.hostslow.cell_excess),
its robust sd, the threshold the report's slow-host rule draws from it, and the replays above it with
their start in the run. Reads the records only (the host signals came later, in run.json): what
`hostslow.SPACING_FLOOR` and `ROBUST_Z` were chosen from.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from scipy import stats as sps

from common.cliargs import fail
from experiments.core.runfile import read_run
from experiments.stats import hostslow
from experiments.stats.runframe import load_run


def spacing(run_dir: Path) -> dict:
    """The run's spacing excesses: robust sd and threshold (log ratios) and the replays above it."""
    df = load_run(run_dir)
    measured = df[df.phase == "measure"].rename(columns={"succeeded": "ok"})
    table = hostslow.replay_table(measured)
    if table["itl_p50_ms"].isna().all():
        raise ValueError(f"{run_dir}: its records kept no token gaps (itl_us), so there is no spacing")
    excess = hostslow.cell_excess(table, "itl_p50_ms")
    starts = {(e["arm"], int(e["window"]), float(e["load"])): e.get("started_s")
              for e in read_run(run_dir).replays if e.get("phase") == "measure"}
    limit = hostslow.threshold(excess)
    above = table.assign(excess=excess)[excess > limit].sort_values("excess", ascending=False)
    return {"run": run_dir.name, "replays": int(excess.notna().sum()),
            "robust_sd": float(sps.median_abs_deviation(excess.dropna(), scale="normal")),
            "threshold": limit,
            "slow": [{"arm": r.arm, "window": int(r.window), "load": float(r.load), "excess": float(r.excess),
                      "started_s": starts.get((r.arm, int(r.window), float(r.load)))}
                     for r in above.itertuples()]}


def _pct(x: float) -> str:
    return f"{100 * math.expm1(x):+.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.slowhost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path,
                    help="run directories (each with run.json, requests.jsonl.xz)")
    args = ap.parse_args(argv)
    for run in args.runs:
        try:
            r = spacing(run)
        except (OSError, ValueError) as e:
            return fail(ap.prog, str(e))
        slow = ", ".join(f"{s['arm']} w{s['window']} {s['load']:g}x {_pct(s['excess'])}"
                         + ("" if s["started_s"] is None else f" at {s['started_s'] / 60:.1f} min")
                         for s in r["slow"])
        print(f"{r['run']}: {r['replays']} replays, robust sd {100 * r['robust_sd']:.2f}%, threshold "
              f"{_pct(r['threshold'])}; slow: {slow or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
