"""Analyse an experiments run directory: goodput per SLO, paired differences, attribution, report.

    python -m experiments.analyze RUN_DIR [--slo NAME:TTFT_MS:TPOT_MS[:E2E_MS] ...] [--slo-file FILE]

Reads run.json and requests.jsonl(.gz), writes report.json, report.md and PNG plots into RUN_DIR.
Works on partial runs: cells (window x load x arm) that were not completed are listed, not dropped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments import attribution, comparisons, goodput, knee, noisefloor, plots, report
from experiments.slo import DEFAULT_SLO_FILE, SLO, load_slo_file, parse_slo
from experiments.runrecord import RUN_SCHEMA_VERSION
from kernels.environment import gpu_slug
from kernels.resultfile import read_json
from loadgen.records import RequestRecord, read_records

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SECONDARY = ("tpot_p50_ms", "ttft_p90_ms")  # per-window latency summaries, beside the paired ratios


def load_run(run_dir: Path) -> dict:
    """run.json of a run directory; rejects unknown schema versions and missing keys."""
    path = run_dir / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no run.json (is {run_dir} an experiments run directory?)")
    run = read_json(path, RUN_SCHEMA_VERSION, "run record")
    missing = [k for k in ("arms", "arm_labels", "windows", "loads", "schedule", "status") if k not in run]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    labels = run["arm_labels"]
    if len(labels) < 2 or len(set(labels)) != len(labels) or len(run["arms"]) != len(labels):
        raise ValueError(f"{path}: arm_labels must be two or more distinct labels, one per arm, got "
                         f"{labels} for arms {run['arms']}")
    return run


def load_records(run_dir: Path) -> tuple[list[RequestRecord], str | None]:
    """Records from requests.jsonl.gz or requests.jsonl (the longer if both exist), and the file used."""
    found = [p for p in (run_dir / "requests.jsonl.gz", run_dir / "requests.jsonl") if p.is_file()]
    if not found:
        return [], None
    loaded = [(read_records(p), p.name) for p in found]
    return max(loaded, key=lambda x: len(x[0]))


def completeness(run: dict, measured: pd.DataFrame) -> tuple[set, list[dict], list[dict]]:
    """(complete cells {(arm, window, load)}, missing cells with reasons, warnings) from the schedule."""
    labels = run["arm_labels"]
    done = {(lab, int(e["window"]), float(e["load"])) for e in run["schedule"] for lab in e.get("done", [])}
    counts = measured.groupby(goodput.CELL).size().to_dict() if len(measured) else {}
    expected_n = {int(w["id"]): int(w["requests"]) for w in run["windows"]}
    missing, warnings = [], []
    for w in run["windows"]:
        for load in run["loads"]:
            for lab in labels:
                cell = (lab, int(w["id"]), float(load))
                have = counts.get(cell, 0)
                if cell in done:
                    if have != expected_n[cell[1]]:
                        warnings.append({"arm": lab, "window": cell[1], "load": cell[2],
                                         "warning": f"{have} records, window has {expected_n[cell[1]]} requests"})
                    continue
                why = f"incomplete: {have} of {expected_n[cell[1]]} records, excluded" if have else "not run"
                missing.append({"arm": lab, "window": cell[1], "load": cell[2], "reason": why})
    return done, missing, warnings


def _mask(flags: list[bool], df: pd.DataFrame) -> pd.Series:
    """Row mask aligned with df (an empty list would otherwise select columns)."""
    return pd.Series(flags, index=df.index, dtype=bool)


def _check_labels(run: dict, df: pd.DataFrame) -> None:
    unknown = sorted(set(df["arm"]) - set(run["arm_labels"]))
    if unknown:
        raise ValueError(f"requests carry arm labels {unknown} not in run.json arm_labels {run['arm_labels']}")


def _per_slo(slo: SLO, measured: pd.DataFrame, cells: pd.DataFrame, pair: list[str]) -> dict:
    """Goodput comparison, per-load attainment and capacity for one SLO and one (baseline, treatment)
    pair, over the cells both arms completed only."""
    base, treat = pair
    everything = cells[cells["slo"] == slo.name]
    paired = goodput.paired_relative(everything, "goodput_rps", base, treat)  # lists the unpaired cells too
    c = goodput.paired_cells(everything, pair)
    m = goodput.paired_cells(measured, pair)
    per_load = goodput.per_load_attainment(c, slo.name)
    arms = {}
    for arm in pair:
        a = c[c["arm"] == arm]
        n, dur, replay = int(a["n"].sum()), float(a["duration_s"].sum()), float(a["replay_s"].sum())
        arms[arm] = {
            "attainment": float(a["n_met"].sum() / n) if n else None,
            "goodput_rps": float(a["n_met"].sum() / dur) if dur else None,
            "achieved_goodput_rps": float(a["n_met"].sum() / replay) if replay else None,
            "capacity_by_attainment": goodput.capacity_from_attainment(per_load, arm),
            "capacity_by_latency": goodput.capacity_from_latency(goodput.latency_curve(m, arm), slo),
        }
    return {"slo": slo, "arms": arms, "paired": paired, "per_load": per_load.to_dict(orient="records"),
            "cells": c.to_dict(orient="records"), "n_requests": int(len(m)),
            "capacity": knee.compare_capacity(c, slo.name, base, treat),
            "n_near_bound": comparisons.near_bound(m, slo.ttft_ms, slo.tpot_ms, pair)}


def _policy_override(run: dict, table: Path) -> dict:
    """arms.policy_record of `table` for the run's model shape."""
    from integration import arms

    model = run.get("model") or {}
    try:
        return arms.policy_record(model.get("config") or {}, model.get("dtype") or "auto",
                                  "eager" if model.get("eager") else "compiled", table=table)
    except ValueError as exc:
        raise ValueError(f"run.json model {model.get('name')!r}: {exc} (needed for --patched-policy)") from None


