"""The committed H200 evidence files have the shape others read (experiments' attribution)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runtime_tables
from common.jsonfile import read_json

pytestmark = pytest.mark.evidence  # re-derives committed files (make test-fast leaves it out)

RESULTS = Path(__file__).resolve().parents[2] / "integration" / "results"


def _load(name: str) -> dict:
    """A committed results file (plain or kept .xz); ResultFileError naming it where it is missing."""
    return read_json(RESULTS / name, None, name)


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


TABLES = runtime_tables.DIR  # the tables the code reads (runtime_tables/README.md), past ones by GPU


@pytest.mark.parametrize("profile, table", [
    ("h200-ingraph-all-fused/h200-profile.json", "h200/policy-h200-in-graph-v1.json"),
    ("h200-shipped-policy/h200-profile-eager.json", "policy-h200-in-vllm-eager.json"),
])
def test_shipped_in_vllm_tables_rebuild_from_their_committed_profiles(profile: str, table: str) -> None:
    from integration.proof import ingraph

    prof = _load(profile)
    shipped = read_json(TABLES / table, None, table)
    rebuilt = ingraph.document(prof, "bf16", 4096, source=shipped["source"])
    assert rebuilt["table"] == shipped["table"] and rebuilt["mode"] == prof["mode"] == shipped["mode"]


def test_shipped_compiled_table_rebuilds_from_the_graph_timed_run_and_was_verified_by_another() -> None:
    """policy-h200-in-graph.json is ingraph's answer for the kernel-v2 run timed by graph replays,
    and the run that then ran that table answered the same at every row count."""
    from integration.proof import ingraph
    from kernels.policy import load_policy

    run = RESULTS / "h200-llama8b-graph"
    shipped = json.loads((TABLES / "policy-h200-in-graph.json").read_text())
    rebuilt = ingraph.document(_load("h200-llama8b-graph/h200-profile.json"), "bf16", 4096,
                               source=shipped["source"],
                               graph=_load("h200-llama8b-graph/h200-graph-steps.json"),
                               launch=load_policy(TABLES / "policy-h200.json"))
    assert rebuilt["table"] == shipped["table"]
    assert str(run.relative_to(RESULTS.parents[1])) in shipped["source"]
    a = load_policy(TABLES / "policy-h200-in-graph.json")
    b = load_policy(runtime_tables.resolve("integration/results/h200-llama8b-graph-policy/policy-used.json"))
    for op in ("rms_norm", "fused_add_rms_norm"):
        assert all(a.choose(op, "bf16", n, 4096) == b.choose(op, "bf16", n, 4096) for n in range(1, 17000))
    verified = {r["batch_tokens"]: r["arms"]["patched"]
                for r in _load("h200-llama8b-graph-policy/h200-graph-steps.json")["sizes"]}
    assert all(verified[n]["ci95_pct"][1] < 0 for n in (1, 4, 16, 32))  # faster, interval below zero
    assert all(verified[n]["ci95_pct"][0] <= 0 for n in verified)  # no decode size slower


def test_verification_run_ran_the_fused_kernel_exactly_where_its_table_said() -> None:
    from kernels.policy import load_policy

    prof = _load("h200-ingraph-policy/h200-profile.json")
    pol = load_policy(runtime_tables.resolve("integration/results/h200-ingraph-policy/policy-used.json"))
    assert prof["compile_ranges_endpoints"], "the verification needs more than one compile range"
    for row in prof["steps"]:
        fused = pol.choose("fused_add_rms_norm", "bf16", row["batch_tokens"], 4096) != "stock"
        assert row["fused_calls_patched"] == (row["norm_calls"] if fused else 0), row["batch_tokens"]
    ev = _load("h200-ingraph-policy/h200.json")
    ranges = [ln for ln in ev["arms"]["patched-compiled"]["log_lines"] if "(compile range)" in ln]
    assert sum("-> cupy_fused" in ln for ln in ranges) == 2 and sum("declined" in ln for ln in ranges) == 4


@pytest.mark.parametrize("run, rounds, replays", [
    ("h200-llama8b-graph", 6, 100), ("h200-llama8b-graph-policy", 6, 100), ("h200-llama1b-graph", 6, 100),
    ("h200-qwen3-0.6b", 6, 100), ("h200-qwen3-8b", 6, 100), ("h200-llama8b-graph-onerange", 4, 50)])
def test_graph_step_files_rebuild_from_their_raw_samples(run: str, rounds: int, replays: int) -> None:
    from integration.proof import graphtime

    committed = _load(f"{run}/h200-graph-steps.json")
    assert graphtime.document(_load(f"{run}/raw-steps.json.xz")) == committed
    assert all(r["arms"]["patched"]["rounds"] == rounds and r["replays_per_round"] == [replays]
               for r in committed["sizes"])


def test_the_one_range_run_gave_the_policy_ranges_to_the_patched_engine_only() -> None:
    ev = _load("h200-llama8b-graph-onerange/h200.json")
    ranges = {n: a["worker_command"][a["worker_command"].index("--compile-ranges") + 1]
              for n, a in ev["arms"].items()}
    assert ranges == {"stock-compiled": "", "patched-compiled": "32"}


def test_the_pdl_off_table_is_the_shipped_one_without_pdl() -> None:
    """policy-h200-in-graph-nopdl.json (the PDL-off engine run, h200-replicas-plan.md) differs from the
    shipped table only in launching each fused call without PDL: same sizes fused, same launch shape."""
    from kernels.policy import load_policy

    shipped = load_policy(TABLES / "policy-h200-in-graph.json")
    nopdl = load_policy(TABLES / "h200" / "policy-h200-in-graph-nopdl.json")
    for op in ("rms_norm", "fused_add_rms_norm"):
        for n in range(1, 17000):
            a, b = shipped.choose(op, "bf16", n, 4096), nopdl.choose(op, "bf16", n, 4096)
            assert b == (a[:-1] if a.startswith("fused:") and a.endswith("p") else a)
    assert any(shipped.choose("rms_norm", "bf16", n, 4096).endswith("p") for n in (1, 32))
    assert not any(c.endswith("p") for rows in nopdl.table.values() for _, c in rows)


def test_graphtime_and_evidence_clis_read_the_compressed_raw_file(tmp_path: Path, capsys) -> None:
    from integration.proof import evidence, graphtime

    run = RESULTS / "h200-llama8b-graph"
    out = tmp_path / "steps.json"
    assert graphtime.main(["--raw", str(run / "raw-steps.json.xz"), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == _load("h200-llama8b-graph/h200-graph-steps.json")
    assert evidence.main(["--raw", str(run / "raw-steps.json.xz"), "--out", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text()) == _load("h200-llama8b-graph/h200-profile.json")
    with pytest.raises(SystemExit):
        graphtime.main(["--raw", str(tmp_path / "gone.json.gz"), "--out", str(out)])
    assert "gone.json.gz: no such raw-steps file" in capsys.readouterr().err
