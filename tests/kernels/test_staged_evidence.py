"""The staged builds' GPU evidence, committed in kernels/results/h100-staged/ (an H100: sm_90, the same
code path as the H200): what its README says follows from the results file and the logs."""

from __future__ import annotations

from pathlib import Path

import pytest

import runtime_tables
from common.jsonfile import read_json
from kernels import policy, report, shapes
from kernels.cases import GUARD, full_cases
from kernels.shapes import ITEMSIZE
from kernels.validate import build_family

pytestmark = pytest.mark.evidence  # re-derives committed files (make test-fast leaves it out)

RUN = Path(__file__).resolve().parents[2] / "kernels" / "results" / "h100-staged"
SOURCE = "kernels/results/h100-staged/h100-80gb-hbm3.json"


@pytest.fixture(scope="module")
def results() -> dict:
    return read_json(RUN / "h100-80gb-hbm3.json", None, "kernel results")


def _not_applicable(cases: list) -> int:
    """Cases whose explicit launch shape cannot hold their row (kernels.shapes.shape_fits), at the
    vector width their guarded buffers give them."""
    n = 0
    for c in cases:
        if c.variant:
            size = ITEMSIZE[c.dtype]
            vec = shapes.vector_width(size, list(c.strides[:-1]), [(GUARD + c.pad) * size])
            n += shapes.shape_fits(shapes.LaunchShape.parse(c.variant), c.hidden, vec) is not None
    return n


def test_full_validation_ran_both_families_and_passed(results: dict) -> None:
    v = results["validation"]
    cases = full_cases()
    assert v["suite"] == "full" and v["passed"] and v["failures_total"] == 0
    assert v["cases_run"] + v["cases_not_applicable"] == len(cases)
    assert v["cases_not_applicable"] == _not_applicable(cases)
    staged = sum(1 for c in cases if build_family(c) == "staged")
    assert 0 < v["cases_run_by_family"]["staged"] <= staged and v["cases_run_by_family"]["register"] > 0


def test_both_negative_controls_fail_in_both_families(results: dict) -> None:
    for name, ctl in results["validation"]["negative_controls"].items():
        assert ctl["failed_as_it_must"], name
        assert ctl["cases_failed_by_family"]["register"] > 0 and ctl["cases_failed_by_family"]["staged"] > 0


def test_sanitizers_are_clean_and_their_logs_say_so(results: dict) -> None:
    tools = {s["tool"]: s for s in results["validation"]["sanitizer"]}
    assert set(tools) == {"memcheck", "racecheck", "initcheck"}
    for tool, s in tools.items():
        assert s["clean"] is True, tool
        log = (RUN / "logs" / f"sanitizer-{tool}.log").read_text()
        assert ("RACECHECK SUMMARY: 0 hazard" if tool == "racecheck" else "ERROR SUMMARY: 0 error") in log


def test_the_readme_carries_the_report_generated_from_the_file(results: dict) -> None:
    study = report.staged_study(results)
    assert study["shapes"] > 0 and not study["staged_fastest"] and study["ratio_max"] < 1
    assert report.render(results, SOURCE) in (RUN / "README.md").read_text()


def test_the_policy_table_follows_from_the_samples(results: dict) -> None:
    shipped = policy.load_policy(runtime_tables.path("h100-80gb-hbm3/policy-h100-80gb-hbm3-staged.json"))
    assert shipped.table == policy.build_table(results["bench"])
    chosen = {choice.split(":", 1)[1] for entries in shipped.table.values() for _, choice in entries
              if choice.startswith("fused:")}
    assert chosen and not any(shapes.LaunchShape.parse(v).staged for v in chosen)  # none was fastest
