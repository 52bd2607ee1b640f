"""report.md's latency lines: the paired per-request comparisons with their fit, intervals and A/A
floor, the secondary per-window medians, and the A/A noise floor's spread and what it implies."""

from __future__ import annotations

from collections.abc import Mapping

from experiments.reporting.schema import Report
from experiments.stats.paired import METRIC_NAMES

_ADJUSTED = {"gpu": "GPU"}  # the covariate of a duet's comparison (stats.duet), else the arm order


def fmt_num(x, fmt: str = "{:.3g}") -> str:
    """`x` in `fmt`, "n/a" for None."""
    return "n/a" if x is None else fmt.format(x)


def fmt_ci(ci, digits: int = 2) -> str:
    """A [lo, hi] percent interval as text, "n/a" for None."""
    return "n/a" if ci is None else f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]%"


def aa_floor_text(pair, estimate: float, ci, digits: int = 2) -> str:
    """"; A/A floor (<control> vs <baseline>, this run) <estimate> [lo, hi]%" for the run's interleaved
    A/A pair (baseline, control), and, where that interval excludes 0, that a change of that size is
    not the arms'."""
    base, ctrl = pair
    text = f"; A/A floor ({ctrl} vs {base}, this run) {estimate:+.{digits}f}% {fmt_ci(ci, digits)}"
    if ci[0] > 0 or ci[1] < 0:
        text += (" — the A/A interval excludes 0: the two servers of one arm differ, so a change of that "
                 "size is not the arms'")
    return text


def paired_lines(r: Report) -> list[str]:
    """Per latency metric: the paired per-request change of the primary comparison, its intervals and
    MDE, and the A/A floor's interval from the same run; then the position effect; then the same
    change for every further arm that is not the A/A control (e.g. a planted slowdown); then every
    comparison a run of resident sets could not make."""
    treat = r.treatment
    others = [lab for lab in r.paired_latency if lab != treat and lab not in r.aa.controls]
    out = _metric_lines(r, treat, with_floor=True)
    tpot = (r.paired_latency.get(treat) or {}).get("tpot_ms") or {}
    if tpot.get("position_pct") is not None:
        out.append(f"- position effect on TPOT (each later place in a cell's order vs an earlier one): "
                   f"{tpot['position_pct']:+.2f}% {fmt_ci(tpot['position_ci95_pct'])}, removed from the "
                   "estimate")
    for lab in others:
        out += _metric_lines(r, lab, with_floor=False)
    return out + [f"- {arm} vs {ref}: not measured (the two never shared a resident set, so never replayed a "
                  "cell together)" for ref, arm in r.design.get("not_measured_together") or []]


def resident_line(design: Mapping) -> list[str]:
    """The resident sets of a --resident run, in the order they take the GPU within every instance."""
    sets = design.get("resident_sets")
    if not sets:
        return []
    return [f"- resident sets (--resident {max(map(len, sets))}), in turn within every server instance, each "
            f"replaying its own equal share of the windows: {' | '.join(', '.join(s) for s in sets)}"]


def _metric_lines(r: Report, treat: str, with_floor: bool) -> list[str]:
    base = r.baseline
    lat = r.paired_latency.get(treat) or {}
    floor = (r.aa_in_run.paired_latency if r.aa_in_run else None) or {}
    nf = r.noise_floor or {}
    out = []
    for m, c in lat.items():
        name = METRIC_NAMES.get(m, m)
        if c.get("estimate_pct") is None:
            out.append(f"- {name}, paired per request: no comparison of {treat} ({c.get('reason')})")
            continue
        if c.get("ci95_pct") is None:
            out.append(f"- {name}, paired per request: {treat} {c['estimate_pct']:+.2f}% vs {base} over "
                       f"{c['n_cells']} cells — no interval ({c.get('reason')})")
            continue
        text = (f"- {name}, paired per request: {treat} {c['estimate_pct']:+.2f}% vs {base}, 95% CI "
                f"{fmt_ci(c['ci95_pct'])} ({_fit_text(c)}; window-block bootstrap "
                f"{fmt_ci(c['bootstrap_ci95_pct'])}); MDE {c['mde_pct']:.2f}%")
        f = floor.get(m) if with_floor else None
        if f and f.get("ci95_pct"):
            text += aa_floor_text(r.aa_in_run.pair, f["estimate_pct"], f["ci95_pct"])
        elif (with_floor and nf.get("applied") and not r.aa.is_aa and nf.get("source")
              and (nf.get("band_pct") or {}).get(f"paired:{m}")):
            text += f"; A/A floor ({nf['source']}) +-{nf['band_pct'][f'paired:{m}'][1]:.2f}%"
        out.append(text)
    return out


