"""PNG plots of a run: attainment vs load, latency CDFs, per-window paired differences, and a forest
plot of every comparison with its A/A band (Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.reporting.schema import Report  # noqa: E402
from experiments.stats.paired import METRIC_NAMES  # noqa: E402

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


def attainment_vs_load(path: Path, per_slo: Sequence[dict], labels: Sequence[str]) -> None:
    """One panel per SLO: pooled attainment per load for each arm, with the 90% target."""
    fig, axes = plt.subplots(1, len(per_slo), figsize=(4.5 * len(per_slo), 3.6), squeeze=False)
    for ax, item in zip(axes[0], per_slo):
        pl = pd.DataFrame(item["per_load"], columns=["arm", "load", "attainment"])
        for color, arm in zip(COLORS, labels):
            p = pl[pl["arm"] == arm].sort_values("load")
            ax.plot(p["load"], p["attainment"], "o-", color=color, label=arm)
        ax.axhline(0.9, color="grey", ls=":", lw=1, label="90% target")
        ax.set(title=f"{item['slo'].name} ({item['slo'].describe()})", xlabel="load (x trace rate)",
               ylabel="SLO attainment", ylim=(-0.02, 1.02))
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_cdfs(path: Path, df: pd.DataFrame, labels: Sequence[str]) -> None:
    """Empirical CDFs of TTFT and TPOT (succeeded requests), per arm and load."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ok = df[df["ok"]]
    styles = ["-", "--", ":", "-."]
    for ax, metric in zip(axes, ("ttft_ms", "tpot_ms")):
        for color, arm in zip(COLORS, labels):
            for i, (load, g) in enumerate(ok[ok["arm"] == arm].groupby("load", sort=True)):
                v = np.sort(g[metric].dropna().to_numpy())
                if v.size:
                    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=color,
                            ls=styles[i % len(styles)], label=f"{arm} @ {load:g}x")
        ax.set(xlabel=f"{metric[:-3].upper()} (ms)", ylabel="fraction of requests", xscale="log")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no succeeded requests", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paired_differences(path: Path, series: Sequence[tuple[str, str, dict]],
                       noise_sd: dict | None = None) -> None:
    """Per-window paired differences (%) per metric, with the mean, its 95% CI band and the A/A floor.

    ``series`` holds (key, title, goodput.paired_relative result); ``noise_sd`` maps key -> A/A sd (%).
    """
    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.4 * len(series)), squeeze=False)
    for ax, (key, title, paired) in zip(axes[:, 0], series):
        d = paired["diffs"]
        ax.axhline(0, color="black", lw=0.8)
        ax.plot(range(len(d)), [x["diff_pct"] for x in d], "o", color="tab:blue", label="window")
        comp = paired["comparison"]
        if comp["mean"] is not None:
            ax.axhline(comp["mean"], color="tab:red", lw=1, label=f"mean {comp['mean']:+.2f}%")
        if comp["t_ci95"] is not None:
            ax.axhspan(*comp["t_ci95"], color="tab:red", alpha=0.15, label="95% CI")
        if noise_sd and noise_sd.get(key) is not None:
            s = 2 * noise_sd[key]
            ax.axhspan(-s, s, color="grey", alpha=0.15, label="A/A noise +-2 sd")
        ax.set_xticks(range(len(d)), [f"w{x['window']}@{x['load']:g}x" for x in d], fontsize=7, rotation=90)
        ax.set(ylabel="diff (%)", title=title)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def forest_rows(report: Report) -> list[dict]:
    """One row per compared metric of the primary comparison, then one per planted control (against its
    reference, with its prediction): label, estimate, 95% t interval (None when there is none) and the
    A/A band (the floor's interval, None when not known)."""
    treat = report.treatment
    bands = (report.noise_floor or {}).get("band_pct") or {}
    rows = []
    for m, c in (report.paired_latency.get(treat) or {}).items():
        rows.append({"label": f"{METRIC_NAMES.get(m, m)} paired per request",
                     "estimate": c.get("estimate_pct"),
                     "ci": c.get("ci95_pct"), "band": bands.get(f"paired:{m}")})
    for m, sec in report.secondary.items():
        c = sec["comparison"]
        rows.append({"label": f"{m} per window", "estimate": c.get("mean"), "ci": c.get("t_ci95"),
                     "band": bands.get(m)})
    for s in report.slos:
        rows.append({"label": f"goodput {s['name']}", "estimate": s["delta_goodput_pct"], "ci": s["ci95_pct"],
                     "band": bands.get(f"goodput:{s['name']}")})
    for p in report.planted:
        ref = f" vs {p['reference']}" if p.get("reference") else ""
        rows.append({"label": f"control {p['arm']}{ref}, TPOT", "estimate": p.get("measured_pct"),
                     "ci": p.get("ci95_pct"), "band": bands.get("paired:tpot_ms"),
                     "predicted": p.get("predicted_pct")})
    return rows


