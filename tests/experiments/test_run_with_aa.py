"""`run.py --with-aa`: the A/B and its A/A twin on three shared server starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from experiments.config import ConfigError, make_config
from experiments.with_aa import aa_config, run_with_aa
from loadgen.records import read_records

TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def test_aa_twin_differs_only_in_arms_and_name(tmp_path: Path) -> None:
    ab = make_config(TRACE, "cpu", name="x", results_dir=tmp_path)
    aa = aa_config(ab)
    assert aa.arms == ("stock", "stock") and aa.name == "x-aa" and aa.labels == ("stock-a", "stock-b")
    assert dataclasses.replace(aa, arms=ab.arms, name=ab.name) == ab


@pytest.mark.parametrize("overrides, message", [
    ({"arms": ("stock", "stock")}, "--with-aa needs --arms stock,patched"),
    ({"one_at_a_time": True}, "no --one-at-a-time"),
])
def test_with_aa_refuses_what_it_cannot_pair(tmp_path: Path, overrides: dict, message: str) -> None:
    cfg = make_config(TRACE, "cpu", name="x", results_dir=tmp_path, **overrides)
    with pytest.raises(ConfigError, match=message):
        run_with_aa(cfg)
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_with_aa_refuses_an_existing_run_before_starting_servers(tmp_path: Path) -> None:
    (tmp_path / "x-aa").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        run_with_aa(make_config(TRACE, "cpu", name="x", results_dir=tmp_path))
    assert not (tmp_path / "x-servers").exists()


@pytest.mark.server
def test_with_aa_runs_both_experiments_on_shared_servers(tmp_path: Path) -> None:
    cfg = make_config(TRACE, "cpu", name="w", results_dir=tmp_path, windows=2, window_s=5.0, loads=(2.0,),
                      warmup_s=2.0, progress=False)
    ab_dir, aa_dir = run_with_aa(cfg)
    assert (ab_dir, aa_dir) == (tmp_path / "w", tmp_path / "w-aa")
    logs = sorted(p.name for p in (tmp_path / "w-servers").iterdir())
    assert logs == ["server-patched.log", "server-stock-b.log", "server-stock.log"]
    requests = {}
    for run_dir, labels in ((ab_dir, {"stock", "patched"}), (aa_dir, {"stock-a", "stock-b"})):
        run = (run_dir / "run.json").read_text()
        assert '"status": "complete"' in run
        recs = [r for r in read_records(run_dir / "requests.jsonl.gz") if r.tags["phase"] == "measure"]
        assert {r.tags["arm"] for r in recs} == labels
        per_arm = {label: sorted((r.tags["window"], r.index, r.input_tokens, r.output_tokens)
                                 for r in recs if r.tags["arm"] == label) for label in labels}
        first, second = per_arm.values()
        assert first == second  # identical requests for both arms
        requests[run_dir.name] = first
        assert (run_dir / "report.md").is_file()
    assert requests["w"] == requests["w-aa"]  # the A/A twin replays the same windows
    # on CPU the patched arm falls back to stock, so the A/B run is itself an A/A run and is its own
    # noise floor; on a GPU the A/B report names the twin's report.json instead
    assert "A/A noise floor (this run (A/A))" in (ab_dir / "report.md").read_text()
    assert "A/A noise floor (this run (A/A))" in (aa_dir / "report.md").read_text()
