"""Every committed run under experiments/results/ re-analysed from its recorded inputs reproduces its
committed report: report.md byte for byte, report.json to the last digits that a newer numpy or scipy
may move (a different summation order changes a float by an ulp or two, never a figure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.jsonfile import read_json, stored
from experiments.analyze import main
from experiments.reporting import schema
from experiments.reporting.inputs import recorded_inputs
from experiments.reporting.reportdiff import differing_entries
from integration.proof import profiles
from kernels.environment import gpu_slug

pytestmark = pytest.mark.evidence  # re-derives committed files (make test-fast leaves it out)

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
RUNS = sorted({p.parent for p in RESULTS.glob("*/run.json*")})
# report.json holds no wall-clock field (no "created"): nothing in it may differ between analyses
NEW_IN_EACH_ANALYSIS: tuple[str, ...] = ()


def _differing_keys(a: dict, b: dict) -> list[str]:
    return [k for k in differing_entries(a, b) if k not in NEW_IN_EACH_ANALYSIS]


def test_the_comparison_tolerates_an_ulp_and_nothing_more() -> None:
    """The negative control: a change that a report would print is a difference."""
    doc = {"ci": [165.26186242087692, -1.0], "n": 12, "verdict": "faster"}
    assert _differing_keys(doc, {**doc, "ci": [165.26186242087695, -1.0]}) == []
    assert _differing_keys(doc, {**doc, "ci": [165.2619, -1.0]}) == ["ci"]
    assert _differing_keys(doc, {**doc, "n": 13, "verdict": "slower"}) == ["n", "verdict"]
    assert _differing_keys(doc, {**doc, "ci": [165.26186242087692]}) == ["ci"]


def test_there_are_committed_runs() -> None:
    assert len(RUNS) >= 5, RUNS
    for run_dir in RUNS:
        assert (run_dir / "requests.jsonl.xz").is_file(), run_dir
        assert stored(run_dir / "report.json").is_file(), run_dir


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_reanalysis_reproduces_the_committed_report(run_dir: Path, tmp_path: Path) -> None:
    committed = read_json(run_dir / "report.json", None, "report")
    assert "inputs" in committed, f"{run_dir}/report.json records no analysis inputs"
    assert main([str(run_dir), "--out", str(tmp_path)]) == 0
    fresh = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert _differing_keys(committed, fresh) == []
    assert (tmp_path / "report.md").read_bytes() == (run_dir / "report.md").read_bytes()


@pytest.mark.parametrize("run_dir", [r for r in RUNS if r.name.startswith("h200-")], ids=lambda p: p.name)
def test_the_gpu_comes_from_the_run_folder_and_the_profile_from_the_report(run_dir: Path) -> None:
    env = read_json(run_dir / "environment.json", None, "environment record")
    attribution = read_json(run_dir / "report.json", None, "report")["attribution"]
    assert attribution["gpu"] == gpu_slug(env["gpu"]) == "h200"
    inputs = recorded_inputs(run_dir)
    assert inputs.profile is not None and stored(inputs.profile).is_file()
    assert str(inputs.profile).endswith(attribution["profile"])


def test_todays_default_profile_does_not_change_a_reanalysis(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = RESULTS / "h200-llama8b-chat"
    monkeypatch.setattr(profiles, "default_profile", lambda gpu, mode: Path("integration/results/other.json"))
    assert main([str(run_dir), "--out", str(tmp_path / "recorded")]) == 0
    recorded = json.loads((tmp_path / "recorded" / "report.json").read_text(encoding="utf-8"))
    assert _differing_keys(recorded, read_json(run_dir / "report.json", None, "report")) == []
    # the default is what a run with nothing recorded gets: the control that the patch took effect
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("run.json", "requests.jsonl.xz", "environment.json"):
        kept = stored(run_dir / name)
        (bare / kept.name).write_bytes(kept.read_bytes())
    assert main([str(bare)]) == 0
    attribution = json.loads((bare / "report.json").read_text())["attribution"]
    assert attribution["profile"] == "integration/results/other.json"


def test_the_host_bound_guard_trips_on_the_1b_shape_and_not_on_the_8b_confirm3_run() -> None:
    """Every committed report has the guard; the 1B engine's served steps are mostly host time (said at
    the top of report.md), the 8B's on the H200 (confirm3) are not."""
    def guard(run_dir: Path) -> tuple[schema.Report, str]:
        return (schema.read_report(run_dir / "report.json"),
                (run_dir / "report.md").read_text(encoding="utf-8").splitlines()[2])
    one_b = []
    for run_dir in RUNS:
        r, top = guard(run_dir)
        assert r.gpu_share is not None and bool(r.gpu_share.rows) != bool(r.gpu_share.reason), run_dir
        assert top.startswith("**This run measures the host") == bool(r.gpu_share.below_bound()), run_dir
        if r.model["name"] == "llama-3.2-1b" and r.gpu_share.rows:
            one_b.append(run_dir.name)
            assert len(r.gpu_share.below_bound()) == len(r.gpu_share.rows), run_dir
    assert len(one_b) >= 5, one_b
    r, _ = guard(RESULTS / "h200-llama8b-confirm3")
    assert r.gpu_share.rows and not r.gpu_share.below_bound()
