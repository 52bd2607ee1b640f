"""Launch planning of the fused RMSNorm, pure Python (no CUDA): what to build and how to launch it.

A call's plan is computed once per (op, dtype, shape, strides, alignment, stream, device, variant) and
cached (PlanCache, in kernels/rmsnorm.py); these functions are what a cache miss runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.checks import DTYPE_NAMES, UnsupportedInput, common_layouts
from kernels.shapes import (
    DTYPE_IDS,
    SMEM_PER_BLOCK,
    LaunchShape,
    auto_shape,
    iters_needed,
    persistent_grid,
    shape_fits,
    staged_smem_bytes,
    vector_width,
)

MAX_PLANS = 1 << 16  # launch plans kept before the cache starts afresh (a few hundred bytes each)


@dataclass(frozen=True)
class BuildKey:
    """One compiled kernel: storage dtype, op, vector width, launch shape, PDL, extra -D flags, and
    whether it is the staged (shared memory, persistent grid) build."""

    dtype: str
    fused_add: bool
    vec: int
    tpr: int
    rpb: int
    iters: int
    pdl: bool = False
    flags: tuple[str, ...] = ()
    staged: bool = False

    def options(self) -> tuple[str, ...]:
        """NVRTC options of this build."""
        defs = {
            "DTYPE_ID": DTYPE_IDS[self.dtype], "VEC": self.vec, "TPR": self.tpr, "RPB": self.rpb,
            "ITERS": self.iters, "FUSED_ADD": int(self.fused_add), "PDL": int(self.pdl),
            "STAGED": int(self.staged),
        }
        return ("-std=c++17",) + tuple(f"-D{k}={v}" for k, v in defs.items()) + tuple(
            f"-D{f}" for f in self.flags
        )


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a launch fixes: the build, grid and block, strides (out, x, residual: outer and
    inner each), rows, rows per outer step, width, and dynamic shared memory in bytes."""

    op: str
    key: BuildKey
    grid: int
    block: int
    strides: tuple[int, int, int, int, int, int]
    rows: int
    inner: int
    hidden: int
    smem: int = 0


def launch_shape(rows: int, hidden: int, vec: int, variant: str | None, sms: int) -> LaunchShape:
    """The launch shape a call runs: the named variant, or the shape-based choice; UnsupportedInput
    when that shape cannot run this width."""
    shape = LaunchShape.parse(variant) if variant else auto_shape(rows, hidden, vec, sms)
    reason = shape_fits(shape, hidden, vec)
    if reason is not None:
        raise UnsupportedInput(reason)
    return shape


def build_key(op: str, dtype: str, hidden: int, vec: int, shape: LaunchShape, pdl_ok: bool,
              flags: tuple[str, ...] = ()) -> BuildKey:
    """The build a launch shape runs; a PDL shape gets its plain build where PDL cannot launch."""
    return BuildKey(dtype, op == "fused_add_rms_norm", vec, shape.tpr, shape.rpb,
                    iters_needed(hidden, vec, shape.tpr), shape.pdl and pdl_ok, flags, shape.staged)


def plan_spec(op: str, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
              out: torch.Tensor | None, variant: str | None, sms: int, pdl_ok: bool,
              flags: tuple[str, ...] = ()) -> LaunchSpec:
    """The launch of one call, from tensor metadata and pointers only (the caller has run the input
    checks); UnsupportedInput where the launch shape cannot run the width."""
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    other = residual if residual is not None else out
    tensors = [x] + ([other] if other is not None else [])
    layouts = common_layouts(tensors)
    if layouts is None:
        raise UnsupportedInput(f"x strides {x.stride()} cannot be launched with the other tensor's")
    strides = [s for lay in layouts for s in (lay.outer_stride, lay.inner_stride)]
    vec = vector_width(x.element_size(), strides, [t.data_ptr() for t in tensors + [weight]])
    shape = launch_shape(rows, hidden, vec, variant, sms)
    key = build_key(op, DTYPE_NAMES[x.dtype], hidden, vec, shape, pdl_ok, flags)
    x_s = strides[:2]
    o_s = strides[2:4] if out is not None else [0, 0]
    r_s = strides[2:4] if residual is not None else [0, 0]
    grid, smem = -(-rows // shape.rpb) if rows else 0, 0
    if shape.staged:
        smem = staged_smem_bytes(shape, hidden, vec, x.element_size(), key.fused_add)
        if smem > SMEM_PER_BLOCK:
            raise UnsupportedInput(f"{shape.name} stages {smem} bytes of rows in shared memory at {op} "
                                   f"{DTYPE_NAMES[x.dtype]} hidden {hidden}, over the {SMEM_PER_BLOCK} a "
                                   "block can have; use fewer rows per block or an unstaged shape")
        grid = persistent_grid(grid, shape.block, smem, sms)
    return LaunchSpec(op, key, grid, shape.block, (o_s[0], o_s[1], x_s[0], x_s[1], r_s[0], r_s[1]), rows,
                      layouts[0].inner, hidden, smem)


class PlanCache:
    """Launch plans by call key; a miss is made by the caller and put back. Starts afresh (one
    counted reset) when it holds MAX_PLANS."""

    def __init__(self) -> None:
        self._plans: dict[tuple, object] = {}
        self.builds = 0
        self.resets = 0
        self.get = self._plans.get

    def put(self, key: tuple, plan: object) -> object:
        """Store and return `plan` under `key`."""
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
            self.resets += 1
        self._plans[key] = plan
        self.builds += 1
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: tuple) -> bool:
        return key in self._plans

    def clear(self) -> None:
        """Drop every plan (tests; a changed policy needs none of this: variants are in the key)."""
        self._plans.clear()
