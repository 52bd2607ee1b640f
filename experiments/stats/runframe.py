"""A run directory's requests as one pandas DataFrame, for a user's own analysis.

    import experiments
    df = experiments.load_run("experiments/results/cpu-tiny-aa")
    df[df.phase == "measure"].groupby(["arm", "load"]).tpot_ms.median()

One row per request of every arm and phase (warm-up, burn-in, knee search and measured replays,
errors included), with the derived metrics of experiments.stats.goodput.records_frame (ttft_ms, tpot_ms,
e2e_ms, lateness_ms, `succeeded`) and one `met:<tier>` column per SLO tier. report.json stays the
summary; this is the data under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments.core.rundir import RECORD_FILES, load_records
from experiments.core.runfile import read_run
from experiments.core.slo import DEFAULT_SLO_FILE, SLO, load_slo_file
from experiments.stats import goodput


def load_run(path: str | Path, slos: Sequence[SLO] | None = None) -> pd.DataFrame:
    """Every request of the run directory `path`: arm (label), arm_name, window, load, phase, burnin
    (the burn-in replay's number, else NA), instance (the arm's server instance, 0 for records
    written before runs had more than one), index, succeeded, error, token counts asked and reported
    (prompt_tokens_match: the server's usage.prompt_tokens equals the trace's input_tokens), times
    and latencies in ms, tpot_unobserved (2+ tokens read in one network read: no TPOT), and
    met:<tier> per SLO (`slos`, default experiments/slos.toml).
    FileNotFoundError when `path` holds no run.json or no records; ValueError or ResultFileError
    naming the file when one is damaged."""
    run_dir = Path(path)
    run = read_run(run_dir)
    records, source = load_records(run_dir)
    if source is None:
        raise FileNotFoundError(f"{run_dir}: no {' or '.join(RECORD_FILES)}")
    tiers = list(slos) if slos is not None else load_slo_file(DEFAULT_SLO_FILE)
    df = goodput.records_frame(records, tiers).rename(columns={"ok": "succeeded"})
    names = dict(zip(run.arm_labels, run.arms))
    df.insert(1, "arm_name", df["arm"].map(names))
    df.insert(5, "burnin", pd.array([r.tags.get("burnin") for r in records], dtype="Int64"))
    df.insert(6, "instance", df.pop("instance"))  # records_frame's, beside the other tags
    reported = df["prompt_tokens"].astype("Int64")
    df["prompt_tokens"] = reported
    df["prompt_tokens_match"] = (reported == df["input_tokens"]).astype("boolean")
    return df
