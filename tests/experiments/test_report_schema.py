"""report.json's typed schema: every committed report reads and writes back unchanged, an older
version is upgraded once when read, and what the schema does not know is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.jsonfile import ResultFileError, open_text, read_json, stored
from experiments.reporting import schema
from experiments.reporting.schema import AA, AnalysisInputs, Report, read_report, write_report_json

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
REPORTS = sorted({stored(p.parent / "report.json") for p in RESULTS.glob("*/report.json*")})


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.parent.name)
def test_every_committed_report_round_trips_to_the_same_bytes(path: Path, tmp_path: Path) -> None:
    r = read_report(path)
    assert isinstance(r.aa, AA) and r.baseline == r.comparison[0] and r.schema_version == 1
    write_report_json(tmp_path / "report.json", r)
    with open_text(path) as committed:  # a committed report may be kept .xz
        assert (tmp_path / "report.json").read_text(encoding="utf-8") == committed.read()


def test_an_older_version_is_upgraded_once_when_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version-0 report (the committed confirm3 report without its prompts entry, as a report written
    before it would be) reads as today's, through the one upgrade of its version."""
    committed = read_json(RESULTS / "h200-llama8b-confirm3" / "report.json", None, "report")
    old = {k: v for k, v in committed.items() if k != "prompts"} | {"schema_version": 0}
    (tmp_path / "report.json").write_text(json.dumps(old), encoding="utf-8")
    calls = []

    def from_0(doc: dict) -> dict:
        calls.append(doc["schema_version"])
        keys = list(doc)
        at = keys.index("arm_definitions") + 1
        prompts = {"prompts": committed["prompts"]}
        return {k: doc[k] for k in keys[:at]} | prompts | {k: doc[k] for k in keys[at:]}

    monkeypatch.setitem(schema.UPGRADES, 0, from_0)
    r = read_report(tmp_path / "report.json")
    assert calls == [0] and r.schema_version == 1 and r.to_json() == committed
    assert list(r.to_json()) == list(committed)


def test_what_the_schema_does_not_know_is_refused(tmp_path: Path) -> None:
    """The negative controls: an unknown entry, a newer version and an old version without an upgrade."""
    doc = read_json(RESULTS / "cpu-tiny-aa" / "report.json", None, "report")
    with pytest.raises(ResultFileError, match="does not know: verdicts"):
        Report.from_json({**doc, "verdicts": []})
    with pytest.raises(ResultFileError, match=r'bad "inputs" entry .*profile_steps'):
        Report.from_json({**doc, "inputs": {**doc["inputs"], "profile_steps": "x.json"}})
    for version, message in ((2, "knows up to 1"), (0, "no upgrade from schema_version 0")):
        path = tmp_path / f"report-{version}.json"
        path.write_text(json.dumps({**doc, "schema_version": version}), encoding="utf-8")
        with pytest.raises(ResultFileError, match=message):
            read_report(path)


def test_unset_optional_entries_are_left_out_and_set_ones_kept() -> None:
    doc = read_json(RESULTS / "cpu-tiny-aa" / "report.json", None, "report")
    assert "layout" not in Report.from_json(doc).to_json()  # a turns run has no layout entry
    duet = Report.from_json({**doc, "layout": {"name": "duet"}}).to_json()
    assert list(duet)[-4:] == ["layout", "inputs", "plots", "gpu_share"]
    assert duet["layout"] == {"name": "duet"}
    r = Report.from_json(doc)
    assert isinstance(r.inputs, AnalysisInputs) and "gpu_steps" not in r.to_json()["inputs"]
    r.inputs.gpu_steps = "graph-steps.json"  # the later inputs are recorded when given, after the others
    assert list(r.to_json()["inputs"])[-2:] == ["kernel_results", "gpu_steps"]
