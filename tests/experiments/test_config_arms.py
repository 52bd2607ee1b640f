"""Arms as data in the experiment: --arm/--arms/--arms-file and --endpoint reach the config, every
refusal names its flag, and run.json / the report carry each arm's definition and difference."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.core.runfile import Run
from experiments.reporting.report_md import arm_lines
from experiments.runner import cli as run_cli
from experiments.runner.config import ConfigError, RunConfig, make_config
from experiments.runner.runrecord import arm_records, mode_note
from experiments.stats.plantedline import planted_lines, planted_text

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "chat.jsonl"
ARM_FILE = """
[[arm]]
name = "base"
description = "vLLM as shipped"

[[arm]]
name = "logprobs7"
description = "stock with a harmless extra flag and variable"
server_args = ["--max-logprobs=7"]
env = { VLLM_LOG_STATS_INTERVAL = "60" }

[[arm]]
name = "short-context"
server_args = ["--max-model-len=512"]
"""


@pytest.fixture
def arm_file(tmp_path: Path) -> Path:
    path = tmp_path / "arms.toml"
    path.write_text(ARM_FILE)
    return path


def _parse(*argv: str) -> RunConfig:
    return run_cli.config_from_args(run_cli.build_parser().parse_args(["--trace", str(TRACE),
                                                                       "--device", "cpu", *argv]))


def test_repeated_arm_and_the_comma_form_are_the_same_and_name_any_arm(arm_file: Path) -> None:
    a = _parse("--arm", "base", "--arm", "logprobs7", "--arms-file", str(arm_file), "--aa", "none")
    b = _parse("--arms", "base,logprobs7", "--arms-file", str(arm_file), "--aa", "none")
    assert a.arms == b.arms == ("base", "logprobs7")
    assert [x.extra_args for x in a.arm_definitions] == [(), ("--max-logprobs=7",)]
    # the interleaved A/A server is a second server of the first arm, whatever it is
    assert _parse("--arms", "base,logprobs7", "--arms-file", str(arm_file)).labels == (
        "base", "logprobs7", "base-b")
    planted = _parse("--arm", "stock", "--arm", "planted:1.5us", "--aa", "none").arm_definitions[1]
    assert planted.name == "planted:1.5us" and dict(planted.extra_env)["RMSNORM_PLANTED_NS"] == "1500"


def test_run_record_holds_each_arms_whole_definition_and_difference(arm_file: Path) -> None:
    cfg = _parse("--arms", "base,logprobs7", "--arms-file", str(arm_file), "--aa", "none")
    rec = arm_records(cfg)
    assert rec["logprobs7"]["server_args"] == ["--max-logprobs=7"]
    assert rec["logprobs7"]["env"] == {"VLLM_LOG_STATS_INTERVAL": "60"}
    assert rec["logprobs7"]["vs_baseline"] == ["+ --max-logprobs=7", "+ VLLM_LOG_STATS_INTERVAL=60"]
    assert rec["base"]["vs_baseline"] == [] and rec["base"]["endpoint"] is None
    assert mode_note(cfg) is None  # user arms on CPU are a real A/B
    assert mode_note(make_config(TRACE, "cpu")).startswith("A/A run: on CPU the patched arm")
    # the planted control is the patched provider too, but delays every call on CPU: an A/B
    assert mode_note(make_config(TRACE, "cpu", arms=("stock", "planted:400us"))) is None
    report = SimpleNamespace(arm_labels=["base", "logprobs7"], arm_definitions={
        lab: {**d, "recorded": True} for lab, d in rec.items()}, prompts={})  # the entries arm_lines reads
    text = "\n".join(arm_lines(report))
    assert "**logprobs7** (logprobs7): stock with a harmless extra flag and variable — " \
           "differs from base in: + --max-logprobs=7; + VLLM_LOG_STATS_INTERVAL=60; " \
           "started by the kit" in text


@pytest.mark.parametrize("argv, message", [
    (["--arms", "base,short-context"], "--arm short-context sets --max-model-len=512, which every arm"),
    (["--arms", "base,nosuch"], "--arm nosuch: unknown arm 'nosuch'"),
    (["--arm", "stock", "--arms", "stock,patched"], "--arms and --arm: name the arms one way"),
    (["--arms", "stock,patched", "--endpoint", "a=http://127.0.0.1:1"], "--arms and --endpoint"),
    (["--endpoint", "a=http://127.0.0.1:1", "--endpoint", "b=127.0.0.1:2"], "--endpoint endpoint URL"),
    (["--endpoint", "a=http://127.0.0.1:1", "--endpoint", "b=http://127.0.0.1:1/v1"], "given twice"),
    (["--endpoint", "a=http://127.0.0.1:1", "--endpoint", "b=http://127.0.0.1:2", "--aa", "interleaved"],
     "--aa interleaved: the kit starts no server with --endpoint"),
    (["--endpoint", "a=http://127.0.0.1:1", "--endpoint", "b=http://127.0.0.1:2", "--one-at-a-time"],
     "--one-at-a-time does not apply"),
])
def test_bad_arm_flags_exit_2_with_one_line_naming_the_flag(argv: list[str], message: str,
                                                             arm_file: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--results-dir", str(tmp_path / "r"),
                         "--arms-file", str(arm_file), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_a_shared_flag_runs_when_allowed_and_is_named(arm_file: Path) -> None:
    cfg = _parse("--arms", "base,short-context", "--arms-file", str(arm_file), "--allow-arm-differences",
                 "--aa", "none")
    assert arm_records(cfg)["short-context"]["shared_flags_set"] == ["--max-model-len=512"]


@pytest.mark.parametrize("text, message", [
    ("[[arm]]\nname = 'x'\nport = 3\n", "[[arm]] #1: needs a name and only the keys"),
    ("[[arm]]\nname = 'x'\n[[arm]]\nname = 'x'\n", "[[arm]] #2: name 'x' is taken"),
    ("[[arm]\n", "not valid TOML"),
    ("[[arm]]\nname = 'x'\nprovider = 'nosuch'\n", "[[arm]] #1 (x): provider 'nosuch' is none of vLLM's"),
    ("[[arm]]\nname = 'x'\nprovider = 'cupy_fused'\n", "#1 (x): provider 'cupy_fused' needs plugins"),
    ("[[arm]]\nname = 'x'\nplugins = ['nosuch']\n", "#1 (x): the vLLM plugin entry point(s) ['nosuch']"),
    ('[[arm]]\nname = "x"\nenv = { "A=B" = "1" }\n', "#1 (x): env key 'A=B' cannot name"),
    ('[[arm]]\nname = "x"\nenv = { "A\\u0000B" = "1" }\n', "#1 (x): env key 'A\\x00B' cannot name"),
    ('[[arm]]\nname = "x"\nenv = { A = "1\\u0000" }\n', "#1 (x): env A holds a NUL byte"),
])
def test_a_bad_arms_file_is_named(text: str, message: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--results-dir", str(tmp_path / "r"),
                         "--arms-file", str(bad), "--arms", "stock,x", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and f"--arms-file {bad}" in err and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_endpoints_name_the_arms_and_may_declare_unknown_ones() -> None:
    cfg = _parse("--endpoint", "stock=http://127.0.0.1:8001/v1", "--endpoint", "mine=http://127.0.0.1:8002")
    assert cfg.arms == ("stock", "mine") and cfg.labels == ("stock", "mine")
    assert cfg.arm_definitions[1].description.startswith("declared by the user")
    rec = arm_records(cfg)
    assert (rec["mine"]["endpoint"] == "http://127.0.0.1:8002"
            and "what the user declared" in rec["mine"]["identity"])
    with pytest.raises(ConfigError, match="every arm needs one"):
        make_config(TRACE, "cpu", arms=("stock", "mine"), endpoints=("http://127.0.0.1:8001",))


def _planted_run(ci: list[float] | None) -> tuple[Run, list, dict]:
    cfg = make_config(TRACE, "cpu", arms=("stock", "planted:200us"))
    run = Run(arm_labels=list(cfg.labels), arms=list(cfg.arms), arm_definitions=arm_records(cfg),
              model={"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                "num_hidden_layers": 2, "num_attention_heads": 4}})
    latency = [{"arm": "stock", "load": 1.0, "tpot_p50_ms": 4.0},
               {"arm": "stock", "load": 4.0, "tpot_p50_ms": 16.0},
               {"arm": "planted:200us", "load": 1.0, "tpot_p50_ms": 5.0}]
    paired = {"planted:200us": {"tpot_ms": {"estimate_pct": 15.0, "ci95_pct": ci, "reason": "one cell"}}}
    return run, latency, paired


def test_planted_prediction_from_the_baselines_tpot_and_the_norm_calls() -> None:
    run, latency, paired = _planted_run([12.0, 18.0])
    (p,) = planted_lines(run, latency, paired, {"status": "cpu"})
    # 200 us x 5 norm calls = 1 ms per step: +25% at 4 ms, +6.25% at 16 ms, averaged in log space
    expected = 100 * ((1.25 * 1.0625) ** 0.5 - 1)
    assert p["norm_calls_per_step"] == 5 and p["predicted_pct"] == pytest.approx(expected)
    assert p["detected"] is True and p["prediction_inside"] is True
    assert "— detected, prediction inside the interval" in planted_text(p)
    profiled = planted_lines(run, latency, paired, {"profile": "p.json", "histogram_arm": "stock",
                                                    "profile_detail": {"by_bucket": [
                                                        {"steps": 3, "step_us": 5000.0},
                                                        {"steps": 1, "step_us": 9000.0}]}})[0]
    # the step time is the baseline's TPOT, what the paired estimate divides by, not a step profile
    assert profiled["predicted_pct"] == pytest.approx(expected) and "median TPOT" in profiled["step_source"]
    run, latency, paired = _planted_run([-1.0, 3.0])
    (p,) = planted_lines(run, latency, paired, {})
    assert p["detected"] is False and "NOT detected" in planted_text(p)
    run, latency, paired = _planted_run(None)
    (p,) = planted_lines(run, latency, paired, {})
    assert p["detected"] is None and "no interval (one cell)" in planted_text(p)


@pytest.mark.parametrize("argv, named", [
    (["--server-arg=--host=0.0.0.0"], "--server-arg --host=0.0.0.0"),
    (["--server-arg=--hos", "--server-arg=0.0.0.0"], "--server-arg --hos"),
    (["--server-arg=--po=8000"], "--server-arg --po=8000"),
    (["--arms", "stock,listens", "--arms-file", "listens.toml"], "#1 (listens): server_args --hos=0.0.0.0"),
])
def test_no_flag_or_arm_moves_a_server_off_127_0_0_1_even_when_arms_may_differ(
        argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "listens.toml").write_text('[[arm]]\nname = "listens"\nserver_args = ["--hos=0.0.0.0"]\n')
    argv = [str(tmp_path / a) if a.endswith(".toml") else a for a in argv]
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--results-dir", str(tmp_path / "r"),
                         "--allow-arm-differences", "--dry-run", *argv])
    err = capsys.readouterr().err
    assert code == 2 and named in err and "127.0.0.1 only" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, named", [
    (["--arms", "base,abbreviated"], "--arm abbreviated sets --max-model=4096, which every arm"),
    (["--arms", "base,tp"], "--arm tp sets -tp, which every arm"),
    (["--server-arg=--max-model-len=4096"], "--server-arg --max-model-len=4096: sets what the run sets"),
    (["--server-arg=--max-model=4096"], "--server-arg --max-model=4096: sets what the run sets"),
    (["--server-arg=--ir-op-priority.rms_norm=vllm_c"], "--server-arg --ir-op-priority.rms_norm=vllm_c:"),
])
def test_a_flag_every_arm_shares_or_the_run_sets_is_refused_in_any_spelling(
        argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    arms_file = tmp_path / "arms.toml"
    arms_file.write_text(ARM_FILE + '[[arm]]\nname = "abbreviated"\nserver_args = ["--max-model=4096"]\n'
                         '[[arm]]\nname = "tp"\nserver_args = ["-tp", "2"]\n')
    code = run_cli.main(["--trace", str(TRACE), "--device", "cpu", "--results-dir", str(tmp_path / "r"),
                         "--arms-file", str(arms_file), "--dry-run", *argv])
    err = capsys.readouterr().err
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert _parse("--server-arg=--tensor-parallel-size=2").extra_server_args == ("--tensor-parallel-size=2",)


def test_only_the_config_resolves_a_run_arm_from_its_name() -> None:
    """An arm's name becomes its Arm in one place, config.resolve_arms, as the config is made; the runner
    and the launcher read cfg.arm_definitions, cfg.arms_by_label or the Arm a ServerConfig holds."""
    files = [*sorted((REPO / "experiments" / "runner").glob("*.py")),
             *(REPO / "integration" / f for f in ("launcher.py", "endpoint.py"))]
    pattern = (r"\b(arms|arm_defs)\.get\(|from integration\.arms import .*\bget\b"
               r"|zip\([^)]*labels[^)]*arm_definitions")
    found = [f"{p.relative_to(REPO)}:{i}" for p in files
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(pattern, line)]
    assert {f.rsplit(":", 1)[0] for f in found} == {"experiments/runner/config.py"}, found
    cfg = make_config(TRACE, "cpu", arms=("stock", "patched", "stock"), fuse_all=True)
    assert [(label, arm.name) for label, arm in cfg.arms_by_label] == [
        ("stock", "stock"), ("patched", "patched"), ("stock-b", "stock")]
