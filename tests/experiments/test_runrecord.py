"""run.json records the policy the patched arm dispatches by (experiments.runner.runrecord.patched_policy)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from experiments.runner.runrecord import patched_policy
from integration import arms, choice
from integration.launcher import MODELS_DIR


@pytest.fixture(autouse=True)
def h200_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The patched arm's tables are the H200's (this machine has no GPU)."""
    monkeypatch.setenv(choice.GPU_ENV, "h200")
    choice.policy.cache_clear()
    yield
    choice.policy.cache_clear()


def _cfg(**kw) -> SimpleNamespace:
    base = dict(device="cuda", arms=("stock", "patched"), model_dir=MODELS_DIR / "llama-3.1-8b",
                dtype="bfloat16", eager=False)
    cfg = {**base, **kw}
    return SimpleNamespace(**cfg, arm_definitions=tuple(arms.get(a) for a in cfg["arms"]))


def test_cuda_ab_run_records_the_table_and_its_row_ranges() -> None:
    rec = patched_policy(_cfg())
    assert rec["mode"] == "compiled" and (rec["dtype"], rec["hidden"]) == ("bf16", 4096)
    assert str(choice.policy("compiled").source).endswith("kernels/results/policy-h200-in-graph.json")
    assert rec["table"] == "kernels/results/policy-h200-in-graph.json"  # relative to the project
    for op in choice.OPS:
        segs = rec["segments"][op]
        assert segs[0][0] == 1 and segs[-1][1] == 16384
        assert all(a[1] + 1 == b[0] for a, b in zip(segs, segs[1:]))  # contiguous, no gaps
        assert [tuple(s) for s in segs] == choice.segments(op, "bf16", 4096, 16384, "compiled")
    assert patched_policy(_cfg(eager=True))["mode"] == "eager"


def test_cpu_and_aa_runs_record_no_policy() -> None:
    assert patched_policy(_cfg(device="cpu")) is None
    assert patched_policy(_cfg(arms=("stock", "stock"))) is None
