"""experiments.analyze run again on an analysed run: writes beside the report unless --in-place, reuses
the recorded inputs, and names the file it cannot read."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
from pathlib import Path

import pytest

from experiments.analyze import REANALYSIS, analyze_run, build_parser, main
from experiments.core.slo import DEFAULT_SLO_FILE, SLO
from experiments.reporting.inputs import recorded_inputs
from experiments.reporting.reportdiff import report_change
from tests.experiments.synthetic_run import write_run

CHAT = SLO("chat", 2000.0, 100.0)
TIGHT = SLO("tight", 150.0, 30.0)


def cell(arm: str, win: int, load: float, rng) -> list:
    misses = 4 + win % 3 - (2 if arm == "patched" else 0)
    return [(100.0 * load, 20.0, None)] * (40 - misses) + [(3000.0, 20.0, None)] * misses


@pytest.fixture
def analysed(tmp_path: Path) -> Path:
    """A run analysed as the orchestrator does after the replays: report files in the run folder."""
    run_dir = write_run(tmp_path / "run", cell, windows=3)
    analyze_run(run_dir, [TIGHT, CHAT], draw_plots=False)
    return run_dir


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_reanalysis_writes_beside_the_report_and_reproduces_it(analysed: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    before = _files(analysed)
    assert main([str(analysed), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert _files(analysed) == before  # nothing in the run folder was rewritten
    again = analysed / REANALYSIS
    assert (again / "report.json").read_bytes() == before["report.json"]
    assert (again / "report.md").read_bytes() == before["report.md"]
    assert not list(again.glob("*.png"))  # --no-plots: the report files only
    assert f"inputs as recorded in {analysed / 'report.json'}" in out
    assert f"report.json identical to {analysed / 'report.json'}" in out


def test_a_report_whose_floats_moved_by_an_ulp_has_the_same_figures(analysed: Path, tmp_path: Path) -> None:
    doc = json.loads((analysed / "report.json").read_text())
    before, moved = tmp_path / "before.json", tmp_path / "moved.json"
    moved.write_text(json.dumps({**doc, "ulp": 165.26186242087695}))
    before.write_text(json.dumps({**doc, "ulp": 165.26186242087692}))
    assert report_change(before, moved) == (f"has the same figures as {before} (some floats differ, by at "
                                            "most 2e-16 of themselves, within 1e-09: another numpy or scipy)")
    before.write_text(json.dumps({**doc, "ulp": 165.2619}))  # a figure the report would print differently
    assert report_change(before, moved) == f"differs from {before} in: ulp"
    assert report_change(moved, moved) == f"identical to {moved}"


def test_out_and_in_place(analysed: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before = _files(analysed)
    elsewhere = tmp_path / "elsewhere" / "deeper"
    assert main([str(analysed), "--out", str(elsewhere), "--slo", "chat:2000:100", "--no-plots"]) == 0
    assert _files(analysed) == before
    assert [s["name"] for s in json.loads((elsewhere / "report.json").read_text())["slos"]] == ["chat"]
    assert "differs from" in capsys.readouterr().out
    assert main([str(analysed), "--in-place", "--slo", "chat:2000:100", "--no-plots"]) == 0
    assert [s["name"] for s in json.loads((analysed / "report.json").read_text())["slos"]] == ["chat"]
    assert not (analysed / REANALYSIS).exists()
    with pytest.raises(SystemExit) as exc:
        main([str(analysed), "--in-place", "--out", str(elsewhere)])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_recorded_inputs_are_the_defaults_and_a_flag_replaces_one(analysed: Path) -> None:
    rec = json.loads((analysed / "report.json").read_text())["inputs"]
    assert rec == {"slos": [TIGHT.to_json(), CHAT.to_json()], "aa_report": None, "patched_policy": None,
                   "profile": None, "kernel_results": None}
    inputs = recorded_inputs(analysed)
    assert inputs.slos == (TIGHT, CHAT) and inputs.aa_report is None
    assert recorded_inputs(analysed.parent).slos == ()  # no report there: nothing recorded


def test_tiers_recorded_in_run_json_are_the_default(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", cell, windows=2)
    run = json.loads((run_dir / "run.json").read_text())
    run["config"] = {"slos": [TIGHT.to_json()]}  # the run was made with --slo tight:150:30
    (run_dir / "run.json").write_text(json.dumps(run))
    assert main([str(run_dir), "--no-plots"]) == 0  # no report yet: written into the run folder
    assert [s["name"] for s in json.loads((run_dir / "report.json").read_text())["slos"]] == ["tight"]


def test_slo_file_help_names_the_defaults_a_run_reaches() -> None:
    # every run.json records its tiers (read_run gives a version-1 file slos.toml's), so the analysis
    # never falls back to slos.toml itself: the help names the recorded tiers, then run.json's
    flag = next(a for a in build_parser()._actions if "--slo-file" in a.option_strings)
    assert "run.json" in flag.help and DEFAULT_SLO_FILE.name not in flag.help


@pytest.mark.parametrize("suffix, module", [(".xz", lzma), (".gz", gzip)])
def test_truncated_records_file_is_named(analysed: Path, capsys: pytest.CaptureFixture, suffix: str,
                                         module) -> None:
    plain = analysed / "requests.jsonl"
    packed = module.compress(plain.read_bytes())
    cut = analysed / f"requests.jsonl{suffix}"
    cut.write_bytes(packed[: len(packed) // 2])
    plain.unlink()
    assert main([str(analysed)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"python -m experiments.analyze: error: {cut}: truncated")
    assert "records after the damage are missing" in err


def test_corrupt_run_json_and_bad_records_line_are_named(analysed: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(analysed, broken)
    text = (broken / "run.json").read_text()
    (broken / "run.json").write_text(text[: len(text) // 2])
    assert main([str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{broken / 'run.json'}:" in err and "not valid JSON" in err
    (broken / "run.json").write_text(text)
    with (broken / "requests.jsonl").open("a") as f:
        f.write('{"index": 1}\n')
    assert main([str(broken), "--in-place"]) == 2
    err = capsys.readouterr().err
    lines = len((analysed / "requests.jsonl").read_text().splitlines())
    assert err.count("\n") == 1 and f"{broken}: " in err and "--accept-damaged" in err
    assert f"requests.jsonl:{lines + 1}: bad record: " in err  # a line that is not a record is damage
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no run.json" in capsys.readouterr().err


def test_out_that_is_a_file_is_refused(analysed: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "a-file"
    target.write_text("x")
    assert main([str(analysed), "--out", str(target)]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and target.read_text() == "x"
