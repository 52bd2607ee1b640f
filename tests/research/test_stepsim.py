"""The scheduler model against answers worked out by hand, and its overhead fit against a planted one."""

from __future__ import annotations

import numpy as np
import pytest

from research.stepsim import Request, StepTime, fit_overhead, median_gap, median_tpot, simulate


def flat(us: float, delay_at_decode: float = 0.0):
    """Every step `us`, plus `delay_at_decode` in steps of up to 8 tokens (decode steps here)."""
    return lambda tokens: us + (delay_at_decode if tokens <= 8 else 0.0)


def test_one_request_prefills_in_one_step_then_decodes_one_token_a_step() -> None:
    out = simulate([Request(100.0, 50, 5)], flat(10.0))
    np.testing.assert_allclose(out.token_us[0], [110.0, 120.0, 130.0, 140.0, 150.0])
    assert out.tpot_us([Request(100.0, 50, 5)])[0] == pytest.approx(10.0)


def test_a_long_prompt_is_chunked_by_the_budget() -> None:
    req = Request(0.0, 20_000, 2)  # 8192 + 8192 + 3616 tokens: the first token after the third step
    out = simulate([req], lambda tokens: tokens / 100.0, budget=8192)
    np.testing.assert_allclose(out.token_us[0], [(8192 + 8192 + 3616) / 100.0, 200.0 + 0.01])


def test_a_delay_in_decode_steps_lets_a_later_prefill_join_them() -> None:
    # A decodes 1 token per 10 us step from t=10 until t=100 (10 tokens); B arrives at 95 with a 1000-token
    # prompt, whose step lasts 100 us (a flat 10 us for small steps, 100 us above 8 tokens).
    reqs = [Request(0.0, 4, 10), Request(95.0, 1000, 1)]

    def step(tokens: int, delay: float = 0.0) -> float:
        return 100.0 if tokens > 8 else 10.0 + delay

    base = simulate(reqs, step)
    # A's steps end at 10, 20, ..., 100; B is due at 95, so the step starting at 100 would be its own:
    # A finished at 100 and never waits for B's prefill
    assert base.token_us[0][-1] == pytest.approx(100.0) and base.token_us[1][0] == pytest.approx(200.0)
    slow = simulate(reqs, lambda t: step(t, delay=1.0))
    # 11 us steps: A's tokens at 11, 22, ..., 99 (9 tokens), the last step starting at 88, before B is due;
    # B (due 95) joins the step from 99, so A's 10th token comes at 99 + 100 = 199
    np.testing.assert_allclose(slow.token_us[0][-3:], [88.0, 99.0, 199.0])
    tpot_change = slow.tpot_us(reqs)[0] / base.tpot_us(reqs)[0] - 1
    assert tpot_change == pytest.approx((199 - 11) / (100 - 10) - 1)  # far more than the 10% per step


def test_steps_take_every_running_decode_and_new_prefills_within_the_budget() -> None:
    sizes = []

    def step(tokens: int) -> float:
        sizes.append(tokens)
        return 10.0

    simulate([Request(0.0, 6, 3), Request(0.0, 6, 3), Request(15.0, 5, 2)], step, budget=12)
    # both prompts (12 tokens, first tokens at 10), their decodes (2; the third is due at 15), their last
    # decodes and the third prompt (2 + 5), the third's one decode (1)
    assert sizes == [12, 2, 7, 1]


def test_the_kv_cache_holds_back_a_request_until_one_finishes() -> None:
    reqs = [Request(0.0, 10, 3), Request(0.0, 10, 3)]
    out = simulate(reqs, flat(10.0), kv_tokens=15)  # 13 tokens each: one at a time
    assert out.token_us[1][0] == pytest.approx(out.token_us[0][-1] + 10.0)
    both = simulate(reqs, flat(10.0), kv_tokens=26)
    assert both.token_us[1][0] == pytest.approx(both.token_us[0][0])


def test_step_time_interpolates_and_extends_the_last_slope() -> None:
    st = StepTime(((1.0, 100.0), (11.0, 200.0)), overhead_us=5.0)
    assert st(0) == pytest.approx(105.0) and st(6) == pytest.approx(155.0) and st(21) == pytest.approx(305.0)


def test_the_overhead_fit_recovers_a_planted_overhead() -> None:  # positive control of the fit
    rng = np.random.default_rng(1)
    cells = {w: [Request(float(t), int(p), int(o)) for t, p, o in
                 zip(np.sort(rng.uniform(0, 2e6, 40)), rng.integers(50, 3000, 40), rng.integers(2, 60, 40))]
             for w in range(3)}
    points = ((1.0, 4000.0), (64.0, 5000.0), (2048.0, 50_000.0))
    kw = {"kv_tokens": 80_000}
    for metric in (median_gap, median_tpot):
        target = metric(cells, StepTime(points, 1234.0), kw)
        assert fit_overhead(cells, points, target, metric, **kw) == pytest.approx(1234.0, abs=5.0)
    # a target below what no overhead gives is met at zero, not below it
    assert fit_overhead(cells, points, 1.0, median_gap, **kw) == 0.0
