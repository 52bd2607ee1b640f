"""kernels.planted: the positive control's delay kernel (bounds everywhere, the delay on a GPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernels import planted

NO_GPU = not torch.cuda.is_available() or importlib.util.find_spec("cupy") is None


@pytest.mark.parametrize("ns", [0, -5, planted.MAX_NS + 1, 2.5, True, "100"])
def test_delays_outside_the_control_are_refused(ns: object) -> None:
    with pytest.raises(ValueError, match="planted delay"):
        planted.check_ns(ns)  # type: ignore[arg-type]


def test_delays_inside_are_kept() -> None:
    assert planted.check_ns(1) == 1 and planted.check_ns(planted.MAX_NS) == planted.MAX_NS


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU and CuPy (cupy-cuda13x)")
@pytest.mark.parametrize("ns", [2000, 20000])
def test_captured_delays_last_at_least_their_ns(ns: int) -> None:
    # a lower bound by construction (the kernel spins until its own timer has advanced ns), so a
    # busy machine can only make the replay slower, never make this fail
    planted.compiled(torch.cuda.current_device())
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        planted.spin(ns)  # warm up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(10):
                planted.spin(ns)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) * 1e6 >= 10 * ns