def forest(path: Path, report: Report) -> None:
    """Estimate and 95% interval per metric (% change of the treatment vs the baseline), over the A/A
    band of the same metric, and the planted control's with its prediction; rows without an interval
    are marked."""
    rows = forest_rows(report)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.8))
    for i, row in enumerate(reversed(rows)):
        if row["band"]:
            marked = "A/A 95% band" in ax.get_legend_handles_labels()[1]
            ax.fill_betweenx([i - 0.35, i + 0.35], *row["band"], color="grey", alpha=0.3, lw=0,
                             label=None if marked else "A/A 95% band")
        if row["estimate"] is None:
            ax.text(0, i, "no comparison", va="center", fontsize=7, color="grey")
        elif row["ci"] is None:
            ax.plot(row["estimate"], i, "o", mfc="white", color="tab:red")
            ax.text(row["estimate"], i + 0.25, "no interval", fontsize=6, color="grey", ha="center")
        else:
            err = [[row["estimate"] - row["ci"][0]], [row["ci"][1] - row["estimate"]]]
            ax.errorbar(row["estimate"], i, xerr=err, fmt="o", color="tab:red", capsize=3)
        if row.get("predicted") is not None:
            marked = "prediction" in ax.get_legend_handles_labels()[1]
            ax.plot(row["predicted"], i, "D", color="tab:green", ms=6, label=None if marked else "prediction")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [r["label"] for r in reversed(rows)], fontsize=8)
    base, treat = report.comparison
    planted = " (the planted control vs its reference)" if report.planted else ""
    ax.set(xlabel=f"{treat} vs {base}{planted} (%), 95% interval",
           title="Every comparison, with the A/A band")
    ax.title.set_fontsize(9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.65 / (0.45 * len(rows) + 0.7)),
                  ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(run_dir: Path, df: pd.DataFrame, per_slo: Sequence[dict], secondary: dict,
                labels: Sequence[str], report: Report) -> list[str]:
    """Write attainment.png, latency_cdf.png, paired_diffs.png and forest.png; return their names.

    ``report`` is the report with its noise_floor: the A/A per-cell sd is drawn on the paired
    differences and the A/A bands on the forest plot when the floor applies to this run.
    """
    nf = report.noise_floor or {}
    noise_sd = nf.get("sd_pct") if nf.get("applied") else None
    attainment_vs_load(run_dir / "attainment.png", per_slo, report.comparison)
    latency_cdfs(run_dir / "latency_cdf.png", df, labels)
    series = [(f"goodput:{item['slo'].name}", f"goodput {item['slo'].name} (% of baseline mean)",
               item["paired"])
              for item in per_slo]
    series += [(m, f"{m} per window (% of baseline mean)", p) for m, p in secondary.items()]
    paired_differences(run_dir / "paired_diffs.png", series, noise_sd)
    forest(run_dir / "forest.png", report)
    return ["forest.png", "attainment.png", "latency_cdf.png", "paired_diffs.png"]
