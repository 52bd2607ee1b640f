"""A CLI given an input file that is not there says so in one line, ``PROG: error: MESSAGE``, never a
traceback (each run as a user types it, in a fresh Python; none needs a GPU or a server for this)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layout import ROOT

pytestmark = pytest.mark.e2e  # whole runs or commands in a fresh Python: seconds each

# module -> its arguments; {gone} is a path that does not exist
CASES = {
    "experiments.run": ["--trace", "{gone}/t.jsonl", "--device", "cpu", "--dry-run"],
    "research.kneewindows": ["{gone}"],
    "research.cellnoise": ["{gone}"],
    "research.instancelevers": ["baseline={gone}", "--out", "{gone}/levers.json"],
    "research.exposure": ["{gone}", "--arm", "patched"],
    "kernels.report": ["--from", "{gone}/h200.json"],
    "kernels.policy": ["--from", "{gone}/h200.json", "--out", "{gone}/policy.json"],
    "integration.proof.normcalls": ["--model", "{gone}", "--out", "{gone}/calls.json"],
    "research.stockcheck": ["--results", "{gone}/h200.json", "{gone}/profile.json"],
    "integration.proof.prove": ["--out", "{gone}/out", "--model", "{gone}", "--dry-run"],
    "integration.proof.enginepairs": ["{gone}/graph-steps.json"],
    "research.kerneldiff": ["{gone}/raw.json.gz:stock", "{gone}/raw.json.gz:patched"],
    "integration.proof.ingraph": ["--profile", "{gone}/profile.json", "--out", "{gone}/policy.json"],
}


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_missing_input_is_one_error_line(module: str, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    argv = [a.format(gone=gone) for a in CASES[module]]
    out = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    assert ": error: " in lines[0] and "Traceback" not in out.stderr
    assert not gone.exists()


# module -> its arguments before --slo-file (each reads its tiers file before any other work)
SLO_FILE_READERS = {
    "experiments.run": ["--trace", "traces/chat.jsonl", "--device", "cpu", "--dry-run"],
    "experiments.analyze": ["experiments/results/h200-llama8b-chat-aa", "--out", "{tmp}/out"],
}


@pytest.mark.parametrize("module", sorted(SLO_FILE_READERS))
@pytest.mark.parametrize("what", ["missing", "a folder", "not UTF-8"])
def test_an_unreadable_slo_file_is_one_line_naming_the_flag(module: str, what: str, tmp_path: Path) -> None:
    slo_file = {"missing": tmp_path / "gone.toml", "a folder": tmp_path}.get(what, tmp_path / "s.toml")
    if what == "not UTF-8":
        slo_file.write_bytes(b'[[slo]]\nname = "\xff"\n')
    argv = [a.format(tmp=tmp_path) for a in SLO_FILE_READERS[module]] + ["--slo-file", str(slo_file)]
    out = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"error: --slo-file {slo_file}: cannot read" in lines[0]
    assert not (tmp_path / "out").exists()


# module -> its arguments with the input file {trace} or {results} also given as the output
ONTO_INPUT = {
    "traces.info": ["{trace}", "--out", "{trace}"],
    "traces.convert": ["--format", "mooncake", "{trace}", "{trace}"],
    "loadgen": ["--url", "http://127.0.0.1:9", "--trace", "{trace}", "--out", "{trace}", "--append"],
    "kernels.policy": ["--from", "{results}", "--out", "{results}"],
}


@pytest.mark.parametrize("module", sorted(ONTO_INPUT))
def test_an_output_onto_its_input_is_one_error_line_and_the_input_stays(module: str, tmp_path: Path) -> None:
    trace, results = tmp_path / "t.jsonl", tmp_path / "h200.json"
    trace.write_text('{"timestamp": 0, "input_tokens": 5, "output_tokens": 2}\n')
    results.write_text('{"schema_version": 1, "bench": []}\n')
    before = {p: p.read_bytes() for p in (trace, results)}
    argv = [a.format(trace=trace, results=results) for a in ONTO_INPUT[module]]
    out = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "is the input" in lines[0], out.stderr
    assert {p: p.read_bytes() for p in before} == before


# module -> its arguments, the output {out} in a folder that does not exist (each would run for
# minutes on a GPU, or fail for want of one, before writing it)
OUTPUT_FIRST = {
    "kernels.bench": ["--out", "{out}"],
    "kernels.suite": ["--out", "{out}"],
    "research.launchcost": ["--out", "{out}"],
    "integration.proof.plantedcost": ["--ns", "1000", "--out", "{out}"],
    "integration.proof.normcalls": ["--model", "integration/models/tiny-llama", "--out", "{out}"],
    "integration.proof.graphtime": ["--raw", "{gone}/raw.json.gz", "--out", "{out}"],
    "integration.proof.evidence": ["--raw", "{gone}/raw.json.gz", "--out", "{out}"],
    "integration.proof.enginepairs": ["{gone}/a.json", "--out", "{out}"],
    "integration.proof.ingraph": ["--profile", "{gone}/profile.json", "--out", "{out}"],
}


@pytest.mark.parametrize("module", sorted(OUTPUT_FIRST))
def test_an_output_that_cannot_be_written_is_refused_before_the_work(module: str, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    argv = [a.format(gone=gone, out=gone / "out.json") for a in OUTPUT_FIRST[module]]
    out = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"--out {gone / 'out.json'}: folder {gone} does not exist" in lines[0]
