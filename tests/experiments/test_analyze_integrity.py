"""Damaged records are refused, or analysed only when told and then titled damaged."""

import gzip
import json
import subprocess
import sys

import pytest

from experiments.analyze import analyze_run, main
from experiments.core.rundir import DamagedRecords
from experiments.core.slo import SLO
from tests.experiments.synthetic_run import write_run
from tests.mounts import make_read_only, tmpfs

CHAT = SLO("chat", 2000.0, 100.0)
NO_TORCH = """import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is not installed here")
sys.meta_path.insert(0, NoTorch())
"""


def cell(arm, win, load, rng):
    m = 4 if arm == "stock" else 2
    return [(100.0, 20.0, None)] * (40 - m) + [(3000.0, 20.0, None)] * m


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", cell, windows=2)


def test_a_whole_run_passes_and_is_complete(run_dir):
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    assert r["status"] == "complete" and "damage" not in r["records"]


def test_a_torn_last_line_is_refused_then_left_out_when_accepted(run_dir, capsys):
    path = run_dir / "requests.jsonl"
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[-1][:40])  # a writer cut off mid-line
    assert main([str(run_dir), "--slo", "chat:2000:100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"requests.jsonl:{len(whole.splitlines()) + 1}: torn last line" in err
    assert "--accept-damaged" in err and not (run_dir / "report.json").exists()
    assert main([str(run_dir), "--slo", "chat:2000:100", "--accept-damaged", "--no-plots"]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "damaged" and report["records"]["total"] == len(whole.splitlines())
    md = (run_dir / "report.md").read_text()
    assert md.startswith("# RMSNorm A/B goodput report (damaged)")  # the first line says it
    assert md.index("DAMAGED RECORDS") < md.index("## Comparisons")


def test_repeated_records_are_refused_and_the_first_of_each_kept(run_dir, tmp_path):
    before = analyze_run(run_dir, [CHAT], out_dir=tmp_path / "before", draw_plots=False)
    path = run_dir / "requests.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    patched = [ln for ln in lines if '"arm": "patched"' in ln and '"measure"' in ln]
    with gzip.open(run_dir / "requests.jsonl.gz", "wt") as f:  # the longer file is the one analysed
        f.writelines(lines + patched[:30])
    with pytest.raises(DamagedRecords, match="30 records repeat an .arm, window, load, phase, index."):
        analyze_run(run_dir, [CHAT], draw_plots=False)
    r = analyze_run(run_dir, [CHAT], accept_damaged=True, out_dir=tmp_path / "after", draw_plots=False)
    assert r["status"] == "damaged" and r["records"]["file"] == "requests.jsonl.gz"
    assert r["slos"][0]["patched"] == before["slos"][0]["patched"]  # the repeats were not counted


def test_a_missing_records_file_is_not_a_complete_report(run_dir):
    (run_dir / "requests.jsonl").unlink()
    with pytest.raises(DamagedRecords, match="no records file .* run.json lists 8 finished cells"):
        analyze_run(run_dir, [CHAT], draw_plots=False)
    assert analyze_run(run_dir, [CHAT], accept_damaged=True, draw_plots=False)["status"] == "damaged"


def test_a_finished_cell_with_the_wrong_count_is_refused(run_dir):
    path = run_dir / "requests.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # one record of the last cell gone, whole lines only
    with pytest.raises(DamagedRecords, match=r"1 cells .* \(first: stock window 1 load 2: 39 of 40\)"):
        analyze_run(run_dir, [CHAT], draw_plots=False)


@pytest.mark.e2e
@pytest.mark.parametrize("argv", [["--help"], ["RUN", "--slo", "chat:2000:100"]])
def test_the_analysis_and_its_help_need_no_torch(run_dir, argv):
    argv = [str(run_dir) if a == "RUN" else a for a in argv]
    no_torch = NO_TORCH + f"from experiments.analyze import main; main({argv!r})"
    done = subprocess.run([sys.executable, "-c", no_torch], capture_output=True, text=True)
    assert done.returncode == 0 and ("--accept-damaged" if argv == ["--help"] else "status complete"
                                     ) in done.stdout, done.stderr


def test_out_onto_the_run_folder_is_refused_before_analysing(run_dir, capsys):
    analyze_run(run_dir, [CHAT], draw_plots=False)
    before = (run_dir / "report.json").read_bytes()
    assert main([str(run_dir), "--out", str(run_dir / "."), "--slo", "chat:1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--in-place" in err and (run_dir / "report.json").read_bytes() == before


@pytest.mark.parametrize("flags, analysed", [(["--in-place"], True), ([], True), ([], False)])
def test_a_read_only_run_folder_is_refused_before_analysing(tmp_path, capsys, flags, analysed):
    with tmpfs(tmp_path / "ro", "size=4m") as ro:  # written by a first analysis, or not yet analysed
        run = write_run(ro / "run", cell, windows=2)
        if analysed:
            analyze_run(run, [CHAT], draw_plots=False)
        before = sorted(p.name for p in run.iterdir())
        make_read_only(ro)
        assert main([str(run), "--slo", "chat:2000:100", *flags]) == 2
        assert sorted(p.name for p in run.iterdir()) == before
    out, err = capsys.readouterr()
    where = run if flags or not analysed else run / "reanalysis"
    assert err.count("\n") == 1 and f"{where}: not writable ({run} is read-only)" in err
    assert "--in-place" in err if flags else "--out" in err
