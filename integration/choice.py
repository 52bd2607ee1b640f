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
import os
from pathlib import Path
from typing import Any, Callable

from integration.arms import IR_OPS as OPS
from kernels.checks import DTYPE_NAMES

CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16",
                 "float": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}
MAX_SCAN_ROWS = 1 << 17  # a range reaching past this is declined (no policy scan that long)


class PolicyUnavailable(RuntimeError):
    """kernels/policy.py could not be imported or loaded; the message says why."""


MODES = ("compiled", "eager")
POLICY_ENV = "RMSNORM_FUSED_POLICY"  # a policy table for every mode (overrides the defaults below)
POLICY_ENV_COMPILED = "RMSNORM_FUSED_POLICY_COMPILED"  # a table for the torch.compile path only
COMPILED_TABLE = "policy-h200-in-graph.json"  # beside kernels' default table: measured in vLLM's graph
EAGER_TABLE = "policy-h200-in-vllm-eager.json"  # measured in vLLM's eager model


def policy_path(mode: str) -> Path | None:
    """The table a mode uses (None: kernels' default, best of every stock arm measured in isolation).

    Each mode prefers the table integration/ingraph.py built from timings inside vLLM when
    kernels/results has one: under torch.compile the stock arm runs Inductor's kernel inside
    vLLM's graph (COMPILED_TABLE); in eager mode vLLM's CUDA kernel, where the CPU cost of each
    call counts too (EAGER_TABLE)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if mode == "compiled" and os.environ.get(POLICY_ENV_COMPILED):
        return Path(os.environ[POLICY_ENV_COMPILED])
    if os.environ.get(POLICY_ENV):
        return Path(os.environ[POLICY_ENV])
    from kernels.policy import DEFAULT_PATH

    candidate = Path(DEFAULT_PATH).with_name(COMPILED_TABLE if mode == "compiled" else EAGER_TABLE)
    return candidate if candidate.is_file() else None


@functools.cache
def policy(mode: str = "compiled") -> Any:
    """The shape policy of a mode, loaded once per process (see policy_path)."""
    try:
        from kernels.policy import load_policy
    except ImportError as exc:
        raise PolicyUnavailable(f"kernels/policy.py is not importable: {exc}") from exc
    return load_policy(policy_path(mode))


@functools.lru_cache(maxsize=65536)
def choose(op: str, dtype: str, rows: int, hidden: int, mode: str = "compiled") -> str:
    """'fused:<variant>' or 'stock' for one call shape (dtype spelled fp32/fp16/bf16)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
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
    for op in OPS:
        ends.update(hi for _, hi, _ in segments(op, dtype, hidden, max_rows, "compiled")[:-1])
    return sorted(ends)


def model_shape(model: str | Path | dict, dtype: str = "auto") -> tuple[str, int]:
    """(dtype name, hidden size) of a model directory's config.json (or of that config as a dict),
    `dtype` overriding 'auto'."""
    if isinstance(model, dict):
        cfg, where = model, "model config"
    else:
        where = str(Path(model) / "config.json")
        cfg = json.loads(Path(where).read_text())
    if "hidden_size" not in cfg:
        raise ValueError(f"{where}: no hidden_size")
    name = (cfg.get("torch_dtype") or cfg.get("dtype") or "float32") if dtype in ("auto", None) else dtype
    if name not in CONFIG_DTYPES:
        raise ValueError(f"{where}: dtype {name!r} is not one of {sorted(CONFIG_DTYPES)}")
    return CONFIG_DTYPES[name], int(cfg["hidden_size"])


def policy_record(dtype: str, hidden: int, mode: str = "compiled", max_rows: int = 16384,
                  table: str | Path | None = None) -> dict:
    """What a patched arm's policy picks for one model shape, for a run record: the table's path
    and, per op, the row ranges [lo, hi, fused] over 1..max_rows (read by experiments' attribution).
    `table`: a policy file to describe instead of the mode's own (choice.policy_path)."""
    from kernels.policy import load_policy

    pol = load_policy(table) if table is not None else policy(mode)
    segs = {op: [list(r) for r in _runs(lambda rows, op=op: pol.choose(op, dtype, rows, hidden) != "stock",
                                          max_rows)] for op in OPS}
    return {"mode": mode, "table": str(pol.source), "dtype": dtype, "hidden": hidden, "segments": segs}
