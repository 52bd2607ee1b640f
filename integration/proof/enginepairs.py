"""An arm's decode-step change inside vLLM over several engine pairs, not over the rounds of one.

A graph-steps file (integration.proof.graphtime) times one stock engine and one engine per arm,
started once, in alternating rounds of CUDA-graph replays; its interval is over those rounds and so
says how well that one pair of engines was measured. Two engines built from the same code differ by
more than that (their graphs, allocations and cache placement are their own), so a claim about the
kernel needs several pairs: here each file is one pair, its estimate at a size the mean of its
per-round log ratios, and the interval a Student-t interval over the pairs (k - 1 degrees of
freedom). The files must come from the same code and policy table; their commands are recorded.
A file of a run with replicas (prove --replicas 2) counts as one pair whose estimate averages over
its engines; `--arm stock-b` on such files gives the engine-to-engine difference of stock itself.

    python -m integration.proof.enginepairs --arm patched \\
        RUN1/h200-graph-steps.json RUN2/h200-graph-steps.json ... --out engine-pairs.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.cliargs import fail, refuse_output
from common.jsonfile import read_json, write_json
from common.tstats import mean_t_interval, t_quantile
from integration.arms import replica_base
from integration.proof.graphtime import pct

SCHEMA_VERSION = 1


def pair_estimates(doc: Mapping, arm: str) -> dict[int, dict]:
    """batch_tokens -> {log_ratio, rounds, engines, within_ci95_pct} of `arm` against stock in one
    graph-steps document (its decode sizes); sizes where the arm has no per-round ratios are left out.

    A run with replicas (prove --replicas: stock-b, patched-b, ...) gives per round the mean log time
    of the arm's engines minus the mean of stock's (stock's own ratio is 0), so its estimate averages
    over engines; `arm` given as a replica's label ("stock-b") is compared as it is."""
    out = {}
    for row in doc.get("sizes") or []:
        found = row.get("arms") or {}
        if arm not in found:
            continue
        labels = set(found) | {"stock"}
        if replica_base(arm, labels) != arm:  # a replica's own label: that engine alone
            mine, stocks = [arm], []
        else:
            mine = [lb for lb in sorted(found) if replica_base(lb, labels) == arm]
            stocks = [lb for lb in sorted(found) if lb != "stock" and replica_base(lb, labels) == "stock"]
        rounds = [found[lb].get("per_round_log_ratio") or [] for lb in mine + stocks]
        if not all(rounds):
            continue
        if len({len(r) for r in rounds}) > 1:
            raise ValueError(f"{row['batch_tokens']} tokens: the engines {mine + stocks} were timed in "
                             f"different numbers of rounds {[len(r) for r in rounds]}")
        d = [statistics.fmean(r[:len(mine)]) - sum(r[len(mine):]) / (1 + len(stocks))
             for r in zip(*rounds)]
        ci = found[arm].get("ci95_pct")
        if len(mine) + len(stocks) > 1 and len(d) >= 2:
            _, lo, hi = mean_t_interval(d)
            ci = [pct(lo), pct(hi)]
        out[int(row["batch_tokens"])] = {"log_ratio": statistics.fmean(d), "rounds": len(d),
                                         "engines": {arm: len(mine), "stock": 1 + len(stocks)},
                                         "within_ci95_pct": ci}
    return out


def pairs_needed(mean: float, sd: float, confidence: float = 0.95, most: int = 200) -> int | None:
    """The fewest pairs whose t interval would exclude zero if the pairs' mean and sd stayed as they
    are (None: not within `most`, or no difference to resolve)."""
    if sd <= 0.0 or mean == 0.0:
        return None
    for n in range(2, most + 1):
        if float(t_quantile(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n) < abs(mean):
            return n
    return None


def across_pairs(per_file: Sequence[Mapping[int, Mapping]]) -> list[dict]:
    """Per size present in at least one file: the pairs' changes (percent), their mean and, with two
    or more pairs, the 95% t interval over pairs, whether it excludes zero, and how many pairs would
    resolve the mean at this spread."""
    sizes = sorted({s for f in per_file for s in f})
    rows = []
    for size in sizes:
        logs = [f[size]["log_ratio"] for f in per_file if size in f]
        row: dict = {"batch_tokens": size, "pairs": len(logs), "per_pair_pct": [pct(x) for x in logs],
                     "change_pct": pct(statistics.fmean(logs)), "ci95_pct": None, "excludes_zero": None,
                     "between_pair_sd_pct": None, "pairs_needed": None}
        if len(logs) >= 2:
            mean, lo, hi = mean_t_interval(logs)
            sd = statistics.stdev(logs)
            row.update(ci95_pct=[pct(lo), pct(hi)], excludes_zero=bool(lo > 0 or hi < 0),
                       between_pair_sd_pct=100.0 * sd, pairs_needed=pairs_needed(mean, sd))
        rows.append(row)
    return rows


def build(paths: Sequence[Path], arm: str) -> dict:
    """The engine-pairs document of `arm` over the graph-steps files `paths` (ResultFileError for a
    damaged file, ValueError when a file has no decode size of that arm)."""
    files, per_file = [], []
    for path in paths:
        doc = read_json(path, None, "graph-steps")
        est = pair_estimates(doc, arm)
        if not est:
            raise ValueError(f"{path}: no decode size with per-round ratios of arm {arm!r}")
        files.append({"path": str(path), "command": doc.get("command"), "model": doc.get("model"),
                      "sizes": {str(s): e for s, e in est.items()}})
        per_file.append(est)
    return {"schema_version": SCHEMA_VERSION, "arm": arm, "baseline": "stock", "files": files,
            "sizes": across_pairs(per_file)}


def table(doc: Mapping) -> str:
    """The document as a markdown table: per size the pairs, their changes, mean and interval."""
    lines = [f"{doc['arm']} vs stock, decode step (CUDA-graph replays), one estimate per engine pair",
             "", "| batch tokens | pairs | per pair | mean | 95% t over pairs | excludes zero "
             "| sd between pairs | pairs that would resolve the mean at this sd |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["sizes"]:
        ci = "-" if r["ci95_pct"] is None else f"[{r['ci95_pct'][0]:+.2f}, {r['ci95_pct'][1]:+.2f}]%"
        per = ", ".join(f"{x:+.2f}" for x in r["per_pair_pct"])
        sd = "-" if r["between_pair_sd_pct"] is None else f"{r['between_pair_sd_pct']:.2f}%"
        need = "-" if r["pairs"] < 2 else (r["pairs_needed"] or "over 200")
        lines.append(f"| {r['batch_tokens']} | {r['pairs']} | {per} | {r['change_pct']:+.2f}% | {ci} | "
                     f"{'-' if r['excludes_zero'] is None else ('yes' if r['excludes_zero'] else 'no')} | "
                     f"{sd} | {need} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: pool graph-steps files (one engine pair each) into one interval per decode size."""
    ap = argparse.ArgumentParser(
        prog="python -m integration.proof.enginepairs", description=main.__doc__)
    ap.add_argument("files", nargs="+", type=Path, help="graph-steps JSON files of the same code and table")
    ap.add_argument("--arm", default="patched", help="the arm compared with stock (default: patched)")
    ap.add_argument("--out", type=Path, help="write the document here (JSON); the table goes to stdout")
    a = ap.parse_args(argv)
    refuse_output(ap.prog, "--out", a.out, a.files)
    try:
        doc = build(a.files, a.arm)
    except ValueError as exc:  # ResultFileError included
        return fail(ap.prog, str(exc))
    if a.out:
        write_json(a.out, {**doc, "command": ["python", "-m", "integration.proof.enginepairs",
                                              *map(str, argv if argv is not None else sys.argv[1:])]})
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
