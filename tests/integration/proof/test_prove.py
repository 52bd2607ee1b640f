"""integration.proof.prove's turn order and integration.proof.launchcost's refusal without a GPU."""

from __future__ import annotations

import pytest
import torch

from integration.proof import launchcost, prove


def test_each_profiled_mode_takes_ab_ba_turns_one_engine_at_a_time() -> None:
    runs = prove.arm_runs(prove.parse_args(["--out", "x"]))
    assert prove.round_order(runs, ["compiled", "eager"]) == [
        ("stock-compiled", 1), ("patched-compiled", 1), ("patched-compiled", 2), ("stock-compiled", 2),
        ("stock-eager", 1), ("patched-eager", 1), ("patched-eager", 2), ("stock-eager", 2)]
    assert prove.round_order(runs, []) == []


def test_a_planted_arm_joins_the_compiled_turns_and_the_order_reverses_every_round(tmp_path) -> None:  # noqa: ANN001
    a = prove.parse_args(["--out", str(tmp_path), "--modes", "compiled", "--planted", "planted:500ns",
                          "--rounds", "3", "--graph-replays", "50"])
    runs = prove.arm_runs(a)
    assert runs == [("stock", "compiled"), ("patched", "compiled"), ("planted:500ns", "compiled")]
    names = ["stock-compiled", "patched-compiled", "planted:500ns-compiled"]
    assert prove.round_order(runs, ["compiled"], 3) == (
        [(n, 1) for n in names] + [(n, 2) for n in names[::-1]] + [(n, 3) for n in names])
    cmd = prove.worker_cmd(a, "planted:500ns", "compiled", tmp_path, [])
    assert cmd[cmd.index("--rounds") + 1] == "3" and cmd[cmd.index("--graph-replays") + 1] == "50"


def test_stock_engines_keep_vllms_single_compile_range_unless_shared(tmp_path) -> None:  # noqa: ANN001
    def ranges(argv: list[str], arm: str) -> str:
        a = prove.parse_args(["--out", str(tmp_path), *argv])
        cmd = prove.worker_cmd(a, arm, "compiled", tmp_path, [32])
        return cmd[cmd.index("--compile-ranges") + 1]

    assert ranges([], "patched") == "32" and ranges([], "planted:500ns") == "32"  # patched + the delay
    assert ranges([], "stock") == ""
    assert ranges(["--shared-ranges"], "stock") == "32"


def test_only_profiled_modes_get_a_turn_file(tmp_path) -> None:  # noqa: ANN001
    a = prove.parse_args(["--out", str(tmp_path), "--profile-modes", "eager", "--prefill-sizes", "512,1024"])
    eager = prove.worker_cmd(a, "patched", "eager", tmp_path, [])
    compiled = prove.worker_cmd(a, "patched", "compiled", tmp_path, [])
    assert "--turn-file" in eager and "--turn-file" not in compiled
    assert eager[eager.index("--prefill-sizes") + 1] == "512,1024"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_launchcost_names_the_missing_gpu(tmp_path, capsys) -> None:  # noqa: ANN001
    assert launchcost.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
