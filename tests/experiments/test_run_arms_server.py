"""An A/B of two user-defined arms from an arm file, on real vLLM CPU servers the run starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.core.rundir import load_records
from experiments.runner import cli as run_cli
from experiments.stats import goodput
from research import cellnoise

pytestmark = pytest.mark.server
TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"
ARM_FILE = """
[[arm]]
name = "shipped"
description = "vLLM as shipped"

[[arm]]
name = "logprobs7"
description = "a harmless extra vLLM flag and variable"
server_args = ["--max-logprobs=7"]
env = { VLLM_LOG_STATS_INTERVAL = "60" }
"""


def test_two_user_arms_from_an_arm_file_run_as_an_ab(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    arm_file = tmp_path / "my-arms.toml"
    arm_file.write_text(ARM_FILE)
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--arms-file", str(arm_file),
                         "--arm", "shipped", "--arm", "logprobs7", "--aa", "none", "--windows", "2",
                         "--window-s", "6", "--loads", "1", "--warmup-s", "3", "--results-dir", str(tmp_path),
                         "--name", "mine", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    run_dir = tmp_path / "mine"
    arm_file.unlink()  # everything below reads the run directory only
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and run["arm_labels"] == ["shipped", "logprobs7"]
    flagged = run["servers"]["logprobs7"]
    assert "--max-logprobs=7" in flagged["cmd"] and "--max-logprobs=7" not in run["servers"]["shipped"]["cmd"]
    assert run["arm_definitions"]["logprobs7"]["env"] == {"VLLM_LOG_STATS_INTERVAL": "60"}
    log = (run_dir / "server-logprobs7.log").read_text()
    assert "max_logprobs=7" in log.replace(" ", "") or "--max-logprobs=7" in log
    report = json.loads((run_dir / "report.json").read_text())
    assert report["comparison"] == ["shipped", "logprobs7"] and not report["missing"]
    # every cell where both arms have a request with an observed TPOT is compared (on a starved CPU
    # the client can read a whole reply at once, leaving a cell without one: then it is not a cell)
    records, _ = load_records(run_dir)
    pairs = cellnoise.paired_requests(goodput.records_frame(records, []), "shipped", "logprobs7", "tpot_ms")
    cells = pairs.groupby(["window", "load"]).ngroups
    assert cells >= 1 and report["paired_latency"]["logprobs7"]["tpot_ms"]["n_cells"] == cells
    md = (run_dir / "report.md").read_text()
    assert ("differs from shipped in: + --max-logprobs=7; + VLLM_LOG_STATS_INTERVAL=60; started by the kit"
            in md)
    assert not md.startswith("**A/A run**")
