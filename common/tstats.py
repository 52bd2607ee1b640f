"""The kit's Student-t figures, below every room so that experiments/ and integration.proof share them:
the quantile, the interval of an estimate and the interval of a mean. Pure functions, no I/O."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy import stats as sps


def t_quantile(p, dof):
    """The p-quantile of Student's t on `dof` degrees of freedom (numbers or numpy arrays alike)."""
    return sps.t.ppf(p, dof)


def t_interval(estimate, se, dof: float, confidence: float = 0.95):
    """estimate -+ t_{(1+confidence)/2, dof} * se: the Student-t interval of an estimate with standard
    error `se` on `dof` degrees of freedom (numbers or numpy arrays alike)."""
    q = float(t_quantile(0.5 + confidence / 2, dof))
    return estimate - q * se, estimate + q * se


def mean_t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The mean of `values` (at least two) and its t interval: (mean, lo, hi)."""
    if len(values) < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {len(values)}")
    mean = statistics.fmean(values)
    half = float(t_quantile(0.5 + confidence / 2, len(values) - 1)) * statistics.stdev(values) \
        / math.sqrt(len(values))  # this order of operations: the committed graph-steps files re-derive
    return mean, mean - half, mean + half
