"""What report.md says of slow host episodes (report.json "slow_host", experiments.stats.hostslow): a
notice at the top when a replay ran in one, and a section with the rule and every slow replay. Runs
recorded before the host signals have no entry and get neither."""

from __future__ import annotations

from collections.abc import Mapping

from experiments.reporting.report_latency import fmt_num
from experiments.reporting.schema import Report


def notice(r: Report) -> list[str]:
    """The notice under the summary table when a replay ran in a slow host episode."""
    s = r.slow_host
    if not s or not s["episodes"]:
        return []
    return [f"**Slow host episodes** — {s['episodes']} of {s['replays']} measured replays ran in one (listed "
            "under Slow host episodes); they are kept in every figure, not adjusted.  "]


COLUMNS = (("itl_p50_ms", "{:.2f}"), ("spacing_excess_pct", "{:+.1f}%"), ("steal_pct", "{:.2f}"),
           ("steal_excess_points", "{:+.2f}"), ("cpu_per_token_ms", "{:.3f}"), ("cpu_excess_pct", "{:+.1f}%"),
           ("other_cores_excess", "{:+.2f}"))


def _row(e: Mapping) -> str:
    start = "" if e["started_s"] is None else f"{e['started_s'] / 60:.1f}"
    verdict = ("yes: " + ", ".join(e["causes"]) if e["episode"] else
               "host not recorded" if e["causes"] is None else "no host signal")
    cells = [e["arm"], str(e["window"]), f"{e['load']:g}x", start,
             *(fmt_num(e[key], fmt) for key, fmt in COLUMNS), verdict]
    return "| " + " | ".join(cells) + " |"


def slow_host_lines(r: Report) -> list[str]:
    """The section: the rule with this run's thresholds, what was not recorded, the slow replays."""
    s = r.slow_host
    if not s:
        return []
    t = s["thresholds"]
    out = ["## Slow host episodes", "",
           f"Rule: {s['rule']}. Thresholds in this run: token spacing "
           f"{fmt_num(t['spacing_pct'], '{:+.1f}%')}, "
           f"engine CPU per token {fmt_num(t['cpu_per_token_pct'], '{:+.1f}%')}, steal {t['steal_points']:g} "
           f"point, other load {t['other_cores']:g} core.", ""]
    if s["not_recorded"]:
        out += ["Not recorded: " + "; ".join(s["not_recorded"]) + ".", ""]
    if not s["slow"]:
        return out + [f"No replay's token spacing passed the threshold ({s['replays']} measured replays): no "
                      "slow host episode named.", ""]
    out += [f"{len(s['slow'])} of {s['replays']} measured replays had slower token spacing than their "
            f"cells' other arms; {s['episodes']} ran in a slow host episode. Each signal beside its cell's "
            "other arms (vs others):", "",
            "| arm | window | load | start (min) | spacing p50 (ms) | vs others | steal % | vs others "
            "(points) | engine CPU per token (ms) | vs others | other busy cores vs others | slow host "
            "episode |",
            "|---" * 12 + "|"]
    return out + [_row(e) for e in s["slow"]] + [""]
