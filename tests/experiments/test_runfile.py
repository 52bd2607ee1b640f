"""run.json's typed record (experiments.core.runfile): version-1 files upgraded once as they are read,
the record written and read back whole, bad files refused naming what is wrong, and no reader of
run.json outside the record's own module."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common.jsonfile import ResultFileError, read_json
from experiments.core.runfile import RUN_SCHEMA_VERSION, Run, read_run
from experiments.core.slo import DEFAULT_SLO_FILE, load_slo_file
from experiments.runner.config import make_config

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "experiments" / "results" / "cpu-tiny-aa"


def _copy(tmp_path: Path, change=None) -> Path:
    """The committed CPU run's run.json in a folder of its own, `change`d."""
    data = read_json(COMMITTED / "run.json", None, "run record")
    if change is not None:
        change(data)
    (tmp_path / "run.json").write_text(json.dumps(data), encoding="utf-8")
    return tmp_path


def test_a_version_1_run_gets_the_default_tiers_and_the_settings_it_left_out() -> None:
    raw = read_json(COMMITTED / "run.json", None, "run record")
    assert raw["schema_version"] == 1 and raw["config"]["slos"] is None and "layout" not in raw["config"]
    run = read_run(COMMITTED)
    assert run.schema_version == RUN_SCHEMA_VERSION == 2
    assert run.slos() == load_slo_file(DEFAULT_SLO_FILE)
    assert (run.config["layout"], run.config["sleep_mode"], run.layout) == ("turns", False, "turns")
    assert run.arm_labels == raw["arm_labels"] and run.schedule == raw["schedule"]


def test_the_record_reads_back_as_it_was_written(tmp_path: Path) -> None:
    run = read_run(COMMITTED)
    (tmp_path / "run.json").write_text(json.dumps(run.to_json()), encoding="utf-8")
    again = read_run(tmp_path)
    assert again == run and again.to_json()["schema_version"] == 2


def test_a_new_run_records_its_tiers_whole() -> None:
    cfg = make_config(REPO / "traces" / "chat.jsonl", "cpu")
    assert cfg.to_json()["slos"] == [s.to_json() for s in load_slo_file(DEFAULT_SLO_FILE)]
    assert Run(config=cfg.to_json()).slos() == list(cfg.slos)


def test_an_unknown_key_or_version_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match=r"run.json: unknown keys \['colour'\]"):
        read_run(_copy(tmp_path, lambda d: d.update(colour="red")))
    with pytest.raises(ResultFileError, match="run record schema_version 3; this reader knows 1, 2"):
        read_run(_copy(tmp_path, lambda d: d.update(schema_version=3)))
    with pytest.raises(ValueError, match=r"windows\[0\].duration_s must be a finite number > 0, got 0"):
        read_run(_copy(tmp_path, lambda d: d["windows"][0].update(duration_s=0)))


def test_the_committed_runs_all_upgrade(tmp_path: Path) -> None:
    runs = sorted({p.parent for p in (REPO / "experiments" / "results").glob("*/run.json*")})
    assert len(runs) >= 5 and any((r / "run.json.xz").is_file() for r in runs)  # kept compressed too
    for run_dir in runs:
        assert read_run(run_dir).slos(), run_dir


def test_run_json_is_read_only_through_the_record() -> None:
    """No module takes run.json as a dict or indexes it by key outside experiments.core.runfile."""
    found = [f"{p.relative_to(REPO)}:{i}" for room in ("experiments", "integration", "research")
             for p in sorted((REPO / room).rglob("*.py")) if p.name != "runfile.py"
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r'\brun: dict|\brun\["|\brun\.get\(', line)]
    assert found == []
