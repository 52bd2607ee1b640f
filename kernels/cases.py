"""Validation cases: shapes, input patterns, memory layouts with guard regions, tolerances."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

# Tolerances per storage dtype: |out - ref| <= atol + rtol * |ref|, where ref is the float64 reference
# rounded to the storage dtype (the kernel's output is in that dtype too). Values of vLLM's
# vllm/ir/tolerances.py, except fp16's rtol (see there).
TOLERANCES: dict[str, tuple[float, float]] = {
    # fp32: rsqrtf (<= 2 ulp) and fp32 sums over up to 64k terms keep the error near 1e-6 relative.
    "fp32": (1e-5, 1.3e-6),
    # fp16: the norm is rounded to fp16 before the weight (as vLLM does). Where the fp32 sum of
    # squares moves that rounding across a tie, the results differ by one ulp of the norm times the
    # weight, then the final rounding: up to 2 ulp = 2^-9 = 1.95e-3 relative. vLLM's 1e-3 held on
    # small shapes but not over 8192 x 8192 (first H200 run: tolerance ratio 1.11, 4 of 1248 cases).
    "fp16": (1e-3, 2e-3),
    # bf16: 7-bit mantissa; the same two-ulp bound is 2^-6 = 1.56e-2, under vLLM's 1.6e-2.
    "bf16": (1e-3, 1.6e-2),
}
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
INT_VIEW = {"fp32": torch.int32, "fp16": torch.int16, "bf16": torch.int16}
EPS = 1e-6
GUARD = 64  # elements of sentinel before and after every buffer the kernel may write
# "large": the biggest scale whose x + residual stays finite in the dtype (fp16 max 65504) and whose
# squares summed over 65536 columns stay finite in fp32 (vLLM's kernels share that fp32 limit).
LARGE = {"fp32": 1e4, "fp16": 2e3, "bf16": 1e4}
PATTERNS = ("normal", "zeros", "tiny", "alternating", "large")
OPS = ("rms_norm", "fused_add_rms_norm")
DTYPES = ("bf16", "fp16", "fp32")
WIDTHS = (1, 31, 33, 127, 2048, 4096, 5120, 8192, 8193)
ROWS = (1, 7, 257, 8192)


@dataclass(frozen=True)
class Case:
    """One validation case; layout 'strided' pads rows, 'offset' misaligns the base pointer, 'heads'
    is a [rows (tokens), heads, hidden] view of a buffer whose token stride is heads * hidden + pad
    (vLLM's q/k head norms over the qkv output), starting `pad` elements in (guarded gaps between
    tokens)."""

    op: str
    dtype: str
    rows: int
    hidden: int
    pattern: str = "normal"
    layout: str = "contiguous"
    variant: str | None = None
    heads: int = 1
    pad: int = 0

    @property
    def row_stride(self) -> int:
        """Elements from one token (row) to the next."""
        if self.layout == "heads":
            return self.heads * self.hidden + self.pad
        if self.layout != "strided":
            return self.hidden
        return -(-(self.hidden + 1) // 8) * 8  # padded to a multiple of 8 (keeps 16-byte rows)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the view the kernel gets."""
        return (self.rows, self.heads, self.hidden) if self.layout == "heads" else (self.rows, self.hidden)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides of that view."""
        return (self.row_stride, self.hidden, 1) if self.layout == "heads" else (self.row_stride, 1)


def full_cases() -> list[Case]:
    """The full suite: every op, dtype, width, row count and pattern, plus layouts and launch shapes."""
    cases = [Case(op, dt, r, h, p) for op, dt, h, r, p in
             itertools.product(OPS, DTYPES, WIDTHS, ROWS, PATTERNS)]
    return cases + _layout_and_variant_cases((7, 257)) + head_cases(False) + staged_loop_cases(False)


def head_cases(reduced: bool) -> list[Case]:
    """Strided 3-D [tokens, heads, head_dim] views (two strides between rows), with guarded gaps between
    tokens: head_dim 64/128/256, heads 1-64, token strides padded by nothing, 8 elements, an odd 3
    (scalar accesses), and as q of a qkv output with 8 kv heads (2 * 8 * head_dim after the q heads)."""
    full = ((64, 128, 256), (1, 2, 8, 32, 64), (1, 7, 33))
    dims, heads, tokens = ((64, 128), (1, 8), (3,)) if reduced else full
    out: list[Case] = []
    for op, dt, d, h, t in itertools.product(OPS, DTYPES, dims, heads, tokens):
        if dt != "bf16" and (h not in (1, 8, 64) or t != 7) and not reduced:
            continue
        for pad in (0, 8, 3, 16 * d):
            out.append(Case(op, dt, t, d, "normal", "heads", heads=h, pad=pad))
    return out


def reduced_cases() -> list[Case]:
    """A small suite for compute-sanitizer: few rows, all widths, both ops, all dtypes."""
    cases = [Case(op, dt, r, h, p) for op, dt, h, r, p in
             itertools.product(OPS, DTYPES, (1, 31, 33, 127, 4096, 8193), (1, 5), ("normal", "zeros"))]
    return cases + _layout_and_variant_cases((5,)) + head_cases(True) + staged_loop_cases(True)


def negative_control_cases() -> list[Case]:
    """Cases a negative control runs: eps matters for zeros/tiny, the last column for every pattern;
    at 7 rows also with a staged shape (its own code path, which the control must be caught in too)."""
    plain = [Case(op, dt, r, h, p) for op, dt, h, r, p in
             itertools.product(OPS, DTYPES, (31, 4096, 8193), (1, 7), PATTERNS)]
    return plain + [Case(op, dt, 7, h, p, variant="t256r1s") for op, dt, h, p in
                    itertools.product(OPS, DTYPES, (31, 4096, 8193), PATTERNS)]


def _layout_and_variant_cases(rows: tuple[int, ...]) -> list[Case]:
    out: list[Case] = []
    for op, dt, r in itertools.product(OPS, DTYPES, rows):
        out += [Case(op, dt, r, h, "normal", "strided") for h in (31, 33, 4096)]
        out += [Case(op, dt, r, h, "normal", "offset") for h in (33, 4096)]
        out += [Case(op, dt, r, h, "normal", variant=v) for h in (127, 2048, 4096)
                for v in ("t8r4", "t32r4", "t256r1", "t1024r1", "t64r2", "t32r4p", "t256r1p", "t512r1p",
                          "t8r4s", "t64r2s", "t256r1sp")]
        out += [Case(op, dt, r, h, "normal", "heads", v, heads=8, pad=8) for h in (64, 128)
                for v in ("t16r8p", "t32r4p", "t16r8s")]
    return out


def staged_loop_cases(reduced: bool) -> list[Case]:
    """Staged builds with more row groups than their persistent grid has CTAs, so that each CTA walks
    several groups and the next group's copies overlap the current one: t1024r1s runs 2 CTAs per
    multiprocessor (264 on 132), t128r1s 16 (a [1024 tokens, 8 heads, 128] view: 8192 rows);
    the reduced suite's 300 rows give the sanitizers two groups on some CTAs."""
    rows, widths = (300, (2048,)) if reduced else (8192, (2048, 4096, 8193))
    out = [Case(op, dt, rows, h, "normal", variant=v) for op, dt, h, v in
           itertools.product(OPS, DTYPES, widths, ("t1024r1s", "t1024r1sp"))]
    if not reduced:
        out += [Case(op, dt, 1024, 128, "normal", "heads", "t128r1s", heads=8, pad=8)
                for op, dt in itertools.product(OPS, DTYPES)]
    return out


