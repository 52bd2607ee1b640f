"""The positive control through the experiment on real vLLM CPU servers: `stock` vs `planted:<N>us`,
with N chosen so that the TPOT change is large on the tiny model whatever else the machine runs, is
detected."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.core.rundir import load_records
from experiments.core.runfile import read_run
from experiments.runner.config import make_config
from experiments.runner.orchestrate import run_experiment
from experiments.stats import goodput
from experiments.stats.plantedline import decode_totals

pytestmark = pytest.mark.server
TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"
# 5 norm calls per step of the 2-layer tiny Llama: 5 ms more per decode step (the largest delay the
# control takes, 1 ms per call), about +100% of its median TPOT at 1x on two idle cores (4-6 ms). A
# 2-ms delay (+35% idle) went undetected on a loaded machine, where stock's steps were several times
# slower and the turns of the arms met different load; a busy-wait in every step is wall time under
# any load, so 5 ms still doubles a step four times as slow as an idle one.
PLANTED = "planted:1000us"
ADDED_MS = 5.0  # per decode step, so per token


def test_a_planted_delay_is_detected_with_its_prediction_beside_it(tmp_path: Path) -> None:
    cfg = make_config(TRACE, "cpu", arms=("stock", PLANTED), windows=4, window_s=8.0, loads=(1.0, 2.0),
                      warmup_s=3.0, results_dir=tmp_path, name="planted", progress=False)
    run_dir = run_experiment(cfg)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete", run["stopped_reason"]
    definition = run["arm_definitions"][PLANTED]
    assert definition["provider"] == "cupy_fused" and definition["env"]["RMSNORM_PLANTED_NS"] == "1000000"
    assert run["mode_note"] is None  # a real A/B on CPU: the planted arm differs
    report = json.loads((run_dir / "report.json").read_text())
    (line,) = report["planted"]
    assert line["reference"] == "stock" and line["delay_at"] == "every norm call"  # CPU: a host wait per call
    assert line["norm_calls_per_step"] == 5 and line["added_us_per_decode_token"] == 1000 * ADDED_MS
    assert line["step_source"].startswith("stock's decode time per token (its records)")
    records, _ = load_records(run_dir)
    frame = goodput.records_frame(records, read_run(run_dir).slos())
    totals = decode_totals(frame[frame["phase"] == "measure"])  # the measured replays, as compared
    per_token = [ms / tokens for (arm, _), (ms, tokens) in sorted(totals.items()) if arm == "stock"]
    mean_log = sum(math.log1p(ADDED_MS / ms) for ms in per_token) / len(per_token)  # over each load's
    assert len(per_token) == 2
    assert line["predicted_pct"] == pytest.approx(100 * math.expm1(mean_log), rel=1e-6)
    # the delay is in every decode step of the planted server, whatever the machine's load
    planted_tpot = frame[(frame["arm"] == PLANTED) & (frame["phase"] == "measure")]["tpot_ms"].dropna()
    assert planted_tpot.median() >= ADDED_MS
    assert line["detected"] is True and line["ci95_pct"][0] > 0
    md = (run_dir / "report.md").read_text()
    assert (f"- planted control {PLANTED} vs stock (1000 us at every norm call; 1000 us added per call from "
            "the delay alone x 5 calls per step = 5000 us per decode token, mean over loads)") in md
    assert "— detected" in md
    print(md.split("\n\n")[0])
