"""Statistics for paired A/B windows: percentiles, summaries, intervals, power. Pure, no I/O.

Every function takes plain sequences of floats and returns plain numbers or frozen dataclasses.
A comparison that cannot be computed (too few windows, non-finite values) says so with a reason;
it never turns an error into a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from common.tstats import t_interval, t_quantile

ALPHA = 0.05
POWER = 0.8


def percentile(values: Sequence[float], p: float, method: str = "linear") -> float:
    """The p-quantile (0 <= p <= 1) of ``values``; linear interpolation between order statistics.

    ``method`` is numpy's quantile method; "inverted_cdf" gives the smallest value with at least a
    fraction p of the data at or below it (no interpolation, so +inf values are allowed).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"percentile p must be in [0, 1], got {p}")
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("percentile of an empty sequence")
    if np.isnan(arr).any():
        raise ValueError("percentile of a sequence containing NaN")
    return float(np.quantile(arr, p, method=method))


@dataclass(frozen=True)
class Summary:
    """Location and spread of a sample."""

    n: int
    mean: float
    sd: float  # sample standard deviation (ddof=1); nan for n < 2
    median: float
    p90: float
    p99: float
    min: float
    max: float

    def to_json(self) -> dict:
        """Dict with NaN written as None (JSON has no NaN)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in self.__dict__.items()}


def summarize(values: Sequence[float]) -> Summary:
    """Summary of a non-empty sample of finite values."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("summary of an empty sequence")
    if not np.isfinite(arr).all():
        raise ValueError("summary of a sequence with non-finite values")
    sd = float(arr.std(ddof=1)) if arr.size > 1 else math.nan
    return Summary(
        n=int(arr.size), mean=float(arr.mean()), sd=sd, median=percentile(arr, 0.5),
        p90=percentile(arr, 0.9), p99=percentile(arr, 0.99), min=float(arr.min()), max=float(arr.max()),
    )


def paired_differences(
    baseline: Mapping[Hashable, float], treatment: Mapping[Hashable, float]
) -> tuple[dict[Hashable, float], list[Hashable]]:
    """treatment - baseline for every key in both; also the keys found in only one (unpaired)."""
    both = [k for k in baseline if k in treatment]
    diffs = {k: float(treatment[k]) - float(baseline[k]) for k in both}
    unpaired = [k for k in baseline if k not in treatment] + [k for k in treatment if k not in baseline]
    return diffs, unpaired


def _checked(diffs: Sequence[float], need: int = 2) -> np.ndarray:
    arr = np.asarray(diffs, dtype=float)
    if arr.size < need:
        raise ValueError(f"need at least {need} paired differences, got {arr.size}")
    if not np.isfinite(arr).all():
        raise ValueError("paired differences contain non-finite values")
    return arr


