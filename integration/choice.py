"""What the shape policy (kernels/policy.py) picks for a call, a row range or a whole model.

vLLM lowers an IR op once per compile range under torch.compile, so a provider can only say yes or
no for a whole range of row counts there. `fused_over` answers that: the fused kernel only where the
policy picks it for every row count of the range. `stock_boundaries` gives the row counts where the
policy's fused/stock answer changes, so both arms can be compiled with ranges that end there (see
integration/README.md). Pure Python; kernels/policy.py is imported on first use.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

OPS = ("rms_norm", "fused_add_rms_norm")
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16",
                 "float": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}
MAX_SCAN_ROWS = 1 << 17  # a range reaching past this is declined (no policy scan that long)


class PolicyUnavailable(RuntimeError):
    """kernels/policy.py could not be imported or loaded; the message says why."""


@functools.cache
def policy() -> Any:
    """The shipped shape policy, loaded once per process."""
    try:
        from kernels.policy import load_policy
    except ImportError as exc:
        raise PolicyUnavailable(f"kernels/policy.py is not importable: {exc}") from exc
    return load_policy()


@functools.lru_cache(maxsize=65536)
def choose(op: str, dtype: str, rows: int, hidden: int) -> str:
    """'fused:<variant>' or 'stock' for one call shape (dtype spelled fp32/fp16/bf16)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    answer = policy().choose(op, dtype, rows, hidden)
    if answer != "stock" and not answer.startswith("fused:"):
        raise ValueError(f"policy answered {answer!r} for {op} {dtype} rows={rows} hidden={hidden}; "
                         "expected 'stock' or 'fused:<variant>'")
    return answer


def variant_of(answer: str) -> str | None:
    """The launch variant named by a 'fused:<variant>' answer (None for 'fused:' or 'fused:auto')."""
    v = answer.split(":", 1)[1] if ":" in answer else ""
    return None if v in ("", "auto") else v


@functools.lru_cache(maxsize=4096)
def fused_over(op: str, dtype: str, lo: int, hi: int, hidden: int) -> bool:
    """True when the policy picks the fused kernel for every row count in [lo, hi]."""
    if lo < 1 or hi < lo or hi > MAX_SCAN_ROWS:
        return False
    return all(choose(op, dtype, rows, hidden) != "stock" for rows in range(lo, hi + 1))


def segments(op: str, dtype: str, hidden: int, max_rows: int) -> list[tuple[int, int, bool]]:
    """Maximal row ranges [lo, hi] over 1..max_rows with one answer each: (lo, hi, fused)."""
    out: list[tuple[int, int, bool]] = []
    for rows in range(1, max_rows + 1):
        fused = choose(op, dtype, rows, hidden) != "stock"
        if out and out[-1][2] == fused:
            out[-1] = (out[-1][0], rows, fused)
        else:
            out.append((rows, rows, fused))
    return out


def stock_boundaries(dtype: str, hidden: int, max_rows: int) -> list[int]:
    """Row counts after which the fused/stock answer of either op changes (compile range ends)."""
    ends: set[int] = set()
    for op in OPS:
        ends.update(hi for _, hi, _ in segments(op, dtype, hidden, max_rows)[:-1])
    return sorted(ends)


def model_shape(model_dir: str | Path, dtype: str = "auto") -> tuple[str, int]:
    """(dtype name, hidden size) of a model directory's config.json, `dtype` overriding 'auto'."""
    path = Path(model_dir) / "config.json"
    cfg = json.loads(path.read_text())
    if "hidden_size" not in cfg:
        raise ValueError(f"{path}: no hidden_size")
    name = (cfg.get("torch_dtype") or cfg.get("dtype") or "float32") if dtype == "auto" else dtype
    if name not in CONFIG_DTYPES:
        raise ValueError(f"{path}: dtype {name!r} is not one of {sorted(CONFIG_DTYPES)}")
    return CONFIG_DTYPES[name], int(cfg["hidden_size"])
