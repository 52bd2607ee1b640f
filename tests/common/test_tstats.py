"""common.tstats against literal numbers (Student-t tables: t_{0.975, 1} = 12.7062, t_{0.975, 2} = 4.3027)."""

from __future__ import annotations

import numpy as np
import pytest

from common.tstats import mean_t_interval, t_interval, t_quantile


def test_quantiles_match_the_table() -> None:
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-12)
    assert np.allclose(t_quantile(0.975, np.array([1, 2])), [12.7062, 4.3027], atol=1e-4)


def test_interval_of_an_estimate() -> None:
    lo, hi = t_interval(1.0, 0.5, 2)
    assert (lo, hi) == pytest.approx((1.0 - 0.5 * 4.3027, 1.0 + 0.5 * 4.3027), abs=1e-4)
    lo90, hi90 = t_interval(1.0, 0.5, 2, confidence=0.90)  # t_{0.95, 2} = 2.9200
    assert hi90 - lo90 == pytest.approx(2 * 0.5 * 2.9200, abs=1e-4)


def test_interval_of_a_mean() -> None:
    mean, lo, hi = mean_t_interval([1.0, 2.0, 3.0])  # sd 1, se 1/sqrt(3): half-width 4.3027/sqrt(3)
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - 2.4841, 2.0 + 2.4841), abs=1e-4)


def test_a_mean_of_one_value_has_no_interval() -> None:
    with pytest.raises(ValueError, match="at least 2 values, got 1"):
        mean_t_interval([1.0])
