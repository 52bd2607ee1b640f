"""experiments.stats.duet: the crossover schedule and the GPU-covariate statistics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.stats import duet


def test_every_block_is_a_latin_square_and_the_whole_run_is_balanced() -> None:
    sched = duet.placements(["stock", "patched"], [0, 1], windows=8, seed=3)
    for block in range(0, 8, 2):
        pair = sched[block:block + 2]
        assert {p.gpu_of("stock") for p in pair} == {0, 1}  # each arm once on each GPU
        assert all(p.gpu_of("stock") != p.gpu_of("patched") for p in pair)
    assert duet.balance(sched) == {"stock": {0: 4, 1: 4}, "patched": {0: 4, 1: 4}}
    three = duet.placements(["a", "b", "c"], [4, 5, 6], windows=6, seed=1)
    assert duet.balance(three) == {arm: {4: 2, 5: 2, 6: 2} for arm in "abc"}


def test_arms_swap_gpus_and_the_schedule_follows_the_seed() -> None:
    runs = {seed: [p.gpus for p in duet.placements(["s", "p"], [0, 1], 16, seed)] for seed in range(6)}
    assert runs[2] == [p.gpus for p in duet.placements(["s", "p"], [0, 1], 16, 2)]  # same seed, same schedule
    assert len({tuple(r) for r in runs.values()}) > 1  # seeds give different orders
    assert all(len(set(r)) == 2 for r in runs.values())  # both placements occur: the arms swap


def test_schedule_round_trips_through_its_record() -> None:
    sched = duet.placements(["stock", "patched"], [0, 1], 5, seed=9)
    rec = duet.schedule_record(sched, 9)
    assert duet.from_record(rec) == sched and rec["seed"] == 9
    assert sum(rec["balance"]["stock"].values()) == 5


@pytest.mark.parametrize(("arms", "gpus", "message"), [
    (["stock"], [0], "two or more distinct arms"), (["a", "a"], [0, 1], "two or more distinct arms"),
    (["a", "b"], [0], "one distinct GPU per arm"), (["a", "b"], [1, 1], "one distinct GPU per arm"),
])
def test_bad_layouts_are_refused(arms: list[str], gpus: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        duet.placements(arms, gpus, 4, seed=0)


def _duet_frame(effect: float, gpu_bias: float, sched: list[duet.Placement], seed: int,
                n: int = 60, noise: float = 0.01) -> pd.DataFrame:
    """Synthetic measured records: per-request base latencies shared by both arms (the same
    requests), times exp(effect) for the patched arm and exp(gpu_bias) on GPU 1."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in sched:
        base = rng.lognormal(np.log(10.0), 0.3, size=n)
        for arm in p.arms:
            scale = np.exp((effect if arm == "patched" else 0.0) + (gpu_bias if p.gpu_of(arm) == 1 else 0.0))
            lat = base * scale * np.exp(rng.normal(0.0, noise, size=n))
            for i in range(n):
                rows.append({"arm": arm, "window": p.window, "load": 1.0, "index": i, "due_ms": 10.0 * i,
                             "input_tokens": 100, "output_tokens": 20, "ok": True,
                             "tpot_ms": lat[i], "ttft_ms": 5 * lat[i], "e2e_ms": 25 * lat[i]})
    return pd.DataFrame(rows)


def test_the_arm_effect_is_found_with_the_gpu_bias_removed() -> None:
    sched = duet.placements(["stock", "patched"], [0, 1], windows=8, seed=0)
    df = _duet_frame(effect=np.log(1.01), gpu_bias=np.log(1.03), sched=sched, seed=1)
    tpot = duet.compare(df, "stock", "patched", sched, [1.0])["tpot_ms"]
    assert tpot["covariate"] == "gpu"
    lo, hi = tpot["ci95_pct"]
    assert lo < 1.0 < hi and lo > 0.0  # the planted +1% is inside the interval, and detected
    assert tpot["estimate_pct"] == pytest.approx(1.0, abs=0.3)
    blo, bhi = tpot["gpu_bias_ci95_pct"]
    assert blo < 3.0 < bhi and tpot["gpu_bias_pct"] == pytest.approx(3.0, abs=0.5)


def test_without_the_crossover_the_gpu_bias_would_pass_for_an_effect() -> None:
    # negative control of the design: an A/A duet that never swaps shows the GPU's bias as a "change"
    fixed = [duet.Placement(w, ("stock", "patched"), (0, 1)) for w in range(8)]
    df = _duet_frame(effect=0.0, gpu_bias=np.log(1.03), sched=fixed, seed=2)
    tpot = duet.compare(df, "stock", "patched", fixed, [1.0])["tpot_ms"]
    assert tpot["gpu_bias_pct"] is None and "GPU placement" in tpot["gpu_bias_reason"]
    assert tpot["ci95_pct"][0] > 2.0  # confounded: 3% "effect" that is the GPU
    crossed = duet.placements(["stock", "patched"], [0, 1], windows=8, seed=0)
    aa = duet.compare(_duet_frame(0.0, np.log(1.03), crossed, seed=2), "stock", "patched", crossed, [1.0])
    lo, hi = aa["tpot_ms"]["ci95_pct"]
    assert lo < 0.0 < hi  # with the crossover the A/A interval covers zero
