"""research.instancefloor: the floor and the restated intervals on hand-made rows; the committed file
re-derived."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from research import instancefloor

COMMITTED = Path(__file__).resolve().parents[2] / "runtime_tables" / "instance-prior.json"


def _row(run: str, arm: str, est: float, se_pct: float, df: int = 60, model: str = "m") -> dict:
    return {"run": run, "gpu": "G", "model": model, "arm": arm, "role": "aa", "cells": df + 4,
            "estimate_pct": est, "ci95_pct": [est - 2 * se_pct, est + 2 * se_pct], "df": df,
            "se_pct": se_pct, "excludes_zero": abs(est) > 2 * se_pct}


def test_the_floor_is_the_moments_estimate_per_model() -> None:
    """Estimates +-0.3% and 0 with se 0.1%: var 0.09, se^2 0.01 (percent^2): instance sd sqrt(0.04) = 0.2%."""
    aa = [_row("a", "stock-b", 0.3, 0.1), _row("b", "stock-b", -0.3, 0.1), _row("c", "stock-b", 0.0, 0.1),
          _row("d", "stock-b", 0.5, 0.1, model="other")]
    floors = instancefloor.floor_by_model(aa)
    assert list(floors) == ["G m"]  # one pair of "other": no floor
    assert floors["G m"]["instance_sd_pct"] == pytest.approx(0.2, rel=0.01)
    assert floors["G m"]["df"] == pytest.approx(1.58, abs=0.01)  # 2 x (0.08 / 0.09)^2
    rows = instancefloor.restate([{**_row("a", "patched", 0.4, 0.1), "role": "patched"}, aa[3]], floors)
    assert rows[0]["over_instances_ci95_pct"][0] < 0.0 < 0.4 < rows[0]["over_instances_ci95_pct"][1]
    assert rows[1]["over_instances_ci95_pct"] is None and "fewer than 2" in rows[1]["reason"]


@pytest.mark.evidence
def test_the_committed_floor_is_rederived(tmp_path: Path) -> None:
    out = tmp_path / "instance-prior.json"
    assert instancefloor.main(["--out", str(out)]) == 0
    new, old = json.loads(out.read_text()), json.loads(COMMITTED.read_text())
    assert new.pop("command") != old.pop("command")  # names the output path
    assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)
    assert old["aa_summary"] == {"pairs": 10, "exclude_zero": 3}
    floor = old["instance"]["NVIDIA H200 llama-3.1-8b"]
    assert (floor["pairs"], round(floor["sd_estimates_pct"], 2)) == (9, 0.27)
    assert math.isclose(floor["instance_sd_pct"], 0.1645, rel_tol=1e-3)
    assert (tmp_path / "instance-prior.md").read_text() == COMMITTED.with_suffix(".md").read_text() \
        .replace("runtime_tables/instance-prior.json", str(out))
    assert instancefloor.main(["--out", str(out), "--budget-min", "60"]) == 0
    plan = json.loads(out.read_text())["plan"]
    assert plan["gpu_minutes"] <= 60 < plan["gpu_minutes"] + 2 * plan["costs"]["start_min"]
