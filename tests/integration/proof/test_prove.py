"""integration.proof.prove's turn order and research.launchcost's refusal without a GPU."""

from __future__ import annotations

import sys

import pytest
import torch

from integration.proof import evidence, prove
from research import launchcost


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
    assert [(e.label, e.arm, e.mode) for e in runs] == [
        ("stock", "stock", "compiled"), ("patched", "patched", "compiled"),
        ("planted:500ns", "planted:500ns", "compiled")]
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


def test_replicas_interleave_each_compiled_arms_engines_under_their_own_labels(tmp_path) -> None:  # noqa: ANN001
    a = prove.parse_args(["--out", str(tmp_path), "--modes", "compiled", "--replicas", "2"])
    runs = prove.arm_runs(a)
    assert [e.name for e in runs] == ["stock-compiled", "patched-compiled", "stock-b-compiled",
                                      "patched-b-compiled"]
    assert prove.round_order(runs, ["compiled"], 2) == [
        ("stock-compiled", 1), ("patched-compiled", 1), ("stock-b-compiled", 1), ("patched-b-compiled", 1),
        ("patched-b-compiled", 2), ("stock-b-compiled", 2), ("patched-compiled", 2), ("stock-compiled", 2)]
    twin = runs[2]
    cmd = prove.worker_cmd(a, twin.arm, twin.mode, tmp_path, [32], twin.label)
    assert cmd[cmd.index("--arm") + 1] == "stock" and cmd[cmd.index("--label") + 1] == "stock-b"
    assert cmd[cmd.index("--turn-file") + 1] == str(tmp_path / "stock-b-compiled.go")
    assert cmd[cmd.index("--compile-ranges") + 1] == ""  # a stock replica keeps vLLM's one range
    prove.check_replicas(a)  # four engines of 20% fit


def test_a_replica_compiles_into_caches_of_its_own(tmp_path) -> None:  # noqa: ANN001
    show = [sys.executable, "-c", "import os; print(os.environ.get('VLLM_CACHE_ROOT'), "
            "os.environ.get('TORCHINDUCTOR_CACHE_DIR'))"]
    for label, log in (("stock-b", tmp_path / "b.log"), ("stock", tmp_path / "a.log")):
        prove.start(show, "stock", log, "compiled", label).wait(timeout=60)
    twin = (tmp_path / "b.log").read_text().splitlines()[-1].split()
    assert twin == [str(tmp_path / "cache-stock-b" / "vllm_cache_root"),
                    str(tmp_path / "cache-stock-b" / "torchinductor_cache_dir")]
    first = (tmp_path / "a.log").read_text().splitlines()[-1].split()
    assert "cache-stock" not in " ".join(first)  # the arm's first engine keeps the caches it always had


def test_replicas_that_cannot_fit_are_refused_with_the_flag_named(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    assert prove.main(["--out", str(out), "--replicas", "2"]) == 2  # 4 compiled + 2 eager engines
    err = capsys.readouterr().err
    assert "--replicas 2" in err and "6 engines" in err and not out.exists()
    assert prove.main(["--out", str(out), "--modes", "compiled", "--replicas", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_launchcost_names_the_missing_gpu(tmp_path, capsys) -> None:  # noqa: ANN001
    assert launchcost.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_replicas_greedy_output_is_compared_with_its_arms_first_engine() -> None:
    results = {"stock-compiled": {"arm": "stock", "mode": "compiled"},
               "stock-b-compiled": {"arm": "stock", "label": "stock-b", "mode": "compiled"},
               "patched-b-compiled": {"arm": "patched", "label": "patched-b", "mode": "compiled"},
               "stock-eager": None}
    pairs = evidence.greedy_pairs(results)
    assert pairs[:len(evidence.PAIRS)] == evidence.PAIRS
    assert pairs[len(evidence.PAIRS):] == [("stock-compiled", "stock-b-compiled"),
                                           ("patched-compiled", "patched-b-compiled")]
