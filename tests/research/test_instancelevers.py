"""research.instancelevers: the pair-mean variance behind an interval over instances, the F verdicts,
the refusals (not an A/A, no instances of its own), and the committed table re-derived."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats as sps

from research import instancelevers

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
COMMITTED = RESULTS / "instance-levers.json"
LEVERS = [f"{name}={RESULTS / f'h100-aa3-{name}'}" for name in ("baseline", "pin", "rotate")]


def _row(sd_log: float, pairs: int = 3) -> dict:
    """A row whose interval over `pairs` instance pairs is that of pair means with sd `sd_log`."""
    half = float(sps.t.ppf(0.975, pairs - 1)) * sd_log / math.sqrt(pairs)
    return {"ci95_pct": [100 * math.expm1(-half), 100 * math.expm1(half)], "df": pairs - 1,
            "instance_pairs": pairs}


def test_the_pair_mean_variance_is_read_back_from_the_interval() -> None:
    assert instancelevers.pair_mean_var(_row(0.02)) == pytest.approx(0.02 ** 2, rel=1e-9)


def test_a_lever_is_lower_only_when_the_f_interval_lies_below_one() -> None:
    def lever(var: float, df: int) -> dict:
        return {"pair_mean_var": var, "df": df}

    levers = instancelevers.compare([lever(1.0, 40), lever(0.3, 40), lever(1.1, 40), lever(3.0, 40)])
    assert [lev["verdict"] for lev in levers] == ["baseline", "lower", "not distinguishable", "higher"]
    few = instancelevers.compare([lever(1.0, 4), lever(0.3, 4)])  # 4 df: a 3x cut is not resolved
    assert few[1]["verdict"] == "not distinguishable" and few[1]["detectable_ratio"] < 0.3


@pytest.mark.evidence
@pytest.mark.parametrize(("run", "message"), [("h100-llama1b-default", "not an A/A run"),
                                              ("h200-llama8b-chat-aa", "no rows over this run's own")])
def test_runs_that_cannot_answer_are_refused(run: str, message: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "levers.json"
    assert instancelevers.main([LEVERS[0], f"other={RESULTS / run}", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


@pytest.mark.evidence
def test_the_committed_table_is_rederived(tmp_path: Path) -> None:
    out = tmp_path / "instance-levers.json"
    assert instancelevers.main([*LEVERS, "--out", str(out)]) == 0
    new, old = json.loads(out.read_text()), json.loads(COMMITTED.read_text())
    assert new.pop("command") != old.pop("command")  # names the output path
    assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)
    verdicts = [lev["verdict"] for lev in old["levers"]]
    assert verdicts == ["baseline", "not distinguishable", "not distinguishable"]
    assert old["levers"][1]["placement"]["pin_cpus"]["kit"] == [12, 13, 14, 15]