def analyze_run(run_dir: Path, slos: Sequence[SLO] | None = None, *, aa_report: Path | None = None,
                patched_policy: Path | None = None) -> dict:
    """Analyse RUN_DIR, write report.json, report.md and PNGs into it, and return the report dict.

    ``slos`` defaults to experiments/slos.toml; ``aa_report`` is an A/A run's report.json whose
    per-window spread is drawn as the noise floor (an A/A run is its own noise floor);
    ``patched_policy`` is the policy table the patched arm used, for a run.json that does not record it.
    """
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    slos = list(slos) if slos else load_slo_file(DEFAULT_SLO_FILE)
    records, source = load_records(run_dir)
    df = goodput.records_frame(records, slos)
    _check_labels(run, df)
    measured, excluded = goodput.split_phases(df)
    done, missing, warnings = completeness(run, measured)
    complete = measured[_mask([(a, w, ld) in done for a, w, ld in
                               zip(measured["arm"], measured["window"], measured["load"])], measured)]
    durations = {int(w["id"]): float(w["duration_s"]) for w in run["windows"]}
    cells = goodput.cell_table(complete, slos, durations)
    labels = list(run["arm_labels"])
    arms_plan = comparisons.plan(run)
    pair = [arms_plan["baseline"], arms_plan["primary"]]
    per_slo = [_per_slo(s, complete, cells, pair) for s in slos]
    latency = goodput.cell_latency(complete)
    secondary = {m: goodput.paired_relative(latency, m, *pair) for m in SECONDARY}
    in_run_floor = None
    if arms_plan["controls"]:
        ctrl = [arms_plan["baseline"], arms_plan["controls"][0]]
        in_run_floor = {"pair": ctrl, "goodput": {s.name: _per_slo(s, complete, cells, ctrl)["paired"]
                                                  for s in slos},
                        "secondary": {m: goodput.paired_relative(latency, m, *ctrl) for m in SECONDARY}}
    env_path = run_dir / "environment.json"
    env = read_json(env_path, None, "environment record") if env_path.is_file() else {}
    gpu = gpu_slug(env["gpu"]) if isinstance(env.get("gpu"), str) else None
    attrib = attribution.attribute(run, labels[0], PROJECT_ROOT, gpu,
                                   policy=_policy_override(run, patched_policy) if patched_policy else None)
    analysis = report.Analysis(
        run=run, env=env, slos=slos, per_slo=per_slo, secondary=secondary,
        latency=goodput.latency_table(complete), attribution=attrib, missing=missing,
        warnings=warnings, excluded=excluded, n_records=len(df), source=source, pair=pair,
        paired_latency=comparisons.paired_latency(complete, run), in_run_floor=in_run_floor,
        burnin=comparisons.burnin_summary(df, complete), drift=comparisons.drift(complete, run),
        knee=knee.summary(df, run, slos),
    )
    result = report.build_report(analysis)
    result["noise_floor"] = noisefloor.noise_floor(result, aa_report)
    result["plots"] = plots.write_plots(run_dir, complete, per_slo, secondary, labels, result)
    report.write_report(run_dir, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; see --help."""
    ap = argparse.ArgumentParser(prog="python -m experiments.analyze", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="an experiments run directory (holds run.json, requests.jsonl[.gz])")
    ap.add_argument("--slo", action="append", default=[], metavar="NAME:TTFT_MS:TPOT_MS[:E2E_MS]",
                    help="an SLO tier to evaluate (repeatable); replaces the tiers of --slo-file")
    ap.add_argument("--slo-file", type=Path, default=DEFAULT_SLO_FILE,
                    help=f"TOML file of [[slo]] tiers (default {DEFAULT_SLO_FILE.name}: interactive, chat, relaxed)")
    ap.add_argument("--aa-report", type=Path, default=None, metavar="REPORT_JSON",
                    help="report.json of an A/A run: its per-window spread is the noise floor drawn and reported")
    ap.add_argument("--patched-policy", type=Path, default=None, metavar="POLICY_JSON",
                    help="the policy table the patched arm dispatched by, for a run.json that does not record "
                         "it (runs before patched_policy was recorded); the attribution counts the kernel's "
                         "saving only at step sizes this table sends to the fused kernel")
    args = ap.parse_args(argv)
    try:
        slos = [parse_slo(s) for s in args.slo] if args.slo else load_slo_file(args.slo_file)
        result = analyze_run(args.run_dir, slos, aa_report=args.aa_report, patched_policy=args.patched_policy)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print((args.run_dir / "report.md").read_text(encoding="utf-8").split("\n\n")[0])
    print(f"status {result['status']}; wrote {args.run_dir / 'report.md'} and report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
