"""The committed H200 evidence files have the shape others read (experiments' attribution)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "integration" / "results"


def _load(name: str) -> dict:
    path = RESULTS / name
    if not path.exists():
        pytest.skip(f"{path} not committed")
    return json.loads(path.read_text())


def test_profile_schema_and_raw_samples() -> None:
    prof = _load("h200-profile.json")
    assert prof["schema_version"] == 1 and prof["mode"] == "compiled" and prof["model"]
    assert prof["steps"], "no batch sizes profiled"
    for row in prof["steps"]:
        for key in ("batch_tokens", "step_us_stock", "step_us_patched", "norm_us_stock", "norm_us_patched",
                    "norm_calls", "samples"):
            assert key in row, key
        for arm in ("stock", "patched"):
            s = row["samples"][arm]
            assert s["step_wall_us"] and len(s["norm_us"]) == len(s["norm_calls"]) > 0
        assert row["norm_calls"] == row["norm_calls_patched"]  # one fused kernel per stock norm


def test_evidence_names_the_provider_and_the_graph_replays() -> None:
    ev = _load("h200.json")
    assert ev["summary"]["patched_priority"]["rms_norm"][0] == "cupy_fused"
    assert ev["summary"]["fused_in_graph_replay"] > 0 and ev["summary"]["stock_fused_kernels"] == 0
    assert any("cupy_fused" in ln and "compile range" in ln
               for ln in ev["arms"]["patched-compiled"]["log_lines"])


KERNEL_RESULTS = RESULTS.parents[1] / "kernels" / "results"


@pytest.mark.parametrize("profile, table", [
    ("h200-ingraph-all-fused/h200-profile.json", "policy-h200-in-graph.json"),
    ("h200-shipped-policy/h200-profile-eager.json", "policy-h200-in-vllm-eager.json"),
])
def test_shipped_in_vllm_tables_rebuild_from_their_committed_profiles(profile: str, table: str) -> None:
    from integration.proof import ingraph

    prof = _load(profile)
    path = KERNEL_RESULTS / table
    if not path.exists():
        pytest.skip(f"{path} not committed")
    shipped = json.loads(path.read_text())
    rebuilt = ingraph.document(prof, "bf16", 4096, source=shipped["source"])
    assert rebuilt["table"] == shipped["table"] and rebuilt["mode"] == prof["mode"] == shipped["mode"]


def test_verification_run_ran_the_fused_kernel_exactly_where_its_table_said() -> None:
    from kernels.policy import load_policy

    prof = _load("h200-ingraph-policy/h200-profile.json")
    pol = load_policy(RESULTS / "h200-ingraph-policy" / "policy-used.json")
    assert prof["compile_ranges_endpoints"], "the verification needs more than one compile range"
    for row in prof["steps"]:
        fused = pol.choose("fused_add_rms_norm", "bf16", row["batch_tokens"], 4096) != "stock"
        assert row["fused_calls_patched"] == (row["norm_calls"] if fused else 0), row["batch_tokens"]
    ev = _load("h200-ingraph-policy/h200.json")
    ranges = [ln for ln in ev["arms"]["patched-compiled"]["log_lines"] if "(compile range)" in ln]
    assert sum("-> cupy_fused" in ln for ln in ranges) == 2 and sum("declined" in ln for ln in ranges) == 4
