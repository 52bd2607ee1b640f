"""The host-bound guard of a report: report.json's "gpu_share" entry and what report.md says of it.

A served decode step that is mostly host time hides a GPU kernel's effect; where a step's GPU share
(experiments.stats.gpushare) is below the bound at any arm and load, report.md says so at its top,
before any verdict. Where the run has no GPU step times for its GPU and model, or no gaps between
tokens in its records, the entry and report.md say so in one line instead of a table.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from experiments.core.runfile import Run
from experiments.reporting.report_latency import fmt_num
from experiments.reporting.schema import GpuShare, Report
from experiments.stats import gpushare


def _reason(run: Run, gpu: str | None, steps: tuple[str, Mapping] | None) -> str | None:
    """Why the run has no GPU step to set its served steps against, or None where it has one."""
    model = run.model or {}
    if run.device != "cuda":
        return "a CPU run: there is no GPU step to set the served steps against"
    if model.get("eager"):
        return "an eager engine: the calibration times CUDA-graph steps, which this engine does not run"
    if steps is None:
        return (f"no CUDA-graph step times of {model.get('name')} on {gpu} (neither the index "
                "runtime_tables/profiles.json nor the GPU's calibration record names them): the GPU's "
                "share is not known")
    return None


def entry(measured: pd.DataFrame, run: Run, gpu: str | None, steps: tuple[str, Mapping] | None) -> dict:
    """report.json's "gpu_share": the bound, the graph-steps file used (`steps`: its path as shown and
    its document), why there is no table (else None) and one row per arm and load."""
    out = {"bound": gpushare.GPU_BOUND, "source": None if steps is None else steps[0],
           "reason": _reason(run, gpu, steps), "rows": []}
    if out["reason"] is not None:
        return out
    curve = gpushare.step_curve(steps[1])
    served = gpushare.served_steps(measured)
    if curve is None:
        out["reason"] = f"{steps[0]} holds no decode step times of the stock engine"
    elif served.empty:
        out["reason"] = ("the records keep no gaps between tokens (written before they were recorded): "
                         "no served step to compare")
    else:
        labels = list(run.arm_labels)
        out["rows"] = sorted(gpushare.shares(served, curve), key=lambda row: (
            labels.index(row["arm"]) if row["arm"] in labels else len(labels), row["load"]))
    return out


def warning_lines(r: Report) -> list[str]:
    """The notice at the top of report.md where a served step is more than about a quarter host time."""
    g = r.gpu_share
    low = [] if g is None else g.below_bound()
    if not low:
        return []
    shares = [row.gpu_share for row in low]
    every = len(low) == len([row for row in g.rows if row.gpu_share is not None])
    where = "every arm and load" if every else ", ".join(f"{row.arm} {row.load:g}x" for row in low)
    return [f"**This run measures the host, not the GPU** — a served decode step is GPU time for only "
            f"{min(shares):.2f}-{max(shares):.2f} of its length in {where} "
            f"(below {g.bound:g}: more than about a quarter of each step is host time), so a GPU kernel's "
            "effect on the step is hidden behind the host's and the verdicts below cannot show it "
            "(GPU share of a served decode step, below).  ", ""]


def section_lines(g: GpuShare | None) -> list[str]:
    """report.md's section: the table per arm and load, or the one line saying why there is none."""
    if g is None:
        return []
    out = ["## GPU share of a served decode step", ""]
    if g.reason is not None:
        return [*out, f"Not known — {g.reason}.", ""]
    out += [f"The stock engine's CUDA-graph decode step ({g.source}) at the batch the engine ran (its "
            "requests in decode, from the records' first and last token times), against the served step "
            "(a gap between two tokens of one reply), each step counted once; the share is the median "
            "over steps of graph step / served step. Left out: steps that also ran a prefill (another "
            "request's first token came in them) and batches above the largest timed size. The graph "
            "was timed at contexts of a few dozen tokens, so where long contexts fill large batches the "
            f"share is a lower bound. Below {g.bound:g}, more than about a quarter of a step is host time.",
            "", "| arm | load | token gaps | left out: prefill, above timed | median batch | served step "
            "(ms) | graph step at that batch (ms) | GPU share |", "|---|---|---|---|---|---|---|---|"]
    out += [f"| {row.arm} | {row.load:g}x | {row.gaps} | {row.prefill}, {row.above_timed} | "
            f"{fmt_num(row.batch_p50, '{:g}')} | {fmt_num(row.served_step_ms, '{:.2f}')} | "
            f"{fmt_num(row.gpu_step_ms, '{:.2f}')} | {fmt_num(row.gpu_share, '{:.2f}')} |" for row in g.rows]
    return [*out, ""]