def make_values(pattern: str, rows: int, hidden: int, dtype: str, gen: torch.Generator,
                device: torch.device) -> torch.Tensor:
    """Input values of a pattern, in the storage dtype."""
    shape = (rows, hidden)
    g = torch.randn(shape, generator=gen, device=device)
    if pattern == "normal":
        v = g
    elif pattern == "zeros":
        v = torch.zeros(shape, device=device)
    elif pattern == "tiny":
        v = g * 1e-20
    elif pattern == "alternating":
        sign = 1.0 - 2.0 * (torch.arange(hidden, device=device) % 2)
        v = (1.0 + g.abs()) * sign
    elif pattern == "large":
        v = g * LARGE[dtype]
    else:
        raise ValueError(f"pattern {pattern!r}: choose one of {PATTERNS}")
    return v.to(TORCH_DTYPES[dtype])


def make_weight(hidden: int, dtype: str, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """A non-trivial weight (1 + 0.5 N(0,1)) so that a wrong column index shows."""
    w = 1.0 + 0.5 * torch.randn((hidden,), generator=gen, device=device)
    return w.to(TORCH_DTYPES[dtype])


@dataclass
class Guarded:
    """A sentinel-filled flat buffer and the [rows, hidden] view the kernel reads or writes."""

    buf: torch.Tensor
    view: torch.Tensor
    valid: torch.Tensor  # bool mask over buf: the elements of the view
    sentinel_bits: int

    def untouched(self, int_dtype: torch.dtype) -> bool:
        """True if every element outside the view (guards and row padding) still holds the sentinel."""
        bits = self.buf.view(int_dtype)
        return bool((bits[~self.valid] == self.sentinel_bits).all())


def guarded(case: Case, device: torch.device, guard: int = GUARD) -> Guarded:
    """Allocate a buffer with `guard` sentinel elements around the rows (NaN sentinel, poisoned view);
    the gaps between rows (padded strides) hold the sentinel too."""
    front = guard + (1 if case.layout == "offset" else 0) + (case.pad if case.layout == "heads" else 0)
    body = (case.rows - 1) * case.row_stride + case.heads * case.hidden
    n = front + body + guard
    dt = TORCH_DTYPES[case.dtype]
    buf = torch.full((n,), float("nan"), dtype=dt, device=device)
    view = buf.as_strided(case.shape, case.strides, front)
    valid = torch.zeros((n,), dtype=torch.bool, device=device)
    valid.as_strided(case.shape, case.strides, front).fill_(True)
    bits = int(buf[:1].view(INT_VIEW[case.dtype]).item())
    return Guarded(buf, view, valid, bits)
