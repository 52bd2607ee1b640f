"""The host-bound guard in report.json and report.md: the reasons it gives instead of a table, and the
warning at the top of report.md where a served step is more than about a quarter host time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from common.jsonfile import read_json
from experiments.core.runfile import Run
from experiments.reporting import hostbound
from experiments.reporting.report_md import render_markdown
from experiments.reporting.schema import GpuShare, Report
from tests.experiments.test_gpushare import THREE, frame, reply

BASE = read_json(Path(__file__).resolve().parents[2] / "experiments" / "results" / "h200-llama1b-ab" /
                 "report.json", None, "report")
GPU_RUN = Run(device="cuda", model={"name": "llama-3.2-1b", "eager": False}, arm_labels=["stock", "patched"])
DOC = ("graph-steps.json", {"sizes": [{"batch_tokens": 1, "baseline_median_us": 1000.0},
                                      {"batch_tokens": 4, "baseline_median_us": 1600.0}]})


def row(arm: str, load: float, share: float) -> dict:
    return {"arm": arm, "load": load, "gaps": 100, "prefill": 10, "above_timed": 0, "batch_p50": 4.0,
            "served_step_ms": 1.6 / share, "gpu_step_ms": 1.6, "gpu_share": share}


def report(**gpu_share) -> Report:
    entry = {"bound": 0.75, "source": "graph-steps.json", "reason": None, "rows": [], **gpu_share}
    return Report.from_json({**BASE, "gpu_share": entry})


def test_a_gpu_run_with_step_times_and_token_gaps_gets_a_row_per_arm_and_load_baseline_first() -> None:
    records = THREE + [reply(10.0, [4.0], arm="patched")]
    e = hostbound.entry(frame(records), GPU_RUN, "h200", DOC)
    assert (e["bound"], e["source"], e["reason"]) == (0.75, "graph-steps.json", None)
    assert [(r["arm"], r["gpu_share"]) for r in e["rows"]] == [("stock", 0.5), ("patched", 0.25)]


def test_without_step_times_or_token_gaps_the_entry_says_why_in_one_line() -> None:
    f = frame(THREE)
    cpu = hostbound.entry(f, replace(GPU_RUN, device="cpu"), None, None)
    assert cpu["reason"] == "a CPU run: there is no GPU step to set the served steps against"
    eager = hostbound.entry(f, replace(GPU_RUN, model={"name": "llama-3.2-1b", "eager": True}), "h200", DOC)
    assert eager["reason"].startswith("an eager engine")
    shape = hostbound.entry(f, GPU_RUN, "h100-80gb-hbm3", None)
    assert shape["reason"].startswith("no CUDA-graph step times of llama-3.2-1b on h100-80gb-hbm3")
    empty = hostbound.entry(f, GPU_RUN, "h200", ("other.json", {"sizes": []}))
    assert empty["reason"] == "other.json holds no decode step times of the stock engine"
    gapless = hostbound.entry(frame([reply(0.0, [])]), GPU_RUN, "h200", DOC)
    assert gapless["reason"].startswith("the records keep no gaps between tokens")
    for e in (cpu, eager, shape, empty, gapless):
        assert e["rows"] == [] and "\n" not in e["reason"]


def test_a_host_bound_run_is_said_at_the_top_before_any_verdict() -> None:
    text = render_markdown(report(rows=[row("stock", 5.0, 0.55), row("patched", 5.0, 0.8)]))
    lines = text.splitlines()
    assert lines[2].startswith("**This run measures the host, not the GPU** — a served decode step is GPU "
                               "time for only 0.55-0.55 of its length in stock 5x (below 0.75")
    assert "a GPU kernel's effect on the step is hidden" in lines[2]
    assert text.index("This run measures the host") < text.index("| comparison | change |")
    assert "| stock | 5x | 100 | 10, 0 | 4 | 2.91 | 1.60 | 0.55 |" in lines
    every = render_markdown(report(rows=[row("stock", 5.0, 0.5), row("patched", 5.0, 0.6)])).splitlines()[2]
    assert "only 0.50-0.60 of its length in every arm and load" in every


def test_a_gpu_bound_run_gets_the_table_and_no_warning() -> None:
    text = render_markdown(report(rows=[row("stock", 5.0, 0.92), row("stock", 8.0, 0.75)]))
    assert "measures the host" not in text
    assert "## GPU share of a served decode step" in text and "| stock | 8x |" in text


def test_a_run_without_step_times_says_so_in_one_line_and_warns_of_nothing() -> None:
    text = render_markdown(report(source=None, reason="a CPU run: there is no GPU step to set the served "
                                                      "steps against"))
    section = text.split("## GPU share of a served decode step\n\n")[1].split("\n\n")[0]
    assert section == "Not known — a CPU run: there is no GPU step to set the served steps against."
    assert "measures the host" not in text


def test_the_entry_is_typed_and_written_back_unchanged() -> None:
    doc = {"bound": 0.75, "source": "s.json", "reason": None, "rows": [row("stock", 5.0, 0.55)]}
    g = GpuShare.from_json(doc)
    assert g.rows[0].gpu_share == 0.55 and [r.arm for r in g.below_bound()] == ["stock"]
    assert Report.from_json({**BASE, "gpu_share": doc}).to_json()["gpu_share"] == doc
