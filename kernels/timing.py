"""One timing harness: CUDA-graph replay of many launches, timed with CUDA events."""

from __future__ import annotations

import statistics
from typing import Callable

import torch

Call = Callable[[int], object]  # call(i) launches call number i (on buffer set i % nbuf)


def capture(call: Call, n_calls: int, warmup_calls: int = 3) -> torch.cuda.CUDAGraph:
    """Run `call` eagerly (compiles, autotunes) on a side stream, then capture n_calls into a graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup_calls):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_calls):
            call(i)
    torch.cuda.synchronize()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, n_calls: int, samples: int, warm_replays: int = 2) -> list[float]:
    """Per-call microseconds of `samples` graph replays (each replay = n_calls launches)."""
    for _ in range(warm_replays):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(samples)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1000.0 / n_calls for start, end in events]


def copy_bandwidth(nbytes: int = 2 << 30, repeats: int = 20) -> dict:
    """Device-to-device copy bandwidth (bytes read + written per second), median of `repeats` copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    del src, dst
    torch.cuda.empty_cache()
    med = statistics.median(times)
    return {"bytes_per_s": 2 * nbytes / med, "buffer_bytes": nbytes, "samples_s": times}
