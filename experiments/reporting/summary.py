"""report.md's summary table: per compared metric and per SLO tier the change with its 95% interval,
the A/A band and the verdict, then the planted control against its prediction; one note under it
says which unit the intervals are over and where the A/A band comes from."""

from __future__ import annotations

from collections.abc import Mapping

from experiments.reporting.report_latency import fmt_ci, fmt_num
from experiments.reporting.schema import Report
from experiments.stats.paired import METRIC_NAMES

_SECONDARY_NAMES = {"tpot_p50_ms": "median TPOT per window", "ttft_p90_ms": "p90 TTFT per window"}


def _excludes_zero(ci) -> bool:
    return ci is not None and (ci[0] > 0 or ci[1] < 0)


def _band(r: Report, key: str) -> str:
    """The A/A band of one row: the noise floor's interval for that metric (as the forest plot draws it)."""
    nf = r.noise_floor or {}
    if not nf.get("source"):
        return "not known"
    if not nf.get("applied", True):
        return "not applied"
    band = (nf.get("band_pct") or {}).get(key)
    if band is None:
        return "n/a"
    return fmt_ci(band) + (" (excludes 0)" if _excludes_zero(band) else "")


def _direction(treat: str, ci) -> str:
    if not _excludes_zero(ci):
        return "no detectable difference"
    return f"{treat} {'higher' if ci[0] > 0 else 'lower'}"


def _row(label: str, estimate, ci, band: str, verdict: str) -> str:
    return f"| {label} | {fmt_num(estimate, '{:+.2f}%')} | {fmt_ci(ci)} | {band} | {verdict} |"


def _latency_rows(r: Report, treat: str) -> list[str]:
    out = []
    for m, c in (r.paired_latency.get(treat) or {}).items():
        ci = c.get("ci95_pct")
        verdict = (f"no comparison ({c.get('reason')})" if c.get("estimate_pct") is None
                   else f"no interval ({c.get('reason')})" if ci is None else _direction(treat, ci))
        out.append(_row(f"{METRIC_NAMES.get(m, m)}, paired per request", c.get("estimate_pct"), ci,
                        _band(r, f"paired:{m}"), verdict))
    for m, sec in r.secondary.items():
        c = sec["comparison"]
        if c.get("mean") is None:
            continue
        verdict = "no interval" if c.get("t_ci95") is None else _direction(treat, c["t_ci95"])
        out.append(_row(f"{_SECONDARY_NAMES.get(m, m)} (secondary)", c["mean"], c.get("t_ci95"),
                        _band(r, m), verdict))
    return out


def _goodput_verdict(s: Mapping) -> str:
    if s["delta_goodput_pct"] is None:
        return f"no comparison ({s['reason'] or 'no paired windows'})"
    if not s.get("stressed", True):
        return "never stressed at these loads"
    if s["ci95_pct"] is None:
        return f"no interval ({s['reason']})"
    return _direction(s["treatment"], s["ci95_pct"])


def _goodput_rows(r: Report) -> list[str]:
    return [_row(f"goodput {s['name']} ({s['bounds']})", s["delta_goodput_pct"], s["ci95_pct"],
                 _band(r, f"goodput:{s['name']}"), _goodput_verdict(s)) for s in r.slos]


def _planted_rows(r: Report) -> list[str]:
    out = []
    for p in r.planted:
        label = f"planted control {p['arm']}" + (f" vs {p['reference']}" if p.get("reference") else "")
        pred = p.get("predicted_pct")
        if p.get("norm_calls_per_step") is None:
            verdict = f"no prediction ({p.get('reason')})"
        elif p.get("ci95_pct") is None:
            verdict = f"predicted {fmt_num(pred, '{:+.2f}%')}; no interval ({p.get('reason')})"
        else:
            verdict = (f"predicted {fmt_num(pred, '{:+.2f}%')}: "
                       + ("detected" if p["detected"] else "NOT detected"))
            if p.get("prediction_inside") is not None:
                verdict += f", prediction {'inside' if p['prediction_inside'] else 'outside'} the interval"
        out.append(_row(f"{label}, paired TPOT", p.get("measured_pct"), p.get("ci95_pct"),
                        _band(r, "paired:tpot_ms"), verdict))
    return out


def _instance_rows(r: Report) -> list[str]:
    """Paired TPOT with the server-instance variance (report.json over_instances), where known."""
    oi = r.over_instances or {}
    out = []
    for row in oi.get("rows") or []:
        if row.get("ci95_pct") is None:  # no interval (a reason says why: the report's instance section)
            continue
        treat = row["comparison"].split(" vs ")[0]
        out.append(_row(f"TPOT {row['comparison']}, over server instances", row["estimate_pct"],
                        row["ci95_pct"], "-", _direction(treat, row["ci95_pct"])))
    return out


def _unit_note(r: Report) -> str:
    base, treat = r.comparison
    nf = r.noise_floor or {}
    same_run = str(nf.get("source")).startswith("this run")
    source = ("A/A band: none (no A/A arm in this run and no A/A report given)" if not nf.get("source")
              else f"A/A band: the A/A floor of {nf['source']} is not applied (its design differs)"
              if not nf.get("applied", True) else f"A/A band: the A/A floor of {nf['source']}"
              + ("" if same_run else ", its spread at this run's number of cells"))
    planted = " (the planted control against its reference)" if r.planted else ""
    return (f"Changes of {treat} against {base}{planted}, 95% t intervals over windows x loads of one "
            "server per arm (the paired cells of one pair of server processes, so they leave out how much "
            "two servers of one build differ); paired rows: the per-request log ratio, median per cell; "
            f"goodput rows: the per-window change in % of the baseline's mean. {source}."
            + (f" Rows over server instances: {r.over_instances['source']}." if r.over_instances else
               " No estimate of how much two servers differ exists for this GPU and model, so no interval "
               "here carries it."))


def summary_lines(r: Report) -> list[str]:
    """The summary table and the note under it."""
    treat = r.treatment
    return ["| comparison | change | 95% interval | A/A band | verdict |", "|---|---|---|---|---|",
            *_latency_rows(r, treat), *_goodput_rows(r), *_planted_rows(r), *_instance_rows(r), "",
            _unit_note(r), ""]
