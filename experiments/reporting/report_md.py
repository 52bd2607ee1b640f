"""report.md: the title, the summary table, the notices, the design, every comparison in full, then
tables and detail."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from experiments.reporting import hostreport
from experiments.reporting.duetreport import layout_lines
from experiments.reporting.hostbound import section_lines, warning_lines
from experiments.reporting.report_knee import capacity_text, knee_lines
from experiments.reporting.report_latency import (
    fmt_num,
    latency_lines,
    noise_floor_lines,
    paired_lines,
    resident_line,
)
from experiments.reporting.schema import Report
from experiments.reporting.summary import summary_lines
from experiments.stats import knee
from experiments.stats.plantedline import planted_text

LATENESS_BOUND_MS = 10.0  # a send later than this no longer replays the trace's arrival process
UNOBSERVED_SHARE = 0.01  # above this share of a cell's replies without observed token timing, say so
BATCHED_SHARE = 0.2  # above this share of replies streamed several tokens per chunk, say so
PLOTS_NOTE = ("Drawn beside this report by the analysis; a committed run leaves them out (docs/DESIGN.md, "
              "\"The tracked tree\"): `python -m experiments.analyze <this directory>` draws them again.")


def notices(r: Report) -> list[str]:
    """The notices under the summary table: A/A, CPU, partial run, user-started servers, prompt lengths,
    a load generator that fell behind (in measured cells or in the knee search), token timing not
    observed or streamed in batches."""
    lines = []
    if r.aa.is_aa:
        why = str(r.aa.why)
        if why.lower().startswith("a/a run"):
            why = why[len("a/a run"):].lstrip(" :")
        tail = "" if "noise" in why else " Every difference below is noise: it shows the noise floor."
        lines.append(f"**A/A run** — {why}{tail}  ")  # trailing spaces: markdown line break
    if r.device == "cpu":
        lines.append("**CPU run** — it checks the pipeline (servers, open-loop replay, pairing, statistics, "
                     "report), not the kernel.  ")
    if r.status == "damaged":
        lines.append("**DAMAGED RECORDS** — analysed anyway (--accept-damaged), so no figure below is a "
                     f"whole run's: {'; '.join(r.records.damage or [])}.  ")
    damaged_and_partial = r.status == "damaged" and (r.missing or r.run_status != "complete")
    if r.status == "partial" or damaged_and_partial:
        why = (r.stopped_reason or f"run status is {r.run_status!r}").splitlines()[0]
        lines.append(f"**PARTIAL RUN** — {len(r.missing)} arm-window cells missing "
                     f"(listed under Missing); reason: {why}.  ")
    users = [lab for lab, d in r.arm_definitions.items() if d.get("endpoint")]
    if users:
        lines.append(f"**Servers started by the user** — {', '.join(users)}: the kit started none of "
                     "them, so each arm's identity (kernels, flags, environment) is what the user "
                     "declared (see Arms).  ")
    check = r.prompts.get("check") or {}
    if check.get("mismatched"):
        lines.append(f"**Prompt lengths differ from the trace** — in {check['mismatched']} of "
                     f"{check['checked']} requests the server's usage.prompt_tokens is not the trace's "
                     "input_tokens (examples under Arms and prompts).  ")
    late = [f"{row['arm']} {row['load']:g}x ({row['lateness_p99_ms']:.0f} ms)" for row in r.latency
            if (row.get("lateness_p99_ms") or 0.0) > LATENESS_BOUND_MS]
    if late:
        lines.append(f"**The load generator fell behind** — send lateness p99 above {LATENESS_BOUND_MS:g} "
                     f"ms in {', '.join(late)}: those cells did not replay the trace's arrival times.  ")
    stopped = (r.knee or {}).get("stopped") or {}
    if stopped.get("reason") == knee.CLIENT:
        lines.append(f"**The client limited the knee search** — its replays at {stopped['factor']:g}x were "
                     "sent late, so the search stopped there, short of any tier's knee it had not reached "
                     "(Knee search below).  ")
    blind = [f"{row['arm']} {row['load']:g}x ({row['tpot_unobserved']} of {row['n']})"
             for row in r.latency
             if row.get("tpot_unobserved") and row["tpot_unobserved"] > UNOBSERVED_SHARE * row["n"]]
    if blind:
        lines.append("**Token timing not observed** — replies of 2+ tokens that the client read in one "
                     f"network read (it fell behind the stream) in {', '.join(blind)}: they have no TPOT, "
                     "are left out of TPOT comparisons and meet no TPOT bound; a busy client machine is "
                     "the usual cause.  ")
    batched = [f"{row['arm']} {row['load']:g}x ({100 * row['batched'] / row['n']:.0f}%)"
               for row in r.latency if row.get("batched") and row["batched"] > BATCHED_SHARE * row["n"]]
    if batched:
        lines.append("**Tokens streamed in batches** — replies that came in fewer chunks than tokens in "
                     f"{', '.join(batched)}: the server sent several tokens per chunk (its output loop "
                     "fell behind the engine), so TPOT there follows the frontend's cadence, not the GPU "
                     "step's.  ")
    return lines + hostreport.notice(r)


def comparison_lines(r: Report) -> list[str]:
    """Every comparison in full: the layout, the paired latency changes with their fit and the A/A floor
    of the same run, the planted control, one goodput verdict per SLO, the per-window medians."""
    lines = layout_lines(r) + paired_lines(r) + [f"- {planted_text(p)}" for p in r.planted]
    lines += [f"- {s['verdict']}" for s in r.slos] + latency_lines(r)
    return ["## Comparisons", "", *lines, ""]


def _slo_tables(r: Report) -> list[str]:
    labels = r.arm_labels
    out = ["## Attainment and goodput per load (pooled over windows)", ""]
    for s in r.slos:
        out += [f"### {s['name']} ({s['bounds']})", "",
                ("| arm | load | requests | met | attainment | goodput (attainment x offered rate, req/s) "
                 "| achieved (met / real replay time, req/s) |"), "|---|---|---|---|---|---|---|"]
        rows = sorted(s["per_load"], key=lambda p: (labels.index(p["arm"]), p["load"]))
        out += [f"| {p['arm']} | {p['load']:g}x | {p['n']} | {p['n_met']} | {p['attainment']:.3f} | "
                f"{p['goodput_rps']:.3f} | {fmt_num(p.get('achieved_goodput_rps'), '{:.3f}')} |"
                for p in rows]
        out += ["", ("Only cells both arms completed are pooled. Goodput is attainment x offered rate; the "
                     "achieved column divides by the replays' real duration (longer when the server falls "
                     "behind)."),
                "", "| arm | highest load >= 90% attainment | same from p90 latency curves |",
                "|---|---|---|"]
        out += [f"| {a} | {capacity_text(s[a]['capacity_by_attainment'])} | "
                f"{capacity_text(s[a]['capacity_by_latency'])} |" for a in (s["baseline"], s["treatment"])]
        out += ["", *_capacity_line(s)]
        out.append("")
        for load, c in s["by_load"].items():
            ci = "n/a" if c["t_ci95"] is None else f"[{c['t_ci95'][0]:+.1f}, {c['t_ci95'][1]:+.1f}]%"
            out.append(f"At {float(load):g}x: goodput change {fmt_num(c['mean'], '{:+.1f}%')}, 95% CI {ci} "
                       f"over {c['n']} windows.  ")
        out += ["", f"Per-window goodput differences ({s['treatment']} - {s['baseline']}, "
                    "% of baseline mean): "
                + (", ".join(f"w{d['window']}@{d['load']:g}x {d['diff_pct']:+.1f}" for d in s["per_window"])
                   or "none")]
        if s["unpaired"] or s["undefined"]:
            out.append(f"Unpaired: {s['unpaired']}; undefined: {s['undefined']}")
        out.append("")
    return out


def _capacity_line(s: Mapping) -> list[str]:
    """Capacity per window (the load where that window's attainment crosses 90%) per arm, and its
    paired change, when the loads bracket the knee."""
    cap = s.get("capacity_per_window") or {}
    arms = cap.get("arms") or {}
    if not any(v.get("n") for v in arms.values()):
        return ["Capacity per window: not located (the loads do not bracket this tier's 90% knee).  "]
    parts = [f"{a} {fmt_num(v['mean'], '{:.3g}')}x"
             + (f" [{v['ci95'][0]:.3g}, {v['ci95'][1]:.3g}]x" if v.get("ci95") else "")
             + f" over {v['n']} windows" for a, v in arms.items()]
    p = cap.get("paired") or {}
    change = ("" if p.get("mean") is None else f"; paired change {p['mean']:+.1f}%"
              + (f", 95% t CI [{p['t_ci95'][0]:+.1f}, {p['t_ci95'][1]:+.1f}]%" if p.get("t_ci95") else ""))
    return [f"Capacity per window (90% attainment crossing): {'; '.join(parts)}{change}.  "]


def _latency_table(r: Report) -> list[str]:
    """Latency percentiles per arm and load; inter-token latency columns where the records kept them."""
    metrics = ["ttft", "tpot", "e2e"] + (["itl"] if any("itl_p50_ms" in x for x in r.latency) else [])
    head = " | ".join(f"{m.upper()} p50 | p90 | p99" for m in metrics)
    out = ["## Latency per arm and load (succeeded requests, ms)", "",
           f"| arm | load | n | failed | req/s | output tok/s | {head} | send lateness p99 | max |",
           "|---" * (8 + 3 * len(metrics)) + "|"]
    for row in sorted(r.latency, key=lambda x: (r.arm_labels.index(x["arm"]), x["load"])):
        vals = [fmt_num(row.get("request_rps"), "{:.2f}"), fmt_num(row.get("output_tok_s"), "{:.0f}")]
        vals += [fmt_num(row.get(f"{m}_p{p}_ms"), "{:.1f}") for m in metrics for p in (50, 90, 99)]
        vals += [fmt_num(row.get(k), "{:.2f}") for k in ("lateness_p99_ms", "lateness_max_ms")]
        out.append(f"| {row['arm']} | {row['load']:g}x | {row['n']} | {row['failed']} | "
                   + " | ".join(vals) + " |")
    return out + ["", "Throughput as vLLM's benchmark gives it: succeeded requests and their output tokens "
                      "per second of the replays' real duration (t0 to the last request's end).", ""]


def _power_and_attribution(r: Report) -> list[str]:
    out = ["## Minimum detectable effect (alpha 0.05, power 0.8, paired t over windows)", ""]
    out += [f"- goodput, {k}: {fmt_num(v, '{:.2f}%')}" for k, v in r.mde_pct["goodput"].items()]
    for m, sec in r.secondary.items():
        c = sec["comparison"]
        ci = "n/a" if c["t_ci95"] is None else f"[{c['t_ci95'][0]:+.2f}, {c['t_ci95'][1]:+.2f}]%"
        out.append(f"- {m} per window: mean change {fmt_num(c['mean'], '{:+.2f}%')}, 95% CI {ci}, "
                   f"MDE {fmt_num(c['mde'], '{:.2f}%')} over {c['n']} windows")
    out += ["", *noise_floor_lines(r.noise_floor or {})]
    a = r.attribution
    lat = (r.paired_latency.get(r.treatment) or {}).get("tpot_ms") or {}
    tpot = ({"mean": lat.get("estimate_pct"), "t_ci95": lat.get("ci95_pct")} if lat.get("ci95_pct")
            else r.secondary.get("tpot_p50_ms", {}).get("comparison", {}))
    out += ["", "## Attribution: what the kernel can explain", "",
            "- predicted step-time change (upper bound): "
            f"{fmt_num(a.get('predicted_step_change_pct'), '{:+.3f}%')} "
            f"— {a.get('status')}: {a.get('reason')}",
            *([f"- policy: {a['policy_note']}"] if a.get("policy_note") else []),
            (f"- measured TPOT change (paired per request where there is an interval, else per-window "
             f"median): {fmt_num(tpot.get('mean'), '{:+.2f}%')}"), *_explained(a, tpot)]
    k = a.get("kernel_estimate")
    if k:
        out.append(f"- kernel benchmark estimate: {k.get('status')}: "
                   f"{fmt_num(k.get('norm_saved_us_per_step'), '{:.2f}')} us of norm time saved per step"
                   + (f" ({k['reason']})" if k.get("reason") else ""))
    return out + [""]


def design_lines(r: Report) -> list[str]:
    """Burn-in replays against the measured ones, and the drift check."""
    out = ["## Burn-in and drift", ""]
    if r.burnin:
        out += ["Burn-in after each server start (phase 'burnin', recorded, not compared), against the "
                "measured replay of the same window and load:", "",
                "| arm | window | load | n | median TPOT (ms) | vs measured | p90 TTFT (ms) | vs measured |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {b['arm']} | {b.get('window', 0)} | {b['load']:g}x | {b['n']} | "
                f"{fmt_num(b['tpot_p50_ms'], '{:.2f}')} | "
                f"{fmt_num(b['tpot_p50_ms_vs_measured_pct'], '{:+.1f}%')} | "
                f"{fmt_num(b['ttft_p90_ms'], '{:.1f}')} | "
                f"{fmt_num(b['ttft_p90_ms_vs_measured_pct'], '{:+.1f}%')} |" for b in r.burnin]
    else:
        out.append("No burn-in replays in this run (it predates them, or handed-in servers were used).")
    d = r.drift or {}
    for key, what in (("baseline", f"{d.get('baseline_arm')} per-cell median TPOT (% of its load's mean)"),
                      ("paired", "paired TPOT log ratio (%) of "
                       + " vs ".join(reversed(d.get("paired_arms") or [])))):
        t = d.get(key) or {}
        if t.get("slope") is None:
            out.append(f"- drift of {what}: not estimated ({t.get('reason')})")
        else:
            out.append(f"- drift of {what}: {t['slope']:+.3f} points {d['unit']}, 95% CI "
                       f"[{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}]"
                       f"{' — drifting' if t['significant'] else ''}")
    if (d.get("baseline") or {}).get("significant"):
        out.append("  (one arm's own TPOT also follows the traffic of each window, which the trace sets, so "
                   "its trend can be the trace's; the paired line is the one that compares arms over time)")
    return out + [""]


def _clipping_line(c: Mapping | None) -> list[str]:
    """The trace-changing token caps, if any, stated beside the design."""
    if not c or not (c.get("max_input_tokens") or c.get("max_output_tokens")):
        return []
    return [f"- token counts clipped: input <= {c.get('max_input_tokens') or 'no cap'}, output <= "
            f"{c.get('max_output_tokens') or 'no cap'} "
            f"({c.get('clipped_requests')} replayed requests changed)"]


def _explained(a: Mapping, tpot: Mapping) -> list[str]:
    """What part of the measured TPOT change the predicted step-time change accounts for."""
    pred, meas, ci = a.get("predicted_step_change_pct"), tpot.get("mean"), tpot.get("t_ci95")
    if pred is None or not meas or ci is None:
        return []
    inside = ci[0] <= pred <= ci[1]
    return [f"- the prediction accounts for {100 * pred / meas:.0f}% of the measured change and lies "
            f"{'inside' if inside else 'outside'} its 95% interval"
            + ("" if inside else ": the difference is not explained by the norm kernels' GPU time")]


def arm_lines(r: Report) -> list[str]:
    """Every arm: its description, its difference from the first arm, who started its server (and
    what an endpoint said of itself), then the prompts and the server-reported prompt lengths."""
    defs = r.arm_definitions or {}
    if not defs:
        return []
    base = r.arm_labels[0]
    out = ["## Arms and prompts", ""]
    for lab, d in defs.items():
        diff = d.get("vs_baseline")
        what = ("the baseline" if lab == base else "runs the same server as the baseline" if diff == []
                else f"differs from {base} in: {'; '.join(diff)}" if diff else "difference not known")
        who = d.get("identity") or ("started by the kit" if d.get("recorded") else "not recorded (older run)")
        line = f"- **{lab}** ({d.get('name')}): {d.get('description') or 'no description'} — {what}; {who}"
        if d.get("shared_flags_set"):
            line += (f"; sets shared flags {' '.join(d['shared_flags_set'])} (allowed with "
                     "--allow-arm-differences)")
        said = d.get("said_of_itself")
        if said:
            model = said.get("model") or {}
            infos = said.get("metrics_info")
            names = ", ".join(sorted(infos)) if isinstance(infos, dict) else str(infos)
            line += (f". It said of itself: model {model.get('id')} (root {model.get('root')}, max_model_len "
                     f"{model.get('max_model_len')}); /metrics info: {names or 'none'}")
        out.append(line)
    p = r.prompts or {}
    check = p.get("check") or {}
    kind = ("text, exact token counts under " + str(p.get("tokenizer")) if p.get("kind") == "text"
            else f"token ids below {p.get('vocab_size')}" if p.get("kind") else "token ids (not recorded)")
    if not check:
        return out + ["", f"Prompts: {kind}. Server-reported prompt tokens: not checked (the run predates "
                      "the check).", ""]
    examples = f"; first mismatches: {check['examples']}" if check.get("examples") else ""
    return out + ["", f"Prompts: {kind}. Server-reported prompt tokens equal the trace's in "
                  f"{check['checked'] - check['mismatched']} of {check['checked']} requests that reported "
                  f"usage{examples}.", ""]


def instance_lines(r: Report) -> list[str]:
    """The run's own server instances: per comparison the interval over instance pairs, the within-pair
    interval beside it and the variance components (experiments.stats.instances.run_rows)."""
    rows = [row for row in (r.over_instances or {}).get("rows") or [] if "components_sd_pct" in row
            or "reason" in row]
    if not rows:
        return []
    out = ["## Server instances", "",
           f"Paired TPOT over {r.over_instances['source']} (t on the order-adjusted pair means, primary), "
           "beside the least-squares interval over all cells as if from one pair (no instance variance). "
           "Components as sd of a cell's log ratio in %: instance (one server's own offset), cell "
           "(window x load within a pair), request (within a cell); an arm of the baseline's build gives "
           "the A/A over instances.", "", "| comparison | change | over instances | df | within pairs | "
           "instance sd | cell sd | request sd |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "reason" in row:
            out.append(f"| {row['comparison']} | n/a | {row['reason']} | | | | | |")
            continue
        sd, (lo, hi), (wlo, whi) = row["components_sd_pct"], row["ci95_pct"], row["within_pair_ci95_pct"]
        req = f"{sd['request_var']:.2f}%" if "request_var" in sd else "n/a"
        out.append(f"| {row['comparison']} | {row['estimate_pct']:+.2f}% | [{lo:+.2f}, {hi:+.2f}]% | "
                   f"{row['df']} | [{wlo:+.2f}, {whi:+.2f}]% | {sd['instance_var']:.2f}% | "
                   f"{sd['cell_var']:.2f}% | {req} |")
    return [*out, "", *_placement_lines(r.design.get("placement"))]


def _placement_lines(p: dict | None) -> list[str]:
    """What --pin-cpus and --start-order did (runner.placement), when the run used either."""
    if not p:
        return []
    cores = "; ".join(f"{k} {v[0]}-{v[-1]}" for k, v in p["pin_cpus"].items() if v)
    pinned = f"each server on cores of its own ({cores})" if cores else "servers not pinned"
    starts = " / ".join(", ".join(labels) for labels in p["starts"])
    return [f"Placement: {pinned}; start order {p['start_order']} (starts: {starts}).", ""]


def render_markdown(r: Report) -> str:
    """The whole report.md text."""
    cmd = r.command or []
    t, rec, d, model = r.trace or {}, r.records, r.design, r.model
    durations = sorted({w["duration_s"] for w in d["windows"]})
    aa = "; A/A run" if r.aa.is_aa else ""
    notes = notices(r)
    lines = [f"# RMSNorm A/B goodput report ({r.status}{aa})", "", *warning_lines(r), *summary_lines(r),
             *notes, *([""] if notes else []),
             f"- model {model.get('name')} ({model.get('dtype')}, eager {model.get('eager')}) on {r.gpu}; "
             f"arms {', '.join(r.arm_labels)} (kernels {', '.join(r.arms)}), baseline first",
             f"- trace {t.get('path')} (sha256 {str(t.get('sha256'))[:12]}..., {t.get('requests')} requests)",
             f"- design: {len(d['windows'])} windows of {durations} s x loads "
             f"{', '.join(f'{x:g}x' for x in d['loads'])}, arm order {d.get('order_method')}; "
             f"warm-up {d['warmup']}",
             f"- records: {rec.total} in {rec.file}; {rec.warmup_excluded} warm-up and "
             f"{rec.burnin_excluded} burn-in records are not compared",
             *_clipping_line(d.get("clipping")), *resident_line(d), "", *comparison_lines(r)]
    if r.missing:
        lines += ["## Missing", ""] + [f"- {m['arm']} window {m['window']} load {m['load']:g}x: {m['reason']}"
                                       for m in r.missing] + [""]
    if r.stopped_reason:
        lines += ["## Why the run stopped", "", "```", r.stopped_reason.rstrip(), "```", ""]
    if r.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in r.warnings] + [""]
    lines += (arm_lines(r) + instance_lines(r) + knee_lines(r) + _slo_tables(r) + _latency_table(r)
              + section_lines(r.gpu_share) + design_lines(r) + hostreport.slow_host_lines(r)
              + _power_and_attribution(r))
    lines += ["## Plots", "", PLOTS_NOTE, ""] + [f"![{p}]({p})" for p in r.plots or []] + [""]
    if cmd and str(cmd[0]).endswith(".py"):
        cmd = ["python", *cmd]
    lines += ["## Reproduce", "", "```",
              " ".join(shlex.quote(str(c)) for c in cmd) or "(no command recorded)",
              "python -m experiments.analyze <this directory>", "```", ""]
    return "\n".join(lines)
