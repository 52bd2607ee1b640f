"""Per-kernel step time of two engines from committed raw-steps files (the engine-pair GEMM finding)."""

from __future__ import annotations

from pathlib import Path

from integration.proof.profiles import PROJECT_ROOT
from research import kerneldiff

PAIRS = PROJECT_ROOT / "integration/results/h200-llama8b-pairs-2026-12-05"
GEMM = "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT"


def test_the_slower_gemm_falls_on_stock_in_one_pair_and_on_patched_in_the_other() -> None:
    us = {}
    for pair in ("pair5", "pair6"):
        for arm in ("stock-compiled", "patched-compiled"):
            us[pair, arm] = kerneldiff.step_kernels(PAIRS / pair / "raw-steps.json.xz", arm, 1)[GEMM][1]
    assert round(us["pair5", "stock-compiled"]) == 1935 and round(us["pair5", "patched-compiled"]) == 1880
    assert round(us["pair6", "stock-compiled"]) == 1884 and round(us["pair6", "patched-compiled"]) == 1932
    rows = kerneldiff.diff(kerneldiff.step_kernels(PAIRS / "pair5/raw-steps.json.xz", "stock-compiled", 1),
                           kerneldiff.step_kernels(PAIRS / "pair5/raw-steps.json.xz", "patched-compiled", 1))
    assert rows[0]["kernel"] == "rmsnorm_kernel" and rows[0]["calls_b"] == 65 and rows[0]["calls_a"] == 0


def test_cli_names_a_missing_arm_size_or_file(tmp_path: Path, capsys) -> None:
    f = str(PAIRS / "pair6/raw-steps.json.xz")
    assert kerneldiff.main([f + ":stock-compiled", f + ":patched-compiled", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 tokens: kernel time per step") and len(out.splitlines()) == 4
    assert kerneldiff.main([f + ":nope", f + ":stock-compiled"]) == 2
    assert "no arm 'nope' (has stock-compiled, patched-compiled)" in capsys.readouterr().err
    assert kerneldiff.main([f + ":stock-compiled", f + ":stock-compiled", "--batch-tokens", "3"]) == 2
    assert "no traced step of 3 tokens" in capsys.readouterr().err
    assert kerneldiff.main([str(tmp_path / "x.json") + ":stock", f + ":stock-compiled"]) == 2
    assert "no such raw-steps file" in capsys.readouterr().err
