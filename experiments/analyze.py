"""Analyse an experiments run directory: goodput per SLO, paired differences, attribution, report.

    python -m experiments.analyze RUN_DIR [--out DIR | --in-place] [--slo NAME:TTFT_MS:TPOT_MS[:E2E_MS] ...]

Reads run.json and requests.jsonl(.xz) and writes report.json, report.md and PNG plots. A run's first
analysis (experiments/runner/orchestrate.py, after the replays) writes them into RUN_DIR; a re-analysis
writes beside the existing report, into RUN_DIR/reanalysis/ (or --out), unless --in-place.
report.json records the analysis inputs ("inputs": SLO tiers, A/A report, patched policy, step
profile, kernel results) and a re-analysis takes them from there unless a flag replaces one, so an
unchanged run re-analysed by unchanged code reproduces its report.json exactly.
Works on partial runs: cells (window x load x arm) that were not completed are listed, not dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

import runtime_tables
from common.cliargs import OneLineParser, add_debug_flag, fail, same_file
from common.jsonfile import ResultFileError, read_json, stored
from experiments.core.rundir import check_records
from experiments.core.runfile import Run, read_run
from experiments.core.slo import SLO, load_slo_file, parse_slo
from experiments.reporting import duetreport, hostbound, noisefloor, plots, report, schema
from experiments.reporting.inputs import PATH_INPUTS, Inputs, recorded_inputs, shown
from experiments.reporting.reportdiff import report_change
from experiments.stats import attribution, comparisons, goodput, hostslow, instances, knee, plantedline
from integration.proof import profiles
from integration.proof.profiles import PROJECT_ROOT
from kernels.environment import gpu_slug

PROG = "python -m experiments.analyze"
# the external server-instance variance of each GPU and model (python -m research.instancefloor)
INSTANCE_PRIOR = runtime_tables.path("instance-prior.json")
SECONDARY = ("tpot_p50_ms", "ttft_p90_ms")  # per-window latency summaries, beside the paired ratios
REANALYSIS = "reanalysis"  # the folder inside a run directory a re-analysis writes into by default


def completeness(run: Run, measured: pd.DataFrame) -> tuple[set, list[dict], list[dict]]:
    """(complete cells {(arm, window, load)}, missing cells with reasons, warnings) from the schedule (a
    cell of a run of resident sets is expected of its set's arms only)."""
    done = set(run.done_cells())
    counts = measured.groupby(goodput.CELL).size().to_dict() if len(measured) else {}
    expected_n = run.window_requests()
    missing, warnings = [], []
    expected = comparisons.cell_arms(run)
    for w in run.windows:
        for load in run.loads:
            for lab in expected[(int(w["id"]), float(load))]:
                cell = (lab, int(w["id"]), float(load))
                have = counts.get(cell, 0)
                if cell in done:
                    if have != expected_n[cell[1]]:
                        warnings.append({"arm": lab, "window": cell[1], "load": cell[2], "warning":
                                         f"{have} records, window has {expected_n[cell[1]]} requests"})
                    continue
                why = f"incomplete: {have} of {expected_n[cell[1]]} records, excluded" if have else "not run"
                missing.append({"arm": lab, "window": cell[1], "load": cell[2], "reason": why})
    return done, missing, warnings


def _mask(flags: list[bool], df: pd.DataFrame) -> pd.Series:
    """Row mask aligned with df (an empty list would otherwise select columns)."""
    return pd.Series(flags, index=df.index, dtype=bool)


def _check_labels(run: Run, df: pd.DataFrame) -> None:
    unknown = sorted(set(df["arm"]) - set(run.arm_labels))
    if unknown:
        raise ValueError(f"requests carry arm labels {unknown} not in run.json arm_labels "
                         f"{run.arm_labels}")


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


POLICY_RECORD_KEYS = ("mode", "table", "dtype", "hidden", "segments")


def _policy_record(path: Path) -> dict:
    """A policy record file (what run.json's patched_policy holds: the table, the model shape and the
    row ranges the patched arm fused); the analysis reads what was dispatched, never the plugin."""
    rec = read_json(path, None, "patched policy record")
    missing = [k for k in POLICY_RECORD_KEYS if k not in rec]
    if missing:
        raise ResultFileError(f"{path}: a patched policy record needs {', '.join(missing)} (run.json's "
                              "patched_policy format)")
    return rec


def _over_instances(complete: pd.DataFrame, run: Run, env: dict, pair: list[str], paired_lat: dict,
                    planted_lines: list[dict] | None) -> dict | None:
    """Paired TPOT with the server-instance variance: over the run's own instances where each arm ran on
    several, else with the external estimate for its GPU and model (INSTANCE_PRIOR); None without one."""
    if complete["instance"].nunique() > 1:  # every arm against the baseline, a planted arm its reference
        refs = {p["arm"]: p["reference"] for p in planted_lines or []}
        rows = instances.run_rows(complete.rename(columns={"ok": "succeeded"}),
                                  [(arm, refs.get(arm, pair[0])) for arm in run.arm_labels[1:]],
                                  "tpot_ms", comparisons.cell_orders(run))
        return {"source": instances.own_source({r["instance_pairs"] for r in rows if "reason" not in r}),
                "rows": rows}
    model = run.model.get("name")
    try:
        floors = read_json(INSTANCE_PRIOR, 1, "instance floor")["instance"]
    except (ResultFileError, KeyError):
        return None
    key = instances.floor_key(env.get("gpu"), model)
    rows = instances.restated(paired_lat, planted_lines or [], pair[0], floors.get(key))
    if not rows:
        return None
    f = floors[key]
    return {"source": f"external: {f['pairs']} in-run A/A pairs of {key} ({shown(INSTANCE_PRIOR)}), "
                      "the server-instance variance added to each one-pair interval",
            "instance_sd_pct": f["instance_sd_pct"], "df": f["df"], "rows": rows}


def analyze_run(run_dir: Path, slos: Sequence[SLO] | None = None, *, aa_report: Path | None = None,
                patched_policy: Path | None = None, profile: Path | None = None,
                kernel_results: Path | None = None, planted_steps: Path | None = None,
                graph_steps: Path | None = None, gpu_steps: Path | None = None, out_dir: Path | None = None,
                accept_damaged: bool = False, draw_plots: bool = True) -> dict:
    """Analyse RUN_DIR, write report.json, report.md and (with ``draw_plots``) PNGs into out_dir
    (default RUN_DIR itself) and return the report dict.

    ``slos`` defaults to the tiers run.json records; ``aa_report`` is an A/A
    run's report.json whose per-window spread is drawn as the noise floor (an A/A run is its own noise
    floor); ``patched_policy`` is a record of what the patched arm dispatched (run.json's patched_policy
    format), for a run.json that does not record it; ``profile`` and ``kernel_results`` replace the
    attribution's defaults for the run's GPU;
    ``planted_steps`` is a graph-steps file (integration.proof.graphtime) with a planted arm's step
    time inside vLLM, which the planted control's prediction then uses (default for a run with a
    planted arm: the GPU's and model's committed one, in the index runtime_tables/profiles.json);
    ``graph_steps`` a graph-steps file of the fused kernel at every size, whose decode step savings
    the attribution then uses; ``gpu_steps`` one whose stock decode steps are the host-bound guard's GPU
    time (default: the GPU's and model's committed one). Records that fail their integrity checks raise
    rundir.DamagedRecords unless ``accept_damaged``; the report is then titled damaged.
    """
    run_dir = Path(run_dir)
    out_dir = run_dir if out_dir is None else Path(out_dir)
    run = read_run(run_dir)
    slos = list(slos) if slos else run.slos()
    checked = check_records(run_dir, run, accept_damaged)
    records, source = checked.records, checked.source
    df = goodput.records_frame(records, slos)
    _check_labels(run, df)
    measured, excluded = goodput.split_phases(df)
    done, missing, warnings = completeness(run, measured)
    complete = measured[_mask([(a, w, ld) in done for a, w, ld in
                               zip(measured["arm"], measured["window"], measured["load"])], measured)]
    cells = goodput.cell_table(complete, slos, run.durations())
    labels = list(run.arm_labels)
    arms_plan = comparisons.arm_roles(run)
    pair = [arms_plan["baseline"], arms_plan["primary"]]
    own_floor = arms_plan["controls"][:1] or ([] if report.aa_reason(run) is None
                                              else ["the run itself, an A/A run"])
    if aa_report is not None and own_floor:
        raise ValueError(f"--aa-report {aa_report}: this run has its own A/A noise floor ({own_floor[0]}), "
                         "which the report uses; another run's would not be applied, so leave it out")
    per_slo = [_per_slo(s, complete, cells, pair) for s in slos]
    latency = goodput.cell_latency(complete)
    secondary = {m: goodput.paired_relative(latency, m, *pair) for m in SECONDARY}
    in_run_floor = None
    if arms_plan["controls"]:
        ctrl = [arms_plan["baseline"], arms_plan["controls"][0]]
        in_run_floor = {"pair": ctrl, "goodput": {s.name: _per_slo(s, complete, cells, ctrl)["paired"]
                                                  for s in slos},
                        "secondary": {m: goodput.paired_relative(latency, m, *ctrl) for m in SECONDARY}}
    env_path = stored(run_dir / "environment.json")
    env = read_json(env_path, None, "environment record") if env_path.is_file() else {}
    gpu = gpu_slug(env["gpu"]) if isinstance(env.get("gpu"), str) else None
    policy = None
    if patched_policy is not None:
        policy = _policy_record(patched_policy)
    attrib = attribution.attribute(run, labels[0], PROJECT_ROOT, gpu, profile_path=profile,
                                   kernel_path=kernel_results, policy=policy, graph_path=graph_steps)
    model = run.model.get("name")
    if planted_steps is None and plantedline.has_planted_arm(run):  # the GPU's committed one, if any
        found = profiles.default_planted_steps(gpu, model)
        planted_steps = PROJECT_ROOT / found if found else None
    if gpu_steps is None and run.device == "cuda":
        found = profiles.default_graph_steps(gpu, model)
        gpu_steps = PROJECT_ROOT / found if found else None
    latency_rows = goodput.latency_table(complete)
    paired_lat = comparisons.paired_latency(complete, run)
    planted_lines = plantedline.planted_lines(
        run, latency_rows, paired_lat, attrib,
        None if planted_steps is None else (shown(planted_steps), read_json(planted_steps, None,
                                                                             "graph-steps file")),
        plantedline.reference_comparisons(complete, run, comparisons.cell_orders(run)),
        plantedline.decode_totals(complete))
    analysis = report.Analysis(
        run=run, env=env, slos=slos, per_slo=per_slo, secondary=secondary,
        latency=latency_rows, attribution=attrib, missing=missing,
        warnings=warnings, excluded=excluded, n_records=len(df), source=source, pair=pair,
        paired_latency=paired_lat, in_run_floor=in_run_floor,
        burnin=comparisons.burnin_summary(df, complete), drift=comparisons.drift(complete, run),
        knee=knee.summary(df, run, slos),
        planted=planted_lines,
        damage=checked.damage,
        over_instances=_over_instances(complete, run, env, pair, paired_lat, planted_lines),
        slow_host=hostslow.episodes(complete, run),
    )
    result = report.build_report(analysis)
    result.noise_floor = noisefloor.noise_floor(result, aa_report)
    result.gpu_share = schema.GpuShare.from_json(hostbound.entry(complete, run, gpu, None if gpu_steps is None
                                                                  else (shown(gpu_steps), read_json(
                                                                      gpu_steps, None, "graph-steps file"))))
    if aa_report is not None and result.noise_floor["source"] == str(aa_report):
        result.noise_floor["source"] = shown(aa_report)  # the same wherever analyze runs from
    if duetreport.is_duet(run):
        result.layout = duetreport.layout_entry(result, run)
    result.inputs = schema.AnalysisInputs([s.to_json() for s in slos], shown(aa_report),
                                          shown(patched_policy), attrib["profile"], attrib["kernel_results"],
                                          shown(planted_steps), shown(graph_steps), shown(gpu_steps))
    out_dir.mkdir(parents=True, exist_ok=True)
    result.plots = (plots.write_plots(out_dir, complete, per_slo, secondary, labels, result) if draw_plots
                    else None)
    report.write_report(out_dir, result)
    return result.to_json()


def build_parser() -> argparse.ArgumentParser:
    """The command line of experiments.analyze."""
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path,
                    help="an experiments run directory (holds run.json, requests.jsonl[.xz])")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None, metavar="DIR",
                       help=f"write the report here (default: RUN_DIR/{REANALYSIS}/ beside a report, "
                            f"else RUN_DIR)")
    where.add_argument("--in-place", action="store_true",
                       help="overwrite RUN_DIR's own report files (default: write beside them)")
    tiers = ap.add_mutually_exclusive_group()
    tiers.add_argument("--slo", action="append", default=[], metavar="NAME:TTFT_MS:TPOT_MS[:E2E_MS]",
                       help="an SLO tier to evaluate (repeatable); replaces the recorded tiers")
    tiers.add_argument("--slo-file", type=Path, default=None,
                       help="TOML file of [[slo]] tiers; replaces the recorded tiers (default: those "
                            "report.json recorded, else run.json's)")
    ap.add_argument("--aa-report", type=Path, default=None, metavar="REPORT_JSON",
                    help="report.json of an A/A run, its spread the noise floor (default: as recorded)")
    ap.add_argument("--patched-policy", type=Path, default=None, metavar="RECORD_JSON",
                    help="what the patched arm dispatched, for a run.json without it (default: as "
                         "recorded)")
    ap.add_argument("--profile", type=Path, default=None, metavar="PROFILE_JSON",
                    help="the attribution's step profile (default: as recorded, else the GPU's committed "
                         "one)")
    ap.add_argument("--kernel-results", type=Path, default=None, metavar="RESULTS_JSON",
                    help="the attribution's kernel results (default: as recorded, else those the GPU's "
                         "isolated table was built from)")
    ap.add_argument("--planted-steps", type=Path, default=None, metavar="GRAPH_STEPS_JSON",
                    help="graph-steps file of prove --planted, for the planted prediction (default: as "
                         "recorded, else the index)")
    ap.add_argument("--graph-steps", type=Path, default=None, metavar="GRAPH_STEPS_JSON",
                    help="graph-steps file of prove with the fused kernel at every size (default: as "
                         "recorded, else none)")
    ap.add_argument("--gpu-steps", type=Path, default=None, metavar="GRAPH_STEPS_JSON",
                    help="graph-steps file whose stock decode steps are the host-bound guard's GPU time "
                         "(default: as recorded)")
    ap.add_argument("--accept-damaged", action="store_true",
                    help="analyse records that fail their integrity checks instead of refusing them "
                         "(report titled damaged)")
    ap.add_argument("--no-plots", action="store_true", help="write report.json and report.md only, no PNGs")
    add_debug_flag(ap)
    return ap


