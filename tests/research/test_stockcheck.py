"""The in-vLLM check of the isolated Inductor arm: the committed check re-derives, and the CLI records
the benchmark's L2 mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.jsonfile import read_json
from integration.proof.profiles import PROJECT_ROOT
from research import stockcheck

RESULTS = PROJECT_ROOT / "kernels/results/h200.json"


@pytest.mark.evidence
def test_the_committed_check_re_derives_from_its_results_and_profiles() -> None:
    results = read_json(RESULTS, None, "kernel results")
    committed = results["in_vllm_check"]
    profiles = committed["command"].split()[5:]
    sizes = [e for p in profiles for e in stockcheck.check(results, PROJECT_ROOT / p)]
    assert sizes == committed["sizes"]
    passed = sum(e["within_10pct"] for e in sizes)
    assert (passed, len(sizes)) == (12, 24)  # what kernels/README.md states


@pytest.mark.evidence
def test_the_warm_l2_check_re_derives_and_passes_where_the_readme_says() -> None:
    warm = PROJECT_ROOT / "kernels/results/h200-warm-l2-2026-12-05/h200-warm-l2.json"
    results = read_json(warm, None, "kernel results")
    committed = results["in_vllm_check"]
    assert committed["l2_mode"] == "warm"
    sizes = [e for p in committed["command"].split()[5:] for e in stockcheck.check(results, PROJECT_ROOT / p)]
    assert sizes == committed["sizes"]
    failed = sorted({e["rows"] for e in sizes if not e["within_10pct"]})
    missed = len(sizes) - sum(e["within_10pct"] for e in sizes)
    assert (missed, failed) == (4, [512, 1024])  # what kernels/README.md states


def test_cli_writes_the_check_with_the_l2_mode_and_names_a_bad_file(tmp_path: Path, capsys) -> None:
    profile = str(PROJECT_ROOT / "integration/results/h200-ingraph-all-fused/h200-profile.json")
    rows = [{"op": op, "dtype": "bf16", "rows": r, "hidden": 4096,
             "stock_samples_us": {"inductor": [2.0, 2.2, 2.1]}}
            for op in ("rms_norm", "fused_add_rms_norm") for r in (1, 8, 32, 64, 128, 256, 512, 1024, 2048,
                                                                  4096, 8192, 16384)]
    warm = tmp_path / "warm.json"
    warm.write_text(json.dumps({"bench": rows, "l2_mode": "warm"}))
    assert stockcheck.main(["--results", str(warm), profile]) == 0
    check = json.loads(warm.read_text())["in_vllm_check"]
    assert check["l2_mode"] == "warm" and check["tolerance"] == pytest.approx(0.10)
    one = next(e for e in check["sizes"] if e["rows"] == 1)
    assert one["isolated_inductor_us_per_call"] == pytest.approx(2.1)
    assert one["ratio"] == pytest.approx(2.1 / one["in_vllm_stock_us_per_call"])
    (tmp_path / "bad.json").write_text("{")
    assert stockcheck.main(["--results", str(tmp_path / "bad.json"), profile]) == 2
    assert capsys.readouterr().err.startswith("python -m research.stockcheck: error: ")
