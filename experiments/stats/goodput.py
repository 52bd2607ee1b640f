"""Attainment and goodput per (arm, window, load, SLO), paired differences, and capacity at an SLO.

Input is a DataFrame of measured records (one row per request; see ``records_frame``). Goodput of a
cell is attainment x offered rate: requests meeting the SLO over the nominal length of that window
at that load (window duration_s / load). The replay's real duration (t0 to the end of its last
request, longer than nominal when the server falls behind) is kept beside it as ``replay_s``, with
``achieved_goodput_rps`` = met / replay_s. Errors and wrong output lengths count as misses, never as
dropped rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from experiments.core.rundir import REQUIRED_TAGS
from experiments.core.slo import SLO, meets
from experiments.stats import intervals as stats
from loadgen.records import (
    RequestRecord,
    batched,
    e2e_ms,
    itl_ms,
    lateness_ms,
    succeeded,
    tpot_ms,
    tpot_unobserved,
    ttft_ms,
)

CELL = ["arm", "window", "load"]
MEASURE = "measure"  # the phase of the replays that are compared; "warmup" and "burnin" are not
ATTAINMENT_TARGET = 0.9


def met_column(slo: SLO) -> str:
    """Name of the boolean column saying whether a request met ``slo``."""
    return f"met:{slo.name}"


def records_frame(records: Sequence[RequestRecord], slos: Sequence[SLO]) -> pd.DataFrame:
    """One row per record: tags, success, latencies (ms, NaN when undefined), the first and last token's
    time (ms since the replay's t0, NaN without one), the request's inter-token latencies (a list,
    empty when not recorded), the arm's server instance (0 for a run of one) and one met column per SLO."""
    rows = []
    for pos, r in enumerate(records):
        missing = [t for t in REQUIRED_TAGS if t not in r.tags]
        if missing:
            raise ValueError(f"record #{pos} (index {r.index}) lacks tags {missing}: tags={r.tags}")
        row = {
            "arm": str(r.tags["arm"]), "window": int(r.tags["window"]), "load": float(r.tags["load"]),
            "phase": str(r.tags["phase"]), "index": r.index, "ok": succeeded(r), "error": r.error,
            "due_ms": r.due_ns / 1e6, "end_ms": None if r.end_ns is None else r.end_ns / 1e6,
            "first_token_ms": None if r.first_token_ns is None else r.first_token_ns / 1e6,
            "last_token_ms": None if r.last_token_ns is None else r.last_token_ns / 1e6,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
            "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "ttft_ms": ttft_ms(r), "tpot_ms": tpot_ms(r), "e2e_ms": e2e_ms(r), "lateness_ms": lateness_ms(r),
            "tpot_unobserved": tpot_unobserved(r), "batched": batched(r), "itl_ms": itl_ms(r),
            "instance": int(r.tags.get("instance", 0)),
        }
        row.update({met_column(s): meets(r, s) for s in slos})
        rows.append(row)
    columns = [*REQUIRED_TAGS, "index", "ok", "error", "due_ms", "end_ms", "first_token_ms", "last_token_ms",
               "input_tokens", "output_tokens", "prompt_tokens", "completion_tokens", "ttft_ms", "tpot_ms",
               "e2e_ms", "lateness_ms", "tpot_unobserved", "batched", "itl_ms", "instance",
               *(met_column(s) for s in slos)]
    df = pd.DataFrame(rows, columns=columns)
    # typed also when empty (a run stopped before its first request): "ok" a mask, never a column
    # selection; the numbers numeric for the pairing's comparisons
    df = df.astype({"window": int, "load": float, "index": int, "ok": bool, "due_ms": float,
                    "input_tokens": int, "output_tokens": int, "tpot_unobserved": bool,
                    "batched": bool})
    for col in ("end_ms", "first_token_ms", "last_token_ms", "ttft_ms", "tpot_ms", "e2e_ms", "lateness_ms"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


def split_phases(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """(rows of the measured phase, {other phase: rows excluded}); warm-up and burn-in are not compared."""
    measured = df["phase"] == MEASURE
    excluded = df.loc[~measured, "phase"].value_counts().to_dict()
    return df[measured].copy(), {str(k): int(v) for k, v in sorted(excluded.items())}


def replay_seconds(cell: pd.DataFrame) -> float:
    """How long one cell's replay ran: t0 to the last request's end (s); NaN where none ended."""
    return float(cell["end_ms"].max()) / 1e3


def cell_table(df: pd.DataFrame, slos: Sequence[SLO], window_durations: Mapping[int, float]) -> pd.DataFrame:
    """Per (arm, window, load, slo): n, n_ok, n_met, attainment, duration_s (nominal), goodput_rps
    (attainment x offered rate), replay_s (t0 to the last request's end) and achieved_goodput_rps."""
    unknown = sorted(set(df["window"]) - set(window_durations))
    if unknown:
        raise ValueError(f"records name windows {unknown} that run.json does not list")
    out = []
    for (arm, window, load), g in df.groupby(CELL, sort=True):
        duration = window_durations[window] / load
        ran = replay_seconds(g)
        replay = max(ran, duration) if math.isfinite(ran) else math.nan
        for s in slos:
            n_met = int(g[met_column(s)].sum())
            out.append({"arm": arm, "window": window, "load": load, "slo": s.name, "n": len(g),
                        "n_ok": int(g["ok"].sum()), "n_met": n_met, "attainment": n_met / len(g),
                        "duration_s": duration, "goodput_rps": n_met / duration, "replay_s": replay,
                        "achieved_goodput_rps": n_met / replay})
    return pd.DataFrame(out, columns=[*CELL, "slo", "n", "n_ok", "n_met", "attainment", "duration_s",
                                      "goodput_rps", "replay_s", "achieved_goodput_rps"])


def per_load_attainment(cells: pd.DataFrame, slo: str) -> pd.DataFrame:
    """Pooled over windows per (arm, load): n, n_met, attainment, goodput_rps (total met / total
    nominal time) and achieved_goodput_rps (total met / total replay time).

    Pass only cells every compared arm completed (paired_cells), or arms are pooled over different
    windows.
    """
    c = cells[cells["slo"] == slo]
    g = c.groupby(["arm", "load"], sort=True)[["n", "n_met", "duration_s", "replay_s"]].sum().reset_index()
    g["attainment"] = g["n_met"] / g["n"]
    g["goodput_rps"] = g["n_met"] / g["duration_s"]
    g["achieved_goodput_rps"] = g["n_met"] / g["replay_s"]
    return g


def paired_cells(frame: pd.DataFrame, arms: Sequence[str]) -> pd.DataFrame:
    """Rows of ``frame`` (columns arm, window, load, ...) whose (window, load) every arm in ``arms`` has."""
    have = [set(zip(g["window"], g["load"])) for g in (frame[frame["arm"] == a] for a in arms)]
    common = set.intersection(*have) if have else set()
    keep = [(a in arms) and ((w, ld) in common)
            for a, w, ld in zip(frame["arm"], frame["window"], frame["load"])]
    return frame[pd.Series(keep, index=frame.index, dtype=bool)]


def paired_relative(cell_values: pd.DataFrame, value: str, baseline: str, treatment: str) -> dict:
    """Per (window, load) paired difference of ``value`` in % of the baseline's mean at that load.

    ``cell_values`` has columns arm, window, load and ``value``. Returns {"diffs": [{window, load,
    baseline, treatment, diff_pct}], "unpaired": [{window, load, arm}], "undefined": [...] (baseline
    mean 0 or value missing), "comparison": stats.Comparison.to_json()}.
    """
    b = cell_values[cell_values["arm"] == baseline].set_index(["window", "load"])[value].to_dict()
    t = cell_values[cell_values["arm"] == treatment].set_index(["window", "load"])[value].to_dict()
    raw, unpaired = stats.paired_differences(b, t)
    base_mean = {load: float(np.nanmean([v for (w, ld), v in b.items() if ld == load and (w, ld) in raw]))
                 for (_, load) in raw}
    diffs, undefined = [], []
    for (window, load), d in sorted(raw.items()):
        scale = base_mean[load]
        row = {"window": window, "load": load, "baseline": b[(window, load)], "treatment": t[(window, load)]}
        if not math.isfinite(d) or not math.isfinite(scale) or scale == 0:
            undefined.append({**row, "reason": f"baseline mean {value} at load {load} is {scale}"})
            continue
        diffs.append({**row, "diff_pct": 100.0 * d / scale})
    return {
        "metric": value, "baseline": baseline, "treatment": treatment, "diffs": diffs,
        "unpaired": [{"window": w, "load": ld, "arm": baseline if (w, ld) in b else treatment}
                     for (w, ld) in unpaired],
        "undefined": undefined,
        "comparison": stats.compare_paired([d["diff_pct"] for d in diffs]).to_json(),
    }


def highest_passing_load(loads: Sequence[float], values: Sequence[float], limit: float) -> dict:
    """Highest load whose ``value <= limit``, interpolated linearly between the last pass and first fail.

    Walks up from the lowest load to the first failing one. Returns {"load", "status"} with status
    "interpolated", "below lowest" (load None: the lowest load already fails), "above highest" (load
    is the highest measured, which still passes) or "last passing load" (the next value is infinite).
    """
    pts = sorted(zip(loads, values))
    for i, (load, v) in enumerate(pts):
        if v <= limit:
            continue
        if i == 0:
            return {"load": None, "status": "below lowest", "lowest_load": load}
        l0, v0 = pts[i - 1]
        if not math.isfinite(v):
            return {"load": l0, "status": "last passing load"}
        return {"load": l0 + (limit - v0) * (load - l0) / (v - v0), "status": "interpolated"}
    return {"load": pts[-1][0] if pts else None, "status": "above highest" if pts else "no loads"}


def capacity_from_attainment(per_load: pd.DataFrame, arm: str, target: float = ATTAINMENT_TARGET) -> dict:
    """Highest load with pooled attainment >= target for one arm (per_load from per_load_attainment)."""
    p = per_load[per_load["arm"] == arm]
    return highest_passing_load(list(p["load"]), list(-p["attainment"]), -target)


def latency_curve(df: pd.DataFrame, arm: str, q: float = ATTAINMENT_TARGET) -> pd.DataFrame:
    """Per load: q-quantile of TTFT and TPOT, failed requests counted as +inf (inverted-CDF quantile).

    With the inverted CDF, "quantile <= bound" means at least a fraction q of requests had that
    metric within the bound. TPOT of 1-token replies is undefined and left out.
    """
    rows = []
    for load, g in df[df["arm"] == arm].groupby("load", sort=True):
        ttft = np.where(g["ok"], g["ttft_ms"], np.inf)
        tpot = np.where(g["ok"], g["tpot_ms"], np.inf)
        tpot = tpot[~np.isnan(tpot)]
        rows.append({"load": load, "n": len(g),
                     "ttft_q_ms": stats.percentile(ttft, q, method="inverted_cdf"),
                     "tpot_q_ms": (stats.percentile(tpot, q, method="inverted_cdf") if tpot.size
                                   else math.nan)})
    return pd.DataFrame(rows, columns=["load", "n", "ttft_q_ms", "tpot_q_ms"])


def capacity_from_latency(curve: pd.DataFrame, slo: SLO) -> dict:
    """Highest load where both the TTFT and TPOT quantile curves stay within the SLO's bounds."""
    ttft = highest_passing_load(list(curve["load"]), list(curve["ttft_q_ms"]), slo.ttft_ms)
    tpot_pts = curve.dropna(subset=["tpot_q_ms"])
    tpot = highest_passing_load(list(tpot_pts["load"]), list(tpot_pts["tpot_q_ms"]), slo.tpot_ms)
    limits = [c for c in (ttft, tpot) if c["status"] != "no loads"]
    if any(c["status"] == "below lowest" for c in limits):
        best = {"load": None, "status": "below lowest"}
    elif not limits:
        best = {"load": None, "status": "no loads"}
    else:
        best = min(limits, key=lambda c: c["load"])
    return {**best, "by_ttft": ttft, "by_tpot": tpot}


def latency_table(df: pd.DataFrame) -> list[dict]:
    """Per (arm, load): n, failed, p50/p90/p99 of TTFT, TPOT, E2E (ms) over succeeded requests (and
    of the inter-token latencies pooled over them, as vLLM's benchmark pools them, where kept), the
    client's send lateness (p99 and max over every sent request: a late client hides load), and
    tpot_unobserved: succeeded replies of 2+ tokens read in one network read (no TPOT), and batched:
    those the server streamed in fewer chunks than tokens. Throughput as vLLM's benchmark gives it,
    over the cells' real replay time (replay_seconds, summed over windows): succeeded requests per
    second (request_rps) and their output tokens per second (output_tok_s)."""
    out = []
    for (arm, load), g in df.groupby(["arm", "load"], sort=True):
        row: dict = {"arm": arm, "load": load, "n": len(g), "failed": int((~g["ok"]).sum())}
        ok = g[g["ok"]]
        ran = [replay_seconds(w) for _, w in g.groupby("window")]
        replay = sum(x for x in ran if math.isfinite(x))
        row["request_rps"] = len(ok) / replay if replay > 0 else None
        row["output_tok_s"] = float(ok["output_tokens"].sum()) / replay if replay > 0 else None
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
            vals = ok[metric].dropna().to_numpy()
            for p in (50, 90, 99):
                row[f"{metric[:-3]}_p{p}_ms"] = stats.percentile(vals, p / 100) if vals.size else None
        late = g["lateness_ms"].dropna().to_numpy()
        row["lateness_p99_ms"] = stats.percentile(late, 0.99) if late.size else None
        row["lateness_max_ms"] = float(late.max()) if late.size else None
        row["tpot_unobserved"] = int(g["tpot_unobserved"].sum())
        row["batched"] = int(g["batched"].sum())
        itl = [gap for gaps in ok["itl_ms"] for gap in gaps]
        if itl:  # records written before inter-token latencies were kept have none: no columns
            for p in (50, 90, 99):
                row[f"itl_p{p}_ms"] = stats.percentile(np.asarray(itl), p / 100)
        out.append(row)
    return out


def cell_latency(df: pd.DataFrame) -> pd.DataFrame:
    """Per (arm, window, load): median TPOT and p90 TTFT over succeeded requests (for paired diffs)."""
    ok = df[df["ok"]]
    g = ok.groupby(CELL, sort=True)
    return pd.DataFrame({"tpot_p50_ms": g["tpot_ms"].median(),
                         "ttft_p90_ms": g["ttft_ms"].quantile(0.9)}).reset_index()