def t_ci(diffs: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval for the mean of paired differences; ValueError when they are all the same (no
    spread gives no interval: a zero-width one would read as significant)."""
    arr = _checked(diffs)
    mean, sem = float(arr.mean()), float(sps.sem(arr))
    if sem == 0.0:
        raise ValueError(f"all {arr.size} differences are {mean:g}: no spread, no interval")
    lo, hi = t_interval(mean, sem, arr.size - 1, confidence)
    return float(lo), float(hi)


def block_weights(blocks: np.ndarray, *, seed: int, n_resamples: int) -> np.ndarray:
    """(n_resamples, cells): how many times each cell counts in each resample of a block bootstrap that
    draws whole blocks (windows) with replacement (numpy default_rng(seed)). The kit's one bootstrap
    draw; the estimator is refitted under each row of weights."""
    ids, inverse = np.unique(np.asarray(blocks), return_inverse=True)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, ids.size, size=(n_resamples, ids.size))
    counts = np.zeros((n_resamples, ids.size))
    np.add.at(counts, (np.arange(n_resamples)[:, None], draws), 1.0)
    return counts[:, inverse]


def percentile_interval(estimates: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap estimates."""
    a = (1.0 - confidence) / 2
    lo, hi = np.quantile(estimates, [a, 1.0 - a])
    return float(lo), float(hi)


def bootstrap_ci(
    diffs: Sequence[float], confidence: float = 0.95, seed: int = 0, n_resamples: int = 9999
) -> tuple[float, float]:
    """Percentile-bootstrap interval for the mean of paired differences (numpy default_rng(seed))."""
    arr = _checked(diffs)
    if np.ptp(arr) == 0.0:
        return float(arr[0]), float(arr[0])
    res = sps.bootstrap(
        (arr,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
        method="percentile", rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def is_significant(ci: tuple[float, float]) -> bool:
    """True when the interval excludes 0; a non-finite or inverted interval raises, never a verdict."""
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"not a valid interval: {ci}")
    return lo > 0.0 or hi < 0.0


def mde_se(se: float, dof: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable effect of a two-sided t test on an estimate with standard error `se` and
    `dof` degrees of freedom: (t_{1-alpha/2, dof} + t_{power, dof}) * se. The kit's one MDE."""
    return float((t_quantile(1 - alpha / 2, dof) + t_quantile(power, dof)) * se)


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable mean difference of a two-sided paired t-test over n pairs with this sd:
    mde_se(sd / sqrt(n), n - 1)."""
    if n < 2:
        raise ValueError(f"minimum detectable effect needs n >= 2 pairs, got {n}")
    if not math.isfinite(sd) or sd < 0:
        raise ValueError(f"sd must be finite and >= 0, got {sd}")
    return mde_se(sd / math.sqrt(n), n - 1, alpha, power)


def windows_needed(sd: float, half_width: float, confidence: float = 0.95) -> int:
    """Paired windows for a +-half_width interval on the mean: ceil(Z^2 sd^2 / half_width^2).

    This is pyperf's 4*Z^2*sd^2/W^2 with W the full width (2 * half_width).
    """
    if half_width <= 0 or not math.isfinite(half_width):
        raise ValueError(f"half_width must be positive and finite, got {half_width}")
    if not math.isfinite(sd) or sd < 0:
        raise ValueError(f"sd must be finite and >= 0, got {sd}")
    z = float(sps.norm.ppf(1 - (1 - confidence) / 2))
    return max(2, math.ceil(z * z * sd * sd / (half_width * half_width)))


def sd_interval(sd: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Chi-square interval of a normal sample's sd from n values: sd * sqrt((n-1) / chi2_{q, n-1})."""
    if n < 2:
        raise ValueError(f"an sd interval needs n >= 2, got {n}")
    df, a = n - 1, (1 - confidence) / 2
    return (float(sd * math.sqrt(df / sps.chi2.ppf(1 - a, df))),
            float(sd * math.sqrt(df / sps.chi2.ppf(a, df))))


def windows_needed_range(sd: float, n: int, half_width: float, confidence: float = 0.95) -> dict:
    """windows_needed at the sd measured over n windows and at both ends of that sd's 95% interval.

    An sd from few windows is itself uncertain (7 windows: 0.64x to 2.2x); the range says so.
    """
    lo, hi = sd_interval(sd, n, confidence)
    return {"windows": windows_needed(sd, half_width, confidence),
            "range": [windows_needed(lo, half_width, confidence), windows_needed(hi, half_width, confidence)],
            "sd_ci95": [lo, hi], "sd_from_n": n}


@dataclass(frozen=True)
class Comparison:
    """Paired comparison of n window differences; fields None with ``reason`` when not computable."""

    n: int
    mean: float | None
    median: float | None
    sd: float | None
    t_ci95: tuple[float, float] | None
    bootstrap_ci95: tuple[float, float] | None
    mde: float | None
    significant: bool | None
    reason: str | None  # why a field is None

    def to_json(self) -> dict:
        """JSON-ready dict; intervals as [lo, hi]."""
        d = dict(self.__dict__)
        for key in ("t_ci95", "bootstrap_ci95"):
            d[key] = list(d[key]) if d[key] is not None else None
        return d


def compare_paired(diffs: Sequence[float], seed: int = 0) -> Comparison:
    """Mean, t and bootstrap 95% intervals, MDE and verdict (t interval excludes 0) of paired differences.

    The t interval is the primary one; the percentile bootstrap over few windows is narrower than t
    (it ignores the uncertainty of the sd) and is kept as a check. The same difference in every
    window (sd 0) gives no interval, MDE or verdict: a zero-width interval would call any constant
    difference significant.
    """
    arr = np.asarray(diffs, dtype=float)
    n = int(arr.size)
    if n == 0:
        return Comparison(0, None, None, None, None, None, None, None, "no paired windows")
    if not np.isfinite(arr).all():
        return Comparison(n, None, None, None, None, None, None, None, "non-finite paired differences")
    mean, median = float(arr.mean()), float(np.median(arr))
    if n < 2:
        return Comparison(n, mean, median, None, None, None, None, None,
                          "one paired window: no interval or verdict")
    sd = float(arr.std(ddof=1))
    if sd == 0.0:
        return Comparison(n, mean, median, 0.0, None, None, None, None,
                          f"the same difference in all {n} paired windows: no spread, no interval or verdict")
    ci = t_ci(arr)
    return Comparison(n, mean, median, sd, ci, bootstrap_ci(arr, seed=seed), mde(sd, n),
                      is_significant(ci), None)
