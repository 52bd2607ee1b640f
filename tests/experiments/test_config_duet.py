"""The duet layout's flags: what it needs (resident servers the kit starts, one GPU per arm), its
defaults, and how each server is pinned to its GPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from experiments.runner import cli as run_cli
from experiments.runner import duetrun
from experiments.runner.config import ConfigError, make_config
from experiments.runner.servers import server_config, visible_device

TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


def _parse(*argv: str):
    return run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE), *argv]))


def test_duet_defaults_one_slot_per_arm_and_no_interleaved_aa() -> None:
    cfg = _parse("--device", "cpu", "--layout", "duet")
    assert cfg.layout == "duet" and cfg.gpus == (0, 1) and cfg.labels == ("stock", "patched")
    aa = _parse("--device", "cpu", "--layout", "duet", "--arms", "stock,stock", "--gpus", "1,0")
    assert aa.labels == ("stock-a", "stock-b") and aa.gpus == (1, 0)
    three = _parse("--device", "cpu", "--layout", "duet", "--aa", "interleaved", "--gpus", "0,1,2")
    assert three.labels == ("stock", "patched", "stock-b") and three.gpus == (0, 1, 2)
    assert _parse("--device", "cpu").to_json()["layout"] == "turns"  # every setting recorded
    assert cfg.to_json()["layout"] == "duet" and cfg.to_json()["gpus"] == [0, 1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--one-at-a-time"], "--layout duet needs resident servers"),
    (["--endpoint", "stock=http://127.0.0.1:1", "--endpoint", "patched=http://127.0.0.1:2"],
     "cannot place servers the user started"),
    (["--knee", "1,2,4"], "no --knee"),
    (["--gpus", "0"], "2 arms (stock, patched) need 2 GPUs, one each; --gpus gives 1"),
    (["--gpus", "0,1,2"], "one GPU per arm, 2 arms"),
    (["--gpus", "1,1"], "--gpus must be distinct device indices"),
    (["--gpus", "0,-1"], "--gpus must be distinct device indices"),
    (["--aa", "interleaved", "--gpus", "0,1"], "3 arms (stock, patched, stock-b) need 3 GPUs"),
])
def test_bad_duets_are_refused_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _parse("--device", "cpu", "--layout", "duet", *argv)


def test_gpus_belong_to_the_duet_and_bad_input_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ConfigError, match="--gpus applies to --layout duet only"):
        _parse("--device", "cpu", "--gpus", "0,1")
    assert run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--layout", "duet", "--gpus", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python experiments/run.py: error: --layout duet: 2 arms")
    with pytest.raises(SystemExit) as exc:
        _parse("--device", "cpu", "--layout", "duet", "--gpus", "zero,one")
    assert exc.value.code == 2 and "expected comma-separated device indices" in capsys.readouterr().err


def test_each_server_is_pinned_to_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(TRACE, "cpu", layout="duet", gpus=(0, 1))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = dict(server_config(cfg, cfg.arm_definitions[1], 1).extra_env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in dict(server_config(cfg, cfg.arm_definitions[0]).extra_env)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # the kit itself sees two of the host's GPUs
    assert visible_device(0) == "4" and visible_device(1) == "6"
    with pytest.raises(ValueError, match="shows 2 devices"):
        visible_device(2)


def test_servers_start_a_latin_row_at_once_on_a_gpu_and_in_turn_on_cpu() -> None:
    cfg = make_config(TRACE, "cpu", layout="duet", gpus=(0, 1))
    assert duetrun.slot_keys(cfg) == ["stock@gpu0", "stock@gpu1", "patched@gpu0", "patched@gpu1"]
    cpu = duetrun.start_waves(cfg)
    assert all(len(w) == 1 for w in cpu) and len(cpu) == 4
    gpu = duetrun.start_waves(dataclasses.replace(cfg, device="cuda", eager=False))
    assert gpu == [[("stock", 0), ("patched", 1)], [("stock", 1), ("patched", 0)]]
    eager = duetrun.start_waves(dataclasses.replace(cfg, device="cuda"))  # nothing compiled: all at once
    assert eager == [[("stock", 0), ("patched", 1), ("stock", 1), ("patched", 0)]]
    # the planted twin shares patched's compile cache: it starts after patched, not beside it
    three = make_config(TRACE, "cpu", layout="duet", gpus=(0, 1, 2), arms=("stock", "patched", "planted:1us"))
    twin = dataclasses.replace(three, device="cuda", eager=False)
    assert duetrun.start_waves(twin) == [
        [("stock", 0), ("patched", 1)],
        [("planted:1us", 2), ("stock", 1), ("patched", 2), ("planted:1us", 0), ("stock", 2), ("patched", 0),
         ("planted:1us", 1)]]


def test_the_dry_run_prints_the_placements(capsys: pytest.CaptureFixture) -> None:
    assert run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--layout", "duet", "--seed", "7",
                         "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [p["placement"] for p in plan["placements"][:2]] in (
        [{"stock": 0, "patched": 1}, {"stock": 1, "patched": 0}],
        [{"stock": 1, "patched": 0}, {"stock": 0, "patched": 1}])  # the first block is a Latin square
    assert all(s["order"] == ["stock", "patched"] for s in plan["schedule"])
