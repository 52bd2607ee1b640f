"""run.json records the policy the patched arm dispatches by (experiments.runner.runrecord.patched_policy);
every run gets a folder of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.runner import runrecord
from experiments.runner.config import make_config
from experiments.runner.runrecord import patched_policy
from integration import arms, choice, names
from integration.launcher import MODELS_DIR

REPO = Path(__file__).resolve().parents[2]


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
    assert str(choice.policy("compiled").source).endswith("runtime_tables/policy-h200-in-graph.json")
    assert rec["table"] == "runtime_tables/policy-h200-in-graph.json"  # relative to the project
    for op in names.IR_OPS:
        segs = rec["segments"][op]
        assert segs[0][0] == 1 and segs[-1][1] == 16384
        assert all(a[1] + 1 == b[0] for a, b in zip(segs, segs[1:]))  # contiguous, no gaps
        assert [tuple(s) for s in segs] == choice.segments(op, "bf16", 4096, 16384, "compiled")
    assert patched_policy(_cfg(eager=True))["mode"] == "eager"


def test_cpu_and_aa_runs_record_no_policy() -> None:
    assert patched_policy(_cfg(device="cpu")) is None
    assert patched_policy(_cfg(arms=("stock", "stock"))) is None


def test_runs_started_without_a_name_in_the_same_second_get_folders_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(REPO / "traces" / "chat.jsonl", "cpu", results_dir=tmp_path / "results")
    monkeypatch.setattr(runrecord.time, "strftime", lambda fmt: "20261202-153012")  # one second for all
    made = [runrecord.make_run_dir(cfg) for _ in range(3)]
    assert [p.name for p in made] == ["20261202-153012-cpu-tiny-llama", "20261202-153012-cpu-tiny-llama-2",
                                      "20261202-153012-cpu-tiny-llama-3"]
    assert all(p.is_dir() and p.parent == tmp_path / "results" for p in made)
