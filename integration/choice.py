"""What the shape policy (kernels/policy.py) picks for a call, a row range or a whole model.

vLLM lowers an IR op once per compile range under torch.compile, so a provider can only say yes or
no for a whole range of row counts there. `fused_over` answers that: the fused kernel only where the
policy picks it for every row count of the range. `stock_boundaries` gives the row counts where the
policy's fused/stock answer changes, so both arms can be compiled with ranges that end there (see
integration/README.md). Pure Python; kernels/policy.py is imported on first use.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from integration.names import (
    ALL_FUSED,
    IR_OPS,
    MAKE_TABLES,
    NONE_FUSED,
    POLICY_ENV,
    POLICY_ENV_COMPILED,
    TABLES,
)

MAX_SCAN_ROWS = 1 << 17  # a range reaching past this is declined (no policy scan that long)


class PolicyUnavailable(RuntimeError):
    """kernels/policy.py could not be imported or loaded; the message says why."""


MODES = ("compiled", "eager")
GPU_ENV = "RMSNORM_FUSED_GPU"  # whose tables to use, e.g. h200 (default: the GPU this process sees)
logger = logging.getLogger("vllm.plugins.rmsnorm_fused")


def current_gpu() -> str | None:
    """Short name of this process's GPU (kernels.environment.gpu_slug), $RMSNORM_FUSED_GPU first;
    None without one. Asks vLLM's platform (NVML: no CUDA context) where vLLM is importable."""
    if os.environ.get(GPU_ENV):
        return os.environ[GPU_ENV]
    from kernels.environment import gpu_slug

    try:
        from vllm.platforms import current_platform

        if current_platform.is_cuda():
            return gpu_slug(current_platform.get_device_name(0))
        return None
    except ImportError:
        import torch

        return gpu_slug(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None


def policy_path(mode: str, gpu: str | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The table a mode uses: $RMSNORM_FUSED_POLICY(_COMPILED) of `env` (default: this process's),
    else the in-vLLM table of this GPU (TABLES) in the runtime_tables package; None when this GPU has none."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    env = os.environ if env is None else env
    if mode == "compiled" and env.get(POLICY_ENV_COMPILED):
        return Path(env[POLICY_ENV_COMPILED])
    if env.get(POLICY_ENV):
        return Path(env[POLICY_ENV])
    gpu = gpu or current_gpu()
    if gpu is None:
        return None
    import runtime_tables

    candidate = runtime_tables.path(TABLES[mode].format(gpu=gpu))
    return candidate if candidate.is_file() else None


def _load(path: str | Path) -> Any:
    """The policy a table names: 'all' every call fused, 'none' every call declined, else the file."""
    from kernels.policy import EveryCallFused, Policy, load_policy

    if str(path) == ALL_FUSED:
        return EveryCallFused(f"{ALL_FUSED}: every call fused (fused:auto)")
    if str(path) == NONE_FUSED:
        return Policy({}, source=f"{NONE_FUSED}: every call declined (stock)")
    return load_policy(path)


@functools.cache
def policy(mode: str = "compiled") -> Any:
    """The shape policy of a mode, loaded once per process (see policy_path; $RMSNORM_FUSED_POLICY=all:
    every call fused, =none: every call declined). Where this GPU has no table, a policy that declines
    every call (stock), said once in the log with how to make one."""
    try:
        from kernels.policy import Policy
    except ImportError as exc:
        raise PolicyUnavailable(f"kernels/policy.py is not importable: {exc}") from exc
    path = policy_path(mode)
    if path is not None:
        return _load(path)
    gpu = current_gpu()
    if gpu is None:
        logger.warning("rmsnorm_fused: no CUDA GPU, so no %s policy table; cupy_fused declines every call "
                       "(stock)", mode)
        return Policy({}, source=f"none: no CUDA GPU ({mode}): every call declined (stock)")
    logger.warning("rmsnorm_fused: no %s policy table for GPU %s in runtime_tables/; cupy_fused declines "
                   "every call (stock). To make one: %s", mode, gpu, MAKE_TABLES.format(gpu=gpu))
    return Policy({}, source=f"none for {gpu} ({mode}): every call declined (stock)")


@functools.lru_cache(maxsize=65536)
def choose(op: str, dtype: str, rows: int, hidden: int, mode: str = "compiled") -> str:
    """'fused:<variant>' or 'stock' for one call shape (dtype spelled fp32/fp16/bf16)."""
    if op not in IR_OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {IR_OPS}")
    answer = policy(mode).choose(op, dtype, rows, hidden)
    if answer != "stock" and not answer.startswith("fused:"):
        raise ValueError(f"policy answered {answer!r} for {op} {dtype} rows={rows} hidden={hidden}; "
                         "expected 'stock' or 'fused:<variant>'")
    return answer


def variant_of(answer: str) -> str | None:
    """The launch variant named by a 'fused:<variant>' answer (None for 'fused:' or 'fused:auto')."""
    v = answer.split(":", 1)[1] if ":" in answer else ""
    return None if v in ("", "auto") else v


@functools.lru_cache(maxsize=4096)
def fused_over(op: str, dtype: str, lo: int, hi: int, hidden: int, mode: str = "compiled") -> bool:
    """True when the policy picks the fused kernel for every row count in [lo, hi]."""
    if lo < 1 or hi < lo or hi > MAX_SCAN_ROWS:
        return False
    return all(choose(op, dtype, rows, hidden, mode) != "stock" for rows in range(lo, hi + 1))


def _runs(fused: Callable[[int], bool], max_rows: int) -> list[tuple[int, int, bool]]:
    out: list[tuple[int, int, bool]] = []
    for rows in range(1, max_rows + 1):
        f = fused(rows)
        if out and out[-1][2] == f:
            out[-1] = (out[-1][0], rows, f)
        else:
            out.append((rows, rows, f))
    return out


def segments(op: str, dtype: str, hidden: int, max_rows: int,
             mode: str = "compiled") -> list[tuple[int, int, bool]]:
    """Maximal row ranges [lo, hi] over 1..max_rows with one answer each: (lo, hi, fused)."""
    return _runs(lambda rows: choose(op, dtype, rows, hidden, mode) != "stock", max_rows)


def stock_boundaries(dtype: str, hidden: int, max_rows: int) -> list[int]:
    """Row counts after which the compiled-mode fused/stock answer of either op changes (compile
    range ends)."""
    ends: set[int] = set()
    for op in IR_OPS:
        ends.update(hi for _, hi, _ in segments(op, dtype, hidden, max_rows, "compiled")[:-1])
    return sorted(ends)


def head_boundaries(dtype: str, width: int, heads: Sequence[int], max_tokens: int) -> list[int]:
    """Token counts after which a head norm's compiled-mode answer changes (compile range ends): a
    [tokens, heads, width] call has tokens x heads rows, so a row boundary b ends a range at
    b // heads tokens, for each head count (q and kv heads norm separately)."""
    ends: set[int] = set()
    for h in heads:
        tokens = (b // h for b in stock_boundaries(dtype, width, max_tokens * h))
        ends.update(t for t in tokens if 1 <= t < max_tokens)
    return sorted(ends)


def policy_record(dtype: str, hidden: int, mode: str = "compiled", max_rows: int = 16384,
                  table: str | Path | None = None) -> dict:
    """What a patched arm's policy picks for one model shape, for a run record: the table's path
    and, per op, the row ranges [lo, hi, fused] over 1..max_rows (read by experiments' attribution).
    `table`: a policy file (or 'all', 'none') to describe instead of the mode's own (choice.policy_path)."""
    from common.jsonfile import project_relative

    pol = policy(mode) if table is None else _load(table)
    segs = {op: [list(r) for r in _runs(lambda rows, op=op: pol.choose(op, dtype, rows, hidden) != "stock",
                                          max_rows)] for op in IR_OPS}
    # the table relative to the project, so a run record names the same file on another machine
    table_shown = project_relative(pol.source, Path(__file__).resolve().parents[1])
    return {"mode": mode, "table": table_shown, "dtype": dtype, "hidden": hidden, "segments": segs}

