"""Norm calls per step by kind: the model configs' expectations, the IR-op census, counting on traces."""

from __future__ import annotations

import json

import pytest
import torch

from integration.launcher import MODELS_DIR
from integration.proof import evidence, normcalls, prove, steptrace


@pytest.mark.parametrize(("model", "hidden", "head_dim", "layers", "head"), [
    ("llama-3.1-8b", 4096, 128, 32, False), ("llama-3.2-1b", 2048, 64, 16, False),
    ("tiny-llama", 256, 64, 2, False), ("qwen3-0.6b", 1024, 128, 28, True), ("qwen3-8b", 4096, 128, 36, True),
    ("tiny-qwen3", 256, 64, 2, True)])
def test_norms_per_forward_follow_the_layers(model: str, hidden: int, head_dim: int, layers: int,
                                             head: bool) -> None:
    shape = normcalls.norm_shape(MODELS_DIR / model)
    assert (shape.hidden, shape.head_dim, shape.layers, shape.qk_norm) == (hidden, head_dim, layers, head)
    assert shape.expected() == {"hidden": 2 * layers + 1, "head": 2 * layers if head else 0}
    by_op = shape.expected_by_op()
    assert sum(v for d in by_op.values() for v in d.values()) == sum(shape.expected().values())
    assert shape.kind(hidden) == "hidden" and shape.kind(head_dim) == ("head" if head else "other")


def test_qwen3_8b_is_the_shape_the_issue_names() -> None:
    shape = normcalls.norm_shape(MODELS_DIR / "qwen3-8b")
    assert shape.expected() == {"hidden": 73, "head": 72}
    assert (shape.q_heads, shape.kv_heads) == (32, 8) and shape.head_rows_per_token() == 40


def test_bad_configs_name_the_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        normcalls.norm_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        normcalls.norm_shape(tmp_path)
    bad = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 1}
    with pytest.raises(ValueError, match="head_dim equals hidden_size"):
        normcalls.norm_shape(bad)


def test_census_sees_a_strided_head_view_reach_the_ir_op() -> None:
    ir = pytest.importorskip("vllm.ir")
    qkv = torch.randn(5, (4 + 2 * 2) * 64)
    q = qkv[:, : 4 * 64].view(5, 4, 64)  # as Qwen3's q_norm sees it: token stride 512, head stride 64
    x, r = torch.randn(5, 256), torch.randn(5, 256)
    with normcalls.IrCensus(tag=True) as census:
        census.step(0)
        with ir.ops.rms_norm.set_priority(["native"]), ir.ops.fused_add_rms_norm.set_priority(["native"]):
            ir.ops.rms_norm(q, torch.ones(64), 1e-6)
            ir.ops.fused_add_rms_norm(x, r, torch.ones(256), 1e-6)
    assert "dispatch" not in vars(ir.ops.rms_norm) and "_inner_call" not in vars(ir.ops.rms_norm)  # restored
    head, hidden = census.records
    assert ((head["op"], head["dim"], head["width"], head["strides"])
            == ("rms_norm", 3, 64, ["512", "64", "1"]))
    assert head["provider"] == "native" and not head["fake"] and hidden["op"] == "fused_add_rms_norm"
    shape = normcalls.norm_shape(MODELS_DIR / "tiny-qwen3")
    assert census.per_step(shape)[0]["by_kind"] == {"head": 1, "hidden": 1}


def _ann(name: str, ts: float, dur: float) -> dict:
    return {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


def _launch(corr: int, ts: float, name: str = "cudaLaunchKernel") -> dict:
    return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1, "args": {"correlation": corr}}


