"""research.instancelevers: the offset variance and its parts on data with known components, the F verdicts,
the refusals (not an A/A, no instances of its own), and the committed table re-derived."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.jsonfile import read_json
from research import instancelevers

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
COMMITTED = RESULTS / "instance-levers.json"
LEVERS = [f"{name}={RESULTS / f'h100-aa3-{name}'}" for name in ("baseline", "pin", "rotate")]


def _frame(instance_sd: float, cell_sd: float, instances: int = 300, servers: int = 3, cells: int = 8,
           seed: int = 0) -> pd.DataFrame:
    """Measured requests of an A/A run, one per (instance, cell, server): log TPOT = the cell's level +
    the server's instance effect + noise; one failed request and one from the warm-up beside them."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, instance_sd, (instances, servers))
    rows = [{"instance": i, "window": i * cells + c, "load": 5.0, "arm": f"s{j}", "phase": "measure",
             "succeeded": True, "tpot_ms": math.exp(3 + 0.5 * c + effect[i, j] + rng.normal(0, cell_sd))}
            for i in range(instances) for c in range(cells) for j in range(servers)]
    rows += [{**rows[0], "succeeded": False, "tpot_ms": 1e6}, {**rows[1], "phase": "warmup", "tpot_ms": 1e6}]
    return pd.DataFrame(rows)


def test_the_components_recover_a_known_instance_and_cell_variance() -> None:
    parts = instancelevers.offset_components(_frame(instance_sd=0.03, cell_sd=0.05))
    assert parts["df"] == 300 * 2 and parts["servers"] == 3 and parts["cells_per_block"] == 8
    assert parts["cell_noise_var"] == pytest.approx(0.05 ** 2 / 8, rel=0.1)
    assert parts["instance_var"] == pytest.approx(0.03 ** 2, rel=0.15)
    assert parts["offset_var"] == pytest.approx(0.03 ** 2 + 0.05 ** 2 / 8, rel=0.15)
    none = instancelevers.offset_components(_frame(instance_sd=0.0, cell_sd=0.05, seed=1))
    assert none["instance_var"] < 0.1 * 0.03 ** 2  # no instance effect: (about) none found


def test_a_lever_is_lower_only_when_the_f_interval_lies_below_one() -> None:
    def lever(var: float, df: int) -> dict:
        return {"offset_var": var, "df": df}

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
    new, old = json.loads(out.read_text()), read_json(COMMITTED, None, "instance levers")
    assert new.pop("command") != old.pop("command")  # names the output path
    assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)
    verdicts = [lev["verdict"] for lev in old["levers"]]
    assert verdicts == ["baseline", "not distinguishable", "higher"] and old["levers"][0]["df"] == 6
    assert old["levers"][1]["placement"]["pin_cpus"]["kit"] == [12, 13, 14, 15]
