"""The planted, known GPU delay of the serving experiment's positive control: its bounds.

A planted build of the fused kernel (`kernels.rmsnorm.planted(ns)`, build flag PLANT_NS of
rmsnorm_common.cuh) spins `ns` nanoseconds of GPU time in the grid's last block after its rows, so every
norm call of the planted arm lasts about `ns` longer at any row count, inside CUDA graphs as outside,
with no extra kernel, op or launch. What a step really gains is measured inside vLLM
(integration.proof), never assumed from `ns`.
"""

from __future__ import annotations

MAX_NS = 1_000_000  # a planted delay above 1 ms per call is a mistake, not a control
PLANT_FLAG = "PLANT_NS"  # the build flag of the kernel (rmsnorm_common.cuh plant_delay)


def check_ns(ns: int) -> int:
    """`ns` if it is a delay this control takes (1 ns .. MAX_NS), else ValueError saying so."""
    if not isinstance(ns, int) or isinstance(ns, bool) or not 0 < ns <= MAX_NS:
        raise ValueError(f"planted delay must be an int of 1..{MAX_NS} ns, got {ns!r}")
    return ns


def build_flag(ns: int) -> str:
    """The -D flag of a planted build: PLANT_NS=<ns>."""
    return f"{PLANT_FLAG}={check_ns(ns)}"
