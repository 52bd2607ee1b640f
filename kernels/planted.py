"""A planted, known GPU delay: the kernel of the serving experiment's positive control.

    spin(ns)   launch one thread that busy-waits `ns` nanoseconds of GPU time (%globaltimer) on
               PyTorch's current stream; capturable in a CUDA graph once compiled (`compiled()`).

The planted arm adds one such launch after every norm call, so its steps are slower by a known,
measured amount; the experiment must detect that and the attribution must predict it. The delay
costs its `ns` plus one kernel launch (about 1 us in a CUDA graph on the H200); what a step really
gains is measured inside vLLM (integration.proof), never assumed from `ns`.
"""

from __future__ import annotations

from typing import Any

import torch

SOURCE = r"""
extern "C" __global__ void planted_delay(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
MAX_NS = 1_000_000  # a planted delay above 1 ms per call is a mistake, not a control

_FUNCTIONS: dict[int, Any] = {}
_STREAMS: dict[int, Any] = {}


def check_ns(ns: int) -> int:
    """`ns` if it is a delay this control takes (1 ns .. MAX_NS), else ValueError saying so."""
    if not isinstance(ns, int) or isinstance(ns, bool) or not 0 < ns <= MAX_NS:
        raise ValueError(f"planted delay must be an int of 1..{MAX_NS} ns, got {ns!r}")
    return ns


def compiled(device: int) -> Any:
    """The delay kernel on `device`, compiled (NVRTC) and loaded once; never inside a capture."""
    fn = _FUNCTIONS.get(device)
    if fn is None:
        import cupy

        with cupy.cuda.Device(device):
            fn = cupy.RawModule(code=SOURCE).get_function("planted_delay")
            fn.compile()
        _FUNCTIONS[device] = fn
    return fn


def spin(ns: int, device: int | None = None) -> None:
    """Busy-wait `ns` ns on the GPU, on PyTorch's current stream of `device` (default: current)."""
    import cupy

    check_ns(ns)
    device = torch.cuda.current_device() if device is None else device
    ptr = torch.cuda.current_stream(device).cuda_stream
    stream = _STREAMS.get(ptr)
    if stream is None:
        stream = _STREAMS[ptr] = cupy.cuda.ExternalStream(ptr, device)
    fn = compiled(device)
    with cupy.cuda.Device(device):
        fn((1,), (1,), (cupy.uint64(ns),), stream=stream)
