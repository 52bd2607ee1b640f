"""The compiled-mode policy built from in-graph timings (integration/ingraph.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.jsonfile import read_json
from integration.proof import evidence, ingraph
from kernels.policy import load_policy

RESULTS = Path(__file__).resolve().parents[3] / "integration" / "results"


def _row(n: int, stock: list[float], patched: list[float], kind: str = "decode", extra: float = 0.0,
         fused_calls: float = 65.0, wall: tuple[float, float] = (1000.0, 1000.0)) -> dict:
    return {"kind": kind, "batch_tokens": n, "norm_calls": 65.0, "fused_calls_patched": fused_calls,
            "norm_us_stock": sorted(stock)[len(stock) // 2],
            "norm_us_patched": sorted(patched)[len(patched) // 2],
            "patched_extra_kernels_us": {"triton_poi_embedding": extra} if extra else {},
            "patched_faster_every_step": max(patched) + extra < min(stock),
            "step_us_stock": wall[0], "step_us_patched": wall[1],
            "patched_step_not_slower": wall[1] <= wall[0]}


def test_a_size_is_fused_only_where_every_patched_step_beats_every_stock_step() -> None:
    prof = {"steps": [_row(1, [10, 11], [12, 13]),            # slower
                      _row(8, [10, 11], [9.5, 10.5]),         # overlapping: not proven faster
                      _row(512, [100, 101], [90, 91], kind="prefill"),
                      # faster only without extra
                      _row(1024, [200, 201], [180, 181], kind="prefill", extra=25.0)]}
    assert ingraph.verdicts(prof) == {1: False, 8: False, 512: True, 1024: False}


def test_a_faster_kernel_in_a_slower_step_stays_stock() -> None:
    # above the CUDA-graph sizes each call pays a Python custom-op call and a CuPy launch on the CPU
    prof = {"steps": [_row(1024, [580, 581], [540, 541], kind="prefill", wall=(29_000.0, 63_000.0)),
                      _row(4096, [2100, 2101], [2000, 2001], kind="prefill", wall=(105_000.0, 104_000.0))]}
    assert ingraph.verdicts(prof) == {1024: False, 4096: True}


def test_ranges_between_sizes_are_fused_only_when_both_neighbours_won() -> None:
    sizes = {1: False, 256: False, 512: True, 1024: True, 2048: False, 4096: True}
    assert ingraph.table_entries(sizes) == [[1, "stock"], [256, "stock"], [512, "stock"],
                                            [1024, "fused:auto"], [2048, "stock"], [4096, "stock"]]
    assert ingraph.table_entries({1: True, 2: True}) == [[1, "fused:auto"], [2, "fused:auto"]]


def test_a_size_measured_twice_must_win_both_times() -> None:
    prof = {"steps": [_row(256, [10, 11], [8, 9]), _row(256, [20, 21], [22, 23], kind="prefill")]}
    assert ingraph.verdicts(prof) == {256: False}


def test_a_size_the_patched_policy_declined_proves_nothing_and_stays_stock() -> None:
    prof = {"steps": [_row(1, [10, 11], [8, 9]), _row(128, [10, 11], [8, 9], fused_calls=1.0),
                      _row(512, [100, 101], [90, 91], kind="prefill", fused_calls=0.0)]}
    assert ingraph.verdicts(prof) == {1: True, 128: False, 512: False}


def test_a_profile_where_the_fused_kernel_never_ran_everywhere_is_refused() -> None:
    prof = {"steps": [_row(1, [10, 11], [8, 9], fused_calls=0.0)]}
    with pytest.raises(ingraph.ProfileError, match="--all-fused"):
        ingraph.verdicts(prof)
    with pytest.raises(ingraph.ProfileError, match="no steps"):
        ingraph.verdicts({"steps": []})


def test_document_loads_as_a_policy_and_answers_both_ops(tmp_path: Path) -> None:
    prof = {"steps": [_row(1, [10, 11], [12, 13]), _row(512, [100, 101], [90, 91], kind="prefill"),
                      _row(1024, [200, 201], [180, 181], kind="prefill")]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(ingraph.document(prof, "bf16", 4096, source="test")))
    pol = load_policy(path)
    for op in ("rms_norm", "fused_add_rms_norm"):
        assert pol.choose(op, "bf16", 1, 4096) == "stock"
        assert pol.choose(op, "bf16", 600, 4096) == "fused:auto"
        assert pol.choose(op, "bf16", 9000, 4096) == "fused:auto"  # beyond the largest: the largest's answer
        assert pol.choose(op, "bf16", 600, 2048) == "stock"  # a shape not measured in-graph


def test_cli_writes_the_table_and_names_a_bad_profile(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"steps": [_row(1, [10, 11], [8, 9])]}))
    bad.write_text(json.dumps({"steps": [_row(1, [10, 11], [8, 9], fused_calls=3.0)]}))
    out = tmp_path / "t.json"
    assert ingraph.main(["--profile", str(good), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["table"]["rms_norm/bf16/4096"] == [[1, "fused:auto"]]
    assert ingraph.main(["--profile", str(bad), "--out", str(tmp_path / "x.json")]) == 2
    assert "bad.json" in capsys.readouterr().err
    assert ingraph.main(["--profile", str(tmp_path / "gone.json"), "--out", str(tmp_path / "x.json")]) == 2
    assert "gone.json: no such step profile file" in capsys.readouterr().err


def test_committed_profile_rebuilds_with_step_level_verdicts() -> None:
    raw_path = RESULTS / "h200-raw-steps.json.xz"
    prof = evidence.profile_from_raw(read_json(raw_path, None, "raw-steps"))
    for row in prof["steps"]:
        s, p = row["samples"]["stock"]["norm_us"], row["samples"]["patched"]["norm_us"]
        extra = sum(row["patched_extra_kernels_us"].values())
        assert row["patched_faster_every_step"] == (max(p) + extra < min(s))
        assert not (row["patched_faster_every_step"] and row["patched_slower_every_step"])


def test_graph_replay_timing_overrides_the_profile_at_decode_sizes_only() -> None:
    prof = {"steps": [_row(1, [10, 11], [12, 13]),        # profile: norm slower, graph: step faster
                      _row(8, [10, 11], [9, 9.5]),         # profile: faster, graph: interval spans zero
                      _row(64, [10, 11], [9, 9.5]),        # no graph row: the profile decides
                      _row(512, [100, 101], [90, 91], kind="prefill")]}
    graph = {"sizes": [{"batch_tokens": 1, "arms": {"patched": {"ci95_pct": [-2.5, -2.3]}}},
                       {"batch_tokens": 8, "arms": {"patched": {"ci95_pct": [-0.2, 0.1]}}},
                       {"batch_tokens": 512, "arms": {"patched": {"ci95_pct": [0.5, 0.9]}}}]}
    assert ingraph.verdicts(prof, graph) == {1: True, 8: False, 64: True, 512: True}
    doc = ingraph.document(prof, "bf16", 4096, "test", graph=graph)
    assert doc["table"]["rms_norm/bf16/4096"] == [[1, "fused:auto"], [8, "stock"], [64, "stock"],
                                                   [512, "fused:auto"]]
    assert doc["graph_evidence"][0]["ci95_pct"] == [-2.5, -2.3]
