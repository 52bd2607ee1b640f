"""experiments.runner.instances: blocks of windows per instance, what a server log says of its start,
what differs between instances, and the design chosen from the committed prior."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.core.schedule import build_schedule
from experiments.runner import instances
from experiments.runner.config import make_config
from experiments.stats import design

LOG = """$ vllm serve a
(EngineCore pid=1) INFO [kv_cache_utils.py:2177] GPU KV cache size: 81,920 tokens
(EngineCore pid=1) INFO [core.py:340] init engine (profile, ...) took 57.33 s (compilation: 30.21 s)
$ vllm serve a
(EngineCore pid=2) INFO [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, Maximum concurrency
(EngineCore pid=2) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 3.08 s
"""
NONE = {"kv_cache_tokens": None, "engine_init_s": None, "compile_s": None}


def test_blocks_of_contiguous_windows_with_the_same_arms() -> None:
    steps = build_schedule(4, (1.0, 2.0), ("stock", "patched"), seed=3)
    segs = instances.segments(steps, 2)
    assert [sorted({s.window for s in seg.steps}) for seg in segs] == [[0, 1], [2, 3]]
    assert all(seg.arms == tuple(steps[0].order) for seg in segs)
    assert [s for seg in segs for s in seg.steps] == steps


def test_engine_start_reads_the_last_start_of_the_log() -> None:
    assert instances.engine_start(LOG) == {**NONE, "kv_cache_tokens": 524288, "engine_init_s": 3.08}
    first = LOG.rsplit("$ ", 1)[0]
    assert instances.engine_start(first) == {"kv_cache_tokens": 81920, "engine_init_s": 57.33,
                                             "compile_s": 30.21}
    assert instances.engine_start("") == NONE


def test_differences_leave_out_what_always_differs() -> None:
    a = {"index": 0, "pid": 1, "ready_s": 9.0, "port": 5, "kv_cache_tokens": 10, "gpu_state": {"t": 40}}
    b = {"index": 1, "pid": 2, "ready_s": 3.0, "port": 6, "kv_cache_tokens": 10, "gpu_state": {"t": 45}}
    assert instances.differences([a, b]) == {"gpu_state.t": [40, 45], "port": [5, 6]}


@pytest.fixture
def cfg(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t * 0.25}, "input_tokens": 8, "output_tokens": 4}}\n'
                             for t in range(400)))
    return make_config(trace, "cpu", windows=4, window_s=10.0, warmup_s=0.5, loads=(1.0, 2.0, 4.0),
                       arms=("stock", "patched"))


def test_precision_picks_the_cheapest_design_from_the_prior(cfg) -> None:
    c, costs, source = instances.prior(cfg)
    assert costs.arms == 2 and costs.loads == 3 and "h200-llama8b-confirm3" in source
    want = design.design_for_precision(c, costs, 0.5, window_s=(10.0,))
    windows, n, rec = instances.choose(cfg, None, False, 0.5, None)
    assert (n, windows) == (want["instances"], want["instances"] * want["windows"])
    assert rec["run"]["half_width_pct"] == pytest.approx(want["half_width_pct"])
    assert rec["run"]["gpu_minutes"] == pytest.approx(want["gpu_minutes"])
    text = instances.describe(rec)
    assert text.startswith(f"design for --precision 0.5%: {n} instances x {want['windows']} windows") and \
        "running" not in text


def test_flags_given_win_over_the_design_and_the_cost_is_restated(cfg) -> None:
    windows, n, rec = instances.choose(cfg, 2, True, None, 30.0)
    assert (n, windows) == (2, 4) and rec["run"]["windows_per_instance"] == 2
    assert "running 2 instances x 2 windows (the flags given)" in instances.describe(rec)
    with pytest.raises(ValueError, match="--windows 4 is not a multiple of 3 instances"):
        instances.choose(cfg, 3, True, 0.5, None)
    with pytest.raises(ValueError, match="no design"):
        instances.choose(cfg, None, False, 1e-4, None)


def test_without_design_flags_nothing_changes(cfg) -> None:
    assert instances.choose(cfg, None, False, None, None) == (cfg.windows, 1, None)
    assert instances.choose(cfg, 2, True, None, None) == (cfg.windows, 2, None)


def test_a_gpu_run_has_three_instances_unless_told_otherwise(cfg) -> None:
    gpu = dataclasses.replace(cfg, device="cuda", windows=6)
    assert instances.choose(gpu, None, False, None, None) == (gpu.windows, 3, None)
    assert instances.choose(gpu, 1, True, None, None) == (gpu.windows, 1, None)
    assert instances.default_count(dataclasses.replace(gpu, one_at_a_time=True)) == 1
    with pytest.raises(ValueError, match=r"^--windows 4: a GPU run has 3 server instances per arm"):
        instances.default_count(dataclasses.replace(gpu, windows=4))


def _main(tmp_path, *flags: str):
    from experiments.runner import cli

    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t * 0.25}, "input_tokens": 8, "output_tokens": 4}}\n'
                             for t in range(8000)))
    return cli.main(["--trace", str(trace), "--device", "cpu", "--results-dir", str(tmp_path / "r"),
                     "--no-progress", *flags])


def test_cli_prints_the_design_and_its_cost_before_the_plan(tmp_path, capsys) -> None:
    assert _main(tmp_path, "--precision", "0.5", "--dry-run") == 0
    out, err = capsys.readouterr()
    assert "design for --precision 0.5%:" in err and "GPU minutes" in err
    plan = __import__("json").loads(out)
    first = err.split(": ", 1)[1]
    n, per = int(first.split(" instances")[0]), int(first.split(" x ")[1].split(" windows")[0])
    assert len(plan["windows"]) == n * per


@pytest.mark.parametrize(("flags", "message"), [
    (("--instances", "3", "--windows", "4"), "--instances 3: --windows 4 is not a multiple of it"),
    (("--instances", "2", "--one-at-a-time", "--blocks", "3"), "blocks are the instances: give --blocks 2"),
    (("--precision", "0.0001"), "no design of up to"),
    (("--budget-min", "0.01"), "do not buy 2 instance pairs"),
])
def test_cli_bad_instance_flags_get_one_line(tmp_path, capsys, flags, message) -> None:
    assert _main(tmp_path, *flags, "--dry-run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("flags", [("--instances", "0"), ("--precision", "-1"),
                                   ("--precision", "1", "--budget-min", "5")])
def test_cli_refuses_bad_values_in_one_line(tmp_path, capsys, flags) -> None:
    with pytest.raises(SystemExit) as exc:
        _main(tmp_path, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("python experiments/run.py: error: ")