def _fit_text(c: Mapping) -> str:
    """How a paired comparison's primary interval was fitted (experiments.stats.paired)."""
    adjusted = _ADJUSTED.get(c.get("covariate"), "order")
    if c.get("estimator") != "huber":
        return f"{adjusted}-adjusted least-squares t over {c['n_cells']} cells, primary"
    return (f"Huber M-estimate with load effects, {adjusted}-adjusted t over {c['n_cells']} cells "
            f"({c['downweighted_cells']} downweighted), primary; least squares "
            f"{c['least_squares_pct']:+.2f}% {fmt_ci(c['least_squares_ci95_pct'])}")


_SECONDARY_NAMES = {"tpot_p50_ms": "median TPOT", "ttft_p90_ms": "p90 TTFT"}


def latency_lines(r: Report) -> list[str]:
    """One line per per-window latency metric (secondary): paired change, t interval (primary) and
    the percentile bootstrap (narrower than t over few windows), and the sign count."""
    base, treat = r.comparison
    out = []
    for metric, sec in r.secondary.items():
        c, diffs = sec["comparison"], [d["diff_pct"] for d in sec["per_window"]]
        if c.get("mean") is None:
            continue
        t, b = c.get("t_ci95"), c.get("bootstrap_ci95")
        ci = "n/a" if t is None else f"[{t[0]:+.1f}, {t[1]:+.1f}]%"
        boot = ("" if b is None
                else f"; percentile bootstrap [{b[0]:+.1f}, {b[1]:+.1f}]%, optimistic over few windows")
        name = _SECONDARY_NAMES.get(metric, metric)
        out.append(f"- {name} per window (secondary): {treat} {c['mean']:+.1f}% "
                   f"vs {base}, 95% t CI {ci}{boot}; higher in {sum(d > 0 for d in diffs)} of "
                   f"{len(diffs)} paired windows")
    return out


def noise_floor_lines(nf: Mapping) -> list[str]:
    """Where the A/A floor comes from, whether it applies, its spread and the windows it implies."""
    if not nf.get("source"):
        return [f"A/A noise floor: not known ({nf.get('reason')})."]
    out = [f"A/A noise floor ({nf['source']}): per-cell sd "
           + ", ".join(f"{k} {fmt_num(v, '{:.2f}%')}" for k, v in nf["sd_pct"].items())
           + " (paired: the primary fit's standard error x sqrt(cells), what the interval implies)."]
    if not nf.get("applied", True):
        diffs = "; ".join(f"{d['key']}: this run {d['this']}, floor {d['floor']}" if d["key"] else d["floor"]
                          for d in nf["design_differences"])
        out.append(f"**Not comparable, not applied**: the A/A run's design differs from this run's "
                   f"({diffs}).")
        return out
    need = []
    for k, v in nf["windows_needed"].items():
        if v.get("windows") is None:
            need.append(f"{k} n/a ({v.get('reason')})")
        else:
            need.append(f"{k} {v['windows']} (range {v['range'][0]}-{v['range'][1]} from the sd's 95% "
                        f"interval over {v['sd_from_n']} cells)")
    out.append(f"Paired cells for a +-{nf['target_half_width_pct']:g}% interval: " + ", ".join(need) + ".")
    if nf.get("tpot_by_load"):
        out.append("A/A paired TPOT per load (95% half-width): " + ", ".join(
            f"{load}x +-{v['half_width_pct']:.2f}% over {v['n']} cells ({v['estimator']})"
            for load, v in nf["tpot_by_load"].items()) + ".")
    return out
