"""PNG plots of a run: attainment vs load, latency CDFs, per-window paired differences (Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

COLORS = ("tab:blue", "tab:orange")


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


def paired_differences(path: Path, series: Sequence[tuple[str, str, dict]], noise_sd: dict | None = None) -> None:
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


def write_plots(run_dir: Path, df: pd.DataFrame, per_slo: Sequence[dict], secondary: dict,
                labels: Sequence[str], noise_sd: dict | None = None) -> list[str]:
    """Write attainment.png, latency_cdf.png and paired_diffs.png; return their file names.

    ``noise_sd`` maps "goodput:<slo>" or a secondary metric name to the sd (%) of its A/A per-window
    differences, when known.
    """
    attainment_vs_load(run_dir / "attainment.png", per_slo, labels)
    latency_cdfs(run_dir / "latency_cdf.png", df, labels)
    series = [(f"goodput:{item['slo'].name}", f"goodput {item['slo'].name} (% of baseline mean)", item["paired"])
              for item in per_slo]
    series += [(m, f"{m} per window (% of baseline mean)", p) for m, p in secondary.items()]
    paired_differences(run_dir / "paired_diffs.png", series, noise_sd)
    return ["attainment.png", "latency_cdf.png", "paired_diffs.png"]
