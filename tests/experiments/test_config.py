"""RunConfig validation and the CLI's flag handling: every bad value fails with the flag named."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from experiments.core.slo import DEFAULT_SLO_FILE, load_slo_file
from experiments.runner import cli as run_cli
from experiments.runner import config, instances, placement, readiness, resident
from experiments.runner.config import GIB, ConfigError, RunConfig, arm_labels, make_config

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "chat.jsonl"


@pytest.fixture(scope="module")
def cpu_cfg() -> RunConfig:
    return make_config(TRACE, "cpu")


def test_cpu_defaults_are_the_embedded_run(cpu_cfg: RunConfig) -> None:
    assert cpu_cfg.model_dir.name == "tiny-llama" and cpu_cfg.dtype == "float32"
    assert cpu_cfg.max_input_tokens == 1024 and cpu_cfg.max_output_tokens == 32
    assert cpu_cfg.kv_cache_memory_bytes == GIB and cpu_cfg.gpu_memory_utilization is None
    assert cpu_cfg.labels == ("stock", "patched")
    assert cpu_cfg.first_window_s == cpu_cfg.warmup_s


def test_to_json_is_plain_json(cpu_cfg: RunConfig) -> None:
    d = json.loads(json.dumps(cpu_cfg.to_json()))
    assert d["trace"] == str(TRACE) and d["loads"] == list(cpu_cfg.loads)
    assert d["slos"] == [s.to_json() for s in load_slo_file(DEFAULT_SLO_FILE)]  # the default tiers, whole


def test_aa_labels_are_unique() -> None:
    assert arm_labels(("stock", "stock")) == ("stock-a", "stock-b")
    assert arm_labels(("stock", "patched")) == ("stock", "patched")
    assert arm_labels(("stock", "patched", "stock")) == ("stock", "patched", "stock-b")


def test_interleaved_aa_is_the_default_for_resident_servers() -> None:
    assert _parse("--device", "cpu").arms == ("stock", "patched", "stock")
    assert _parse("--device", "cpu").labels == ("stock", "patched", "stock-b")
    assert _parse("--device", "cpu", "--aa", "none").arms == ("stock", "patched")
    assert _parse("--device", "cpu", "--one-at-a-time").arms == ("stock", "patched")
    both = _parse("--device", "cpu", "--one-at-a-time", "--aa", "interleaved")
    assert both.arms == ("stock", "patched", "stock")
    assert _parse("--device", "cpu", "--arms", "stock,stock").labels == ("stock-a", "stock-b")
    with pytest.raises(ConfigError, match="already holds two stock servers"):
        _parse("--device", "cpu", "--arms", "stock,stock", "--aa", "interleaved")


@pytest.mark.parametrize("change, message", [
    (dict(windows=0), "--windows must be an int >= 1"),
    (dict(window_s=-1.0), "--window-s must be a finite number > 0"),
    (dict(warmup_s=float("nan")), "--warmup-s"),
    (dict(start_s=-5.0), "--start-s"),
    (dict(loads=()), "--loads must be one or more"),
    (dict(loads=(1.0, 0.0)), "--loads must be one or more finite numbers > 0"),
    (dict(loads=(1.0, 1.0)), "--loads has duplicates"),
    (dict(arms=("stock",)), "--arm/--arms: 2 to 4 arms"),
    (dict(arms=("stock", "no-such-arm")), "--arm no-such-arm: unknown arm"),
    (dict(kv_cache_memory_bytes=GIB + 1), "whole number of GiB"),
    (dict(gpu_memory_utilization=0.4), "applies to CUDA runs only"),
    (dict(max_input_tokens=0), "--max-input-tokens must be an int >= 1"),
    (dict(name="../escape"), "--name"),
    (dict(model="no-such-model"), "known models"),
    (dict(trace=Path("/no/such/trace.jsonl")), "no such file"),
    (dict(one_at_a_time=True, blocks=9), "--blocks 9 exceeds --windows"),
    (dict(seed=-1), "--seed"),
    (dict(knee_factors=(2.0, 8.0), knee_max=4.0), "--knee-max 4 .default 64. is below the last --knee "
                                                  "factor 8"),
    (dict(knee_factors=(2.0, 8.0), knee_max=float("inf")), "--knee-max must be a finite number > 0"),
    (dict(knee_factors=(2.0, 8.0), knee_lateness_ms=0.0), "--knee-lateness-ms must be a finite number > 0"),
])
def test_bad_settings_name_the_flag(cpu_cfg: RunConfig, change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        dataclasses.replace(cpu_cfg, **change)


def test_cuda_without_a_gpu_is_refused() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        make_config(TRACE, "cuda")


def test_cuda_memory_share_must_leave_room_for_every_resident_server(cpu_cfg: RunConfig) -> None:
    with pytest.raises(ConfigError, match="for each of 2 resident servers exceeds the GPU; use <= 0.5"):
        dataclasses.replace(cpu_cfg, device="cuda", gpu_memory_utilization=0.9)
    with pytest.raises(ConfigError, match="3 resident servers exceeds the GPU; use <= 0.333"):
        dataclasses.replace(cpu_cfg, device="cuda", gpu_memory_utilization=0.4,
                            arms=("stock", "patched", "stock"))
    ok = dataclasses.replace(cpu_cfg, device="cuda", gpu_memory_utilization=0.9, one_at_a_time=True)
    assert ok.one_at_a_time


def _parse(*argv: str) -> RunConfig:
    return run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE), *argv]))


def test_cli_flags_reach_the_config() -> None:
    cfg = _parse("--device", "cpu", "--windows", "2", "--window-s", "7.5", "--loads", "0.5,1,3",
                 "--arms", "stock,stock", "--kv-cache-memory-bytes", "2GiB", "--max-output-tokens", "none",
                 "--slo", "fast:100:10", "--slo", "slow:1000:50:9000", "--name", "x1", "--no-eager")
    assert (cfg.windows, cfg.window_s, cfg.loads) == (2, 7.5, (0.5, 1.0, 3.0))
    assert cfg.labels == ("stock-a", "stock-b") and cfg.kv_cache_memory_bytes == 2 * GIB
    assert cfg.max_output_tokens is None and cfg.max_input_tokens == 1024
    assert [s.name for s in cfg.slos] == ["fast", "slow"] and cfg.slos[1].e2e_ms == 9000
    assert cfg.eager is False and cfg.name == "x1"
    kneed = _parse("--device", "cpu", "--knee", "1,2", "--knee-max", "16", "--knee-lateness-ms", "5")
    assert (kneed.knee_factors, kneed.knee_max, kneed.knee_lateness_ms) == ((1.0, 2.0), 16.0, 5.0)
    assert kneed.to_json()["knee_max"] == 16.0 and cfg.to_json()["knee_max"] == cfg.knee_max  # every setting


@pytest.mark.parametrize("argv", [
    ["--loads", "1,two"], ["--arms", "stock"], ["--kv-cache-memory-bytes", "20 gigs"],
    ["--windows", "three"], ["--device", "tpu"], ["--loads", "1,inf"], ["--loads", "nan"], ["--loads", "0,1"],
    ["--loads", "-2"], ["--loads", "1,5e-324"], ["--knee", "1,inf"], ["--knee", "0,2"],
])
def test_cli_rejects_malformed_values(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        run_cli.build_parser().parse_args(["--trace", str(TRACE), *argv])
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--windows", "0"], "--windows must be"),
    (["--arms", "stock,nosuch"], "--arm nosuch: unknown arm"),
    (["--slo", "bad:1"], "bad SLO"),
    (["--windows", "500", "--window-s", "60"], "ends at"),
    (["--knee-max", "32"], "--knee-max applies to a knee search, and this run has none (--knee FACTORS)"),
    (["--knee", "none", "--knee-lateness-ms", "5"], "--knee-lateness-ms applies to a knee search"),
])
def test_cli_reports_bad_flags_with_status_2(argv: list[str], message: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--results-dir", str(tmp_path), *argv])
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_help_explains_every_flag(capsys: pytest.CaptureFixture) -> None:
    parser = run_cli.build_parser()
    for action in parser._actions:
        assert action.help, f"flag {action.option_strings} has no help text"
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "--one-at-a-time" in capsys.readouterr().out


def test_dry_run_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--results-dir", str(tmp_path),
                         "--windows", "2", "--loads", "1,2", "--dry-run"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert [w["id"] for w in plan["windows"]] == [0, 1] and len(plan["schedule"]) == 4
    assert list(tmp_path.iterdir()) == []


def test_the_run_config_is_made_once_from_the_flags_and_their_decisions() -> None:
    """The clips, what fits the GPU, the instance design's windows and fuse_all from the tables are values
    the run's config is made with (cli.setup_from_args), never copies of a config with one field changed."""
    path = [run_cli.main, run_cli.setup_from_args, run_cli.flag_settings, config.make_config,
            readiness.sized, readiness.tables, instances.choose, instances.check, resident.sets,
            resident.fit_windows, placement.placement_for]
    assert [f.__qualname__ for f in path if "replace(" in inspect.getsource(f)] == []
    cfg = run_cli.config_from_args(run_cli.build_parser().parse_args(
        ["--trace", str(TRACE), "--device", "cpu", "--max-input-tokens", "none", "--instances", "3"]))
    assert cfg.max_input_tokens is None and cfg.max_output_tokens == 32  # the default clip stays
    assert cfg.windows == 6  # the default 4, rounded up to split into the 3 instances
