import math

import numpy as np
import pytest

from experiments.stats import intervals as stats


def test_percentile_literal_values():
    data = [4, 6, 9, 7, 5, 8, 3, 0, 1, 2]
    assert stats.percentile(data, 0.25) == 2.25
    assert stats.percentile(data, 0.5) == 4.5
    assert stats.percentile(data, 0.75) == 6.75
    assert stats.percentile(data, 1.0) == 9.0
    assert stats.percentile([3.0], 0.9) == 3.0


def test_percentile_inverted_cdf_accepts_inf():
    # 10 values, 2 infinite: the 0.8 quantile is the 8th smallest, the 0.9 quantile is infinite
    data = [1, 2, 3, 4, 5, 6, 7, 8, math.inf, math.inf]
    assert stats.percentile(data, 0.8, method="inverted_cdf") == 8
    assert stats.percentile(data, 0.9, method="inverted_cdf") == math.inf


@pytest.mark.parametrize("bad, msg", [([], "empty"), ([1.0, math.nan], "NaN")])
def test_percentile_rejects_bad_input(bad, msg):
    with pytest.raises(ValueError, match=msg):
        stats.percentile(bad, 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.percentile([1.0], 50)


def test_summary_literal():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0])
    assert (s.n, s.mean, s.median, s.min, s.max) == (4, 2.5, 2.5, 1.0, 4.0)
    assert s.sd == pytest.approx(1.2909944487358056)
    assert stats.summarize([5.0]).to_json()["sd"] is None


def test_paired_differences_lists_unpaired():
    diffs, unpaired = stats.paired_differences({1: 10.0, 2: 20.0, 3: 5.0}, {1: 11.0, 2: 19.0, 4: 7.0})
    assert diffs == {1: 1.0, 2: -1.0}
    assert unpaired == [3, 4]


def test_t_ci_literal():
    # mean 2, n 4: half width t(0.975, 3) * sd / sqrt(4)
    # sd = sqrt(2/3); half width = 3.182446305 * 0.816496581 / 2 = 1.299228264
    assert stats.t_ci([1.0, 3.0, 2.0, 2.0]) == pytest.approx((0.700771736, 3.299228264))
    with pytest.raises(ValueError, match="no spread"):  # a zero-width interval would read as significant
        stats.t_ci([2.0, 2.0, 2.0])


def test_mde_and_windows_needed_literals():
    # (t_{0.975,5} + t_{0.8,5}) / sqrt(6) = (2.570581836 + 0.919543831) / 2.449489743
    assert stats.mde(1.0, 6) == pytest.approx(1.4248378, rel=1e-6)
    assert stats.mde(2.0, 6) == pytest.approx(2 * 1.4248378, rel=1e-6)
    # (1.959964 * 1.0 / 0.5)^2 = 15.37 -> 16 windows for +-0.5 with sd 1
    assert stats.windows_needed(1.0, 0.5) == 16
    # pyperf's form: 4 Z^2 sd^2 / W^2 with full width W = 1.0 gives the same
    assert stats.windows_needed(1.0, 0.5) == math.ceil(4 * 1.959964**2 * 1.0 / 1.0**2)
    with pytest.raises(ValueError, match="n >= 2"):
        stats.mde(1.0, 1)


def test_planted_five_percent_difference_is_found():
    rng = np.random.default_rng(7)
    base = rng.normal(100.0, 5.0, size=12)  # goodput per window, req/s
    noise = rng.normal(0.0, 1.0, size=12)
    treat = base + 0.05 * base.mean() + (noise - noise.mean())  # exactly +5% of the mean, plus noise
    diffs = 100.0 * (treat - base) / base.mean()
    c = stats.compare_paired(diffs, seed=1)
    assert c.mean == pytest.approx(5.0)
    assert c.significant is True
    assert c.t_ci95[0] > 0 and c.bootstrap_ci95[0] > 0
    assert c.t_ci95[0] < 5.0 < c.t_ci95[1]


def test_aa_set_is_not_called_significant():
    rng = np.random.default_rng(3)
    base = rng.normal(100.0, 5.0, size=12)
    same = base + rng.normal(0.0, 1.0, size=12)  # A/A: only noise
    c = stats.compare_paired(100.0 * (same - base) / base.mean(), seed=1)
    assert c.significant is False
    assert c.t_ci95[0] < 0 < c.t_ci95[1]
    assert c.mde > 0


def test_errors_are_never_verdicts():
    assert stats.compare_paired([]).significant is None
    one = stats.compare_paired([3.0])
    assert one.significant is None and "one paired window" in one.reason
    bad = stats.compare_paired([1.0, math.nan, 2.0])
    assert bad.significant is None and "non-finite" in bad.reason
    with pytest.raises(ValueError):
        stats.is_significant((math.nan, 1.0))
    with pytest.raises(ValueError):
        stats.is_significant((2.0, 1.0))


def test_bootstrap_is_seeded():
    d = [0.5, -0.2, 1.1, 0.3, 0.9, -0.4]
    assert stats.bootstrap_ci(d, seed=5) == stats.bootstrap_ci(d, seed=5)


def test_the_same_difference_in_every_window_is_no_interval_and_no_verdict():
    c = stats.compare_paired([1.5, 1.5, 1.5, 1.5])
    assert c.t_ci95 is None and c.significant is None and c.mde is None and c.sd == 0.0
    assert "no spread" in c.reason


def test_windows_needed_comes_with_the_range_of_its_sds_uncertainty():
    lo, hi = stats.sd_interval(1.0, 7)
    # chi-square quantiles with 6 dof: 14.449 (0.975) and 1.2373 (0.025)
    assert (lo, hi) == pytest.approx((math.sqrt(6 / 14.44938), math.sqrt(6 / 1.237344)), rel=1e-5)
    r = stats.windows_needed_range(1.0, 7, 0.5)
    assert r["windows"] == 16 and r["range"] == [stats.windows_needed(lo, 0.5), stats.windows_needed(hi, 0.5)]
    assert r["range"][0] < 16 < r["range"][1]