def _kernel(corr: int, name: str, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def test_kernels_are_counted_by_the_width_of_the_call_that_launched_them() -> None:
    """An eager Qwen3-like step: a hidden norm, the q and k norms (vLLM's kernel), a fused add norm
    (ours via the driver API), and one Inductor norm replayed from a graph (untagged)."""
    ev = [_ann("step_0", 0, 100),
          _ann("norm:rms_norm:1024", 1, 4), _launch(1, 2),
          _ann("norm:rms_norm:128", 10, 4), _launch(2, 11),
          _ann("norm:rms_norm:128", 20, 4), _launch(3, 21),
          _ann("norm:fused_add_rms_norm:1024", 30, 4), _launch(4, 31, "cuLaunchKernel"),
          _launch(5, 40, "cudaGraphLaunch"), _launch(6, 50),
          _kernel(1, "void vllm::rms_norm_kernel<c10::BFloat16>(...)", 60, 2.0),
          _kernel(2, "void vllm::rms_norm_kernel<c10::BFloat16>(...)", 63, 1.5),
          _kernel(3, "void vllm::rms_norm_kernel<c10::BFloat16>(...)", 65, 1.25),
          _kernel(4, "rmsnorm_kernel", 67, 3.0),
          _kernel(5, "triton_per_fused__to_copy_mean_mul_pow_rsqrt_3", 70, 1.0),
          _kernel(6, "nvjet_gemm", 72, 9.0)]
    (st,) = steptrace.step_stats(ev)
    assert st["norm_calls"] == 5
    assert st["norm_by_width"] == {"1024": {"calls": 2, "us": 5.0}, "128": {"calls": 2, "us": 2.75},
                                   "untagged": {"calls": 1, "us": 1.0}}
    shape = normcalls.norm_shape(MODELS_DIR / "qwen3-0.6b")
    st["ir_calls"] = {"rms_norm/1024/vllm_c": 1, "rms_norm/128/vllm_c": 2,
                      "fused_add_rms_norm/1024/cupy_fused": 1}
    counts = evidence.norm_counts([st], shape)
    assert counts["kernels_by_kind"] == [{"hidden": 2, "head": 2, "untagged": 1}]
    assert counts["norm_us_by_kind"] == [{"hidden": 5.0, "head": 2.75, "untagged": 1.0}]
    assert counts["ir_calls_by_kind"] == [{"hidden": 2, "head": 2}]
    assert counts["ir_calls_match_layers"] is False  # 2 + 2 of 57 + 56


def test_the_counts_match_the_layers_only_when_every_norm_is_there() -> None:
    qwen = normcalls.norm_shape(MODELS_DIR / "qwen3-0.6b")
    llama = normcalls.norm_shape(MODELS_DIR / "llama-3.2-1b")
    full = {"ir_calls": {"rms_norm/1024/native": 1, "rms_norm/128/native": 56,
                         "fused_add_rms_norm/1024/native": 56}}
    assert evidence.norm_counts([full, full], qwen)["ir_calls_match_layers"] is True
    short = {"ir_calls": {**full["ir_calls"], "rms_norm/128/native": 55}}
    assert evidence.norm_counts([full, short], qwen)["ir_calls_match_layers"] is False
    llama_step = {"ir_calls": {"rms_norm/2048/vllm_c": 1, "fused_add_rms_norm/2048/vllm_c": 32}}
    assert evidence.norm_counts([llama_step], llama)["ir_calls_match_layers"] is True
    assert evidence.norm_counts([{"ir_calls": {}}], qwen)["ir_calls_match_layers"] is None  # compiled
    assert normcalls.check({"hidden": 57, "head": 56, "other": 1}, qwen)["matches"] is False


@pytest.mark.e2e
@pytest.mark.parametrize("model", ["qwen3-0.6b", "qwen3-8b", "llama-3.2-1b"])
def test_prove_dry_run_checks_the_model_and_starts_nothing(model: str, tmp_path, capsys) -> None:
    rc = prove.main(["--out", str(tmp_path / "out"), "--model", str(MODELS_DIR / model), "--dry-run"])
    assert rc == 0 and not (tmp_path / "out").exists()
    plan = json.loads(capsys.readouterr().out)
    assert plan["norms_per_forward"] == normcalls.norm_shape(MODELS_DIR / model).expected()
    assert set(plan["worker_commands"]) == {"stock-compiled", "patched-compiled", "stock-eager",
                                            "patched-eager"}


def test_prove_refuses_a_model_without_config(tmp_path, capsys) -> None:
    assert prove.main(["--out", str(tmp_path), "--model", str(tmp_path / "nope"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and "qwen3-0.6b" in err


def test_all_fused_covers_the_head_width_of_a_qwen3(tmp_path, monkeypatch) -> None:
    from integration import choice, names

    # select_policy sets the variable itself: setenv first, so that monkeypatch restores its absence
    monkeypatch.setenv(names.POLICY_ENV, "")
    monkeypatch.delenv(names.POLICY_ENV)
    a = prove.parse_args(["--out", str(tmp_path), "--model", str(MODELS_DIR / "qwen3-0.6b"), "--all-fused"])
    try:
        prove.select_policy(a, tmp_path)
        table = json.loads((tmp_path / "policy-all-fused.json").read_text())["table"]
    finally:
        choice.policy.cache_clear()
    assert sorted(table) == ["fused_add_rms_norm/bf16/1024", "fused_add_rms_norm/bf16/128",
                             "rms_norm/bf16/1024", "rms_norm/bf16/128"]
    a = prove.parse_args(["--out", str(tmp_path), "--model", str(MODELS_DIR / "qwen3-0.6b"),
                          "--all-fused", "hidden"])
    try:
        prove.select_policy(a, tmp_path)
        table = json.loads((tmp_path / "policy-all-fused.json").read_text())["table"]
    finally:
        choice.policy.cache_clear()
    assert sorted(table) == ["fused_add_rms_norm/bf16/1024", "rms_norm/bf16/1024"]  # head norms: stock


def _traced(ir_calls: dict, widths: dict) -> dict:
    return {"ir_calls": ir_calls, "norm_by_width": widths, "kernel_hist": {"k": [1, 1.0]},
            "gpu_busy_us": 10.0, "gpu_span_us": 10.0, "kernels": 1, "fused_from_graph": 0}


def test_profile_rows_carry_the_counts_by_kind() -> None:
    calls = {"rms_norm/1024/vllm_c": 1, "rms_norm/128/vllm_c": 56, "fused_add_rms_norm/1024/vllm_c": 56}
    widths = {"1024": {"calls": 57, "us": 114.0}, "128": {"calls": 56, "us": 84.0}}
    row = {"kind": "decode", "batch_tokens": 1, "step_wall_us": [1000.0, 1010.0],
           "traced_steps": [_traced(calls, widths), _traced(calls, widths)]}
    raw = {"model": str(MODELS_DIR / "qwen3-0.6b"), "ranges": [], "command": "test", "environment": {},
           "results": {"stock-eager": {"steps": [row]}, "patched-eager": {"steps": [row]}}}
    prof = evidence.profile_from_raw(raw, "eager")
    assert prof["norms_per_forward"] == {"hidden": 57, "head": 56}
    (step,) = prof["steps"]
    assert step["norm_calls_by_kind_stock"] == {"head": 56, "hidden": 57}
    assert step["norm_us_by_kind_patched"] == {"head": 84.0, "hidden": 114.0}
    assert step["norm_calls_match_layers_stock"] is True