def _out_dir(args: argparse.Namespace) -> Path:
    """Where this analysis writes, checked writable before any work: --out; RUN_DIR with --in-place or
    no report yet; else the reanalysis folder inside RUN_DIR."""
    if args.out is not None:
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out}: exists and is not a folder")
        if same_file(args.out, args.run_dir):
            raise ValueError(f"--out {args.out} is RUN_DIR, whose report.json holds this analysis' inputs; "
                             "pass --in-place to replace it")
        out, flag, hint = args.out, "--out ", ""
    else:
        out = args.run_dir if args.in_place or not stored(args.run_dir / "report.json").is_file() \
            else args.run_dir / REANALYSIS
        flag, hint = "--in-place: " if args.in_place else "", "; pass --out DIR to write the report elsewhere"
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{flag}{out}: not writable ({existing} is read-only){hint}")
    return out


def _inputs(args: argparse.Namespace) -> Inputs:
    """The recorded inputs with each one a flag gives replaced."""
    rec = recorded_inputs(args.run_dir)
    slos = tuple(parse_slo(s) for s in args.slo) if args.slo else rec.slos
    if args.slo_file is not None:
        slos = tuple(load_slo_file(args.slo_file))
    given = {k: getattr(args, k) for k in PATH_INPUTS if getattr(args, k) is not None}
    return replace(rec, slos=slos, **given)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (0 written, 2 bad flag or unreadable run); see --help."""
    args = build_parser().parse_args(argv)
    try:
        read_run(args.run_dir)  # names run.json and what is wrong with it before anything else
        out, inputs = _out_dir(args), _inputs(args)
        for note in inputs.notes:
            print(note)
        result = analyze_run(args.run_dir, inputs.slos, out_dir=out, accept_damaged=args.accept_damaged,
                             draw_plots=not args.no_plots, **{k: getattr(inputs, k) for k in PATH_INPUTS})
    except (OSError, ValueError) as exc:
        if args.debug:
            raise
        return fail(PROG, str(exc))
    print("\n\n".join((out / "report.md").read_text(encoding="utf-8").split("\n\n")[:2]))  # title, summary
    print(f"status {result['status']}; wrote {out / 'report.md'} and report.json")
    if out != args.run_dir and stored(args.run_dir / "report.json").is_file():
        print(f"report.json {report_change(stored(args.run_dir / 'report.json'), out / 'report.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
