"""The share of a served decode step that is GPU time: the host-bound guard of a GPU run.

A served step is a gap between two successive tokens of one reply (`itl_ms`); the batch the engine ran
then is the number of the replay's requests in decode at the gap's midpoint (first token before it,
last token at or after it). Its GPU time is the calibration's CUDA-graph decode step of the stock
engine at that batch (a graph-steps file's "sizes", linear in the batch between the timed sizes). A
step's GPU share is that time over the gap. Left out: gaps of replies that failed or came in fewer
chunks than tokens, a gap of 0 and the gap before it (chunks of one network read: the read's time,
not the steps'), a gap in which another request's first token came (a prefill ran in that step: GPU
work the decode graph does not time) and a batch above the largest timed size. Per arm and load the
share is the median over steps, each step counted once (a reply's gap weighted by 1 / batch, as the
batch's replies all saw that step). The graph was timed at contexts of a few dozen tokens, so at
large batches of long contexts the GPU step is longer than the graph's and the share a lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

GPU_BOUND = 0.75  # a share below this: more than about a quarter of a served step is host time
REPLAY = ["arm", "window", "load"]  # one replay of one arm's server: its records share one clock
STEP_COLUMNS = ["arm", "load", "batch", "gap_ms", "prefill"]


@dataclass(frozen=True)
class StepCurve:
    """The CUDA-graph decode step time (us) of the stock engine at each batch size a calibration timed."""

    batch: tuple[float, ...]
    step_us: tuple[float, ...]

    def at(self, batch: np.ndarray) -> np.ndarray:
        """The step time (us) at each batch, linear between timed sizes; NaN outside them."""
        b = np.asarray(batch, dtype=float)
        out = np.interp(b, self.batch, self.step_us)
        return np.where((b < self.batch[0]) | (b > self.batch[-1]), np.nan, out)


def step_curve(doc: Mapping) -> StepCurve | None:
    """The stock engine's graph step per decode size of a graph-steps document
    (integration.proof.graphtime: "sizes" rows with batch_tokens and baseline_median_us); None
    without such rows."""
    pts = sorted((float(r["batch_tokens"]), float(r["baseline_median_us"])) for r in doc.get("sizes") or []
                 if r.get("baseline_median_us") is not None)
    if not pts:
        return None
    return StepCurve(tuple(b for b, _ in pts), tuple(us for _, us in pts))


def _replay_steps(replay: pd.DataFrame, shown: pd.Series) -> pd.DataFrame:
    """batch, gap_ms and prefill per kept gap of the replies `shown` of one replay (every request in
    decode counts in the batch)."""
    decoding = replay.dropna(subset=["first_token_ms", "last_token_ms"])
    firsts = np.sort(decoding["first_token_ms"].to_numpy(float))
    lasts = np.sort(decoding["last_token_ms"].to_numpy(float))
    parts = []
    for first, itl in zip(replay.loc[shown, "first_token_ms"], replay.loc[shown, "itl_ms"]):
        gaps = np.asarray(itl, dtype=float)
        token = first + np.cumsum(gaps)
        read_at_once = gaps == 0
        keep = ~read_at_once & ~np.append(read_at_once[1:], False)
        gaps, token = gaps[keep], token[keep]
        mid = token - gaps / 2
        in_decode = np.searchsorted(firsts, mid, "left") - np.searchsorted(lasts, mid, "left")
        started = np.searchsorted(firsts, token + gaps / 2, "right") - np.searchsorted(firsts, mid, "right")
        parts.append(pd.DataFrame({
            "batch": np.maximum(in_decode, 1),  # the reply itself, where its gaps' rounding passed its end
            "gap_ms": gaps, "prefill": started > 0}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=STEP_COLUMNS[2:])


def served_steps(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per kept token gap: arm, load, batch (requests of the replay in decode at the gap's
    midpoint), gap_ms and prefill (another request's first token came within half a gap of this
    token: a prefill ran in that step). `measured`: goodput.records_frame rows of measured replays."""
    parts = []
    for (arm, _, load), replay in measured.groupby(REPLAY, sort=True):
        shown = replay["ok"] & ~replay["batched"] & (replay["itl_ms"].map(len) > 0)
        if shown.any():
            parts.append(_replay_steps(replay, shown).assign(arm=arm, load=load))
    if not parts:
        return pd.DataFrame(columns=STEP_COLUMNS)
    return pd.concat(parts, ignore_index=True)[STEP_COLUMNS]


def _median(values: np.ndarray, weights: np.ndarray) -> float:
    return float(np.quantile(values, 0.5, weights=weights, method="inverted_cdf"))


def shares(steps: pd.DataFrame, curve: StepCurve) -> list[dict]:
    """Per (arm, load) of `steps` (served_steps): the token gaps compared and those left out (prefill:
    a prefill ran in the step; above_timed: a batch above the largest timed size), then over the
    compared steps, each counted once: the median batch, the median served step, the graph step at
    that batch and the GPU share (the median of graph step / served step; None without a step)."""
    rows = []
    for (arm, load), g in steps.groupby(["arm", "load"], sort=True):
        batch, gap = g["batch"].to_numpy(float), g["gap_ms"].to_numpy(float)
        prefill = g["prefill"].to_numpy(bool)
        gpu_ms = curve.at(batch) / 1e3
        timed = np.isfinite(gpu_ms)
        used = timed & ~prefill
        row = {"arm": str(arm), "load": float(load), "gaps": int(used.sum()), "prefill": int(prefill.sum()),
               "above_timed": int((~timed & ~prefill).sum()), "batch_p50": None, "served_step_ms": None,
               "gpu_step_ms": None, "gpu_share": None}
        if used.any():
            w = 1 / batch[used]  # each step once: all `batch` replies saw it
            row["batch_p50"] = _median(batch[used], w)
            row.update(served_step_ms=_median(gap[used], w),
                       gpu_step_ms=float(curve.at(np.array([row["batch_p50"]]))[0] / 1e3),
                       gpu_share=_median(gpu_ms[used] / gap[used], w))
        rows.append(row)
    return rows
