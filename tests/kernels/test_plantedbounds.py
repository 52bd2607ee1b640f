"""The planted build of the fused kernel: bounds and flags everywhere; on a GPU, same output and the delay."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernels import plantedbounds, rmsnorm
from kernels.plans import build_key, launch_shape

NO_GPU = not torch.cuda.is_available() or importlib.util.find_spec("cupy") is None


@pytest.mark.parametrize("ns", [0, -5, plantedbounds.MAX_NS + 1, 2.5, True, "100"])
def test_delays_outside_the_control_are_refused(ns: object) -> None:
    with pytest.raises(ValueError, match="planted delay"):
        plantedbounds.check_ns(ns)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="planted delay"):
        rmsnorm.planted(ns)  # type: ignore[arg-type]


def test_delays_inside_are_kept() -> None:
    top = plantedbounds.MAX_NS
    assert plantedbounds.check_ns(1) == 1 and plantedbounds.check_ns(top) == top


def test_a_planted_build_is_its_own_kernel_with_the_flag() -> None:
    shape = launch_shape(32, 4096, 8, None, 132)
    plain = build_key("rms_norm", "bf16", 4096, 8, shape, True, rmsnorm._flags)
    with rmsnorm.planted(500):
        built = build_key("rms_norm", "bf16", 4096, 8, shape, True, rmsnorm._flags)
    assert "-DPLANT_NS=500" in built.options() and not any("PLANT" in o for o in plain.options())
    assert built != plain and rmsnorm._flags == ()  # the block ends: plain builds again


def _graph_ms(calls: int, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> float:
    from kernels.timing import capture

    graph = capture(lambda i: rmsnorm.rms_norm(x, w, 1e-6, out=out), calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU and CuPy (cupy-cuda13x)")
@pytest.mark.parametrize("rows", [1, 32, 4096])
def test_planted_calls_write_the_same_output_and_last_at_least_their_ns(rows: int) -> None:
    # the time bound is a lower bound by construction (the last block spins until its own timer has
    # advanced ns), so a busy machine can only make the replay slower, never make this fail
    ns = 20000
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    plain, spun = torch.empty_like(x), torch.empty_like(x)
    rmsnorm.rms_norm(x, w, 1e-6, out=plain)
    with rmsnorm.planted(ns):
        rmsnorm.rms_norm(x, w, 1e-6, out=spun)
        assert _graph_ms(10, x, w, spun) * 1e6 >= 10 * ns
    torch.cuda.synchronize()
    assert torch.equal(plain, spun)
