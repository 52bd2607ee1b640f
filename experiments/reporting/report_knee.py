"""report.md's knee search section: attainment and send lateness per factor searched, the knees, why the
search stopped, the loads chosen and the check against the measured windows."""

from __future__ import annotations

from collections.abc import Mapping

from experiments.reporting.report_latency import fmt_num
from experiments.reporting.schema import Report
from experiments.stats import knee


def capacity_text(c: Mapping) -> str:
    """A capacity (goodput.highest_passing_load) as the report says it."""
    if c["status"] in ("interpolated", "last passing load"):
        return f"{c['load']:.3g}x ({c['status']})"
    if c["status"] == "above highest":
        return f">= {c['load']:.3g}x (above highest load)"
    return c["status"]


def knee_lines(r: Report) -> list[str]:
    """The knee search: attainment per factor and tier (from the records; with the send lateness where
    run.json records why the search stopped), the knees, why it stopped and the loads chosen."""
    k = r.knee
    if not k:
        return []
    names = list(k["points"])
    factors = sorted({f for pts in k["points"].values() for f, _ in pts})
    windows = k.get("windows", [0])
    which = (f"window {windows[0]}" if len(windows) == 1 else
             f"windows {', '.join(map(str, windows))} pooled")
    late = k.get("lateness")  # recorded since the search stops at the client's limit
    head = names + (["send lateness p99, median replay (ms)", "pooled p99", "max"] if late else [])
    out = [f"## Knee search (baseline arm, {which} per factor, not compared)", "",
           "| factor | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for f in factors:
        vals = [next((f"{a:.3f}" for x, a in k["points"][n] if x == f), "") for n in names]
        if late:
            v = late.get(f"{f:g}") or {}
            vals += [fmt_num(v.get(c), "{:.2f}") for c in ("median_replay_p99_ms", "p99_ms", "max_ms")]
        out.append(f"| {f:g}x | " + " | ".join(vals) + " |")
    knees = ", ".join(f"{n} {capacity_text(v)}" for n, v in k["knees"].items())
    out += ["", f"Knees (90% attainment): {knees}."]
    if k.get("beyond_listed"):
        more = ", ".join(f"{f:g}x" for f in k["beyond_listed"])
        out.append(f"Every tier still met at the last --knee factor: searched on at {more}.")
    if k.get("stopped"):
        out.append(knee.stop_line(k["stopped"], late.get(f"{k['stopped']['factor']:g}") or {},
                                  k["lateness_target_ms"]))
    if k.get("shared_prompts"):
        out.append("The pooled windows drew request i's prompt from one seed per factor (as every run did "
                   "before the search seeded each window), so their prompts shared prefixes and the prefix "
                   "cache served the repeats: this search's attainment is optimistic and its knees too high; "
                   "the capacity from the measured loads (below) is the reference.")
    c = k["chosen"]
    out += _knee_check(r, c)
    out.append(f"Measured at {', '.join(f'{x:g}x' for x in c['loads'])}: around the {c['tier']} knee "
               f"({c['knee']:.3g}x) plus a latency-sensitive load ({min(c['loads']):g}x)." if c.get("loads")
               else f"No knee chosen ({c.get('reason')}); measured at --loads.")
    return out + [""]


def _knee_check(r: Mapping, chosen: Mapping) -> list[str]:
    """The search's knee against the measured windows' own crossing of 90% for the baseline arm: the
    search pools a few windows, so it must land inside the per-window capacity interval to stand for
    the windows measured."""
    tier = next((s for s in r.slos or [] if s["name"] == chosen.get("tier")), None)
    if tier is None or chosen.get("knee") is None:
        return []
    base = tier["baseline"]
    pooled = capacity_text(tier[base]["capacity_by_attainment"])
    v = ((tier.get("capacity_per_window") or {}).get("arms") or {}).get(base) or {}
    line = (f"Check against the measured windows: {base}'s {tier['name']} attainment crossed 90% at "
            f"{pooled} pooled")
    if not v.get("ci95"):
        return [line + "; no per-window interval to judge the search's knee by."]
    lo, hi = v["ci95"]
    verdict = ("lies inside." if lo <= chosen["knee"] <= hi else
               "lies outside, so the searched windows did not stand for the measured ones and the loads "
               "are not where the search meant them.")
    return [line + f", per window {v['mean']:.3g}x [{lo:.3g}, {hi:.3g}]x: the search's "
            f"{chosen['knee']:.3g}x {verdict}"]
