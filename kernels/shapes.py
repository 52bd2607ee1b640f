"""Launch shapes of the fused RMSNorm kernel: vector width, threads per row, rows per block.

Pure Python (no CUDA): the wrapper, the policy and the CPU tests all use it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

VECTOR_BYTES = 16  # one 128-bit access per vector
MAX_ROW_FLOATS_PER_THREAD = 64  # row values a thread keeps in registers; more spills (ptxas -v, bf16 t32)
MAX_THREADS = 1024
MAX_HIDDEN = MAX_THREADS * MAX_ROW_FLOATS_PER_THREAD  # 65536: wider rows go to stock
DTYPE_IDS = {"fp32": 0, "fp16": 1, "bf16": 2}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
_NAME = re.compile(r"^t(\d+)r(\d+)$")


@dataclass(frozen=True)
class LaunchShape:
    """Threads per row (tpr) and rows per block (rpb); named 't<tpr>r<rpb>'."""

    tpr: int
    rpb: int

    def __post_init__(self) -> None:
        pow2_small = self.tpr in (4, 8, 16)
        if not (pow2_small or (self.tpr % 32 == 0 and 32 <= self.tpr <= MAX_THREADS)):
            raise ValueError(f"threads per row {self.tpr}: must be 4, 8, 16 or a multiple of 32 up to 1024")
        block = self.tpr * self.rpb
        if self.rpb < 1 or block % 32 or block > MAX_THREADS:
            raise ValueError(
                f"launch shape t{self.tpr}r{self.rpb}: block of {block} threads must be a multiple of 32, "
                f"at most {MAX_THREADS}"
            )

    @property
    def name(self) -> str:
        return f"t{self.tpr}r{self.rpb}"

    @property
    def block(self) -> int:
        return self.tpr * self.rpb

    @staticmethod
    def parse(name: str) -> "LaunchShape":
        """Parse 't<tpr>r<rpb>' (e.g. 't256r1'); ValueError naming the bad string otherwise."""
        m = _NAME.match(name)
        if not m:
            raise ValueError(f"variant {name!r}: expected 't<threads per row>r<rows per block>', e.g. 't256r1'")
        return LaunchShape(int(m.group(1)), int(m.group(2)))


def vector_width(itemsize: int, row_strides: list[int], data_ptrs: list[int]) -> int:
    """Elements per vector access: gcd of 16 bytes' worth with every row stride and pointer offset.

    Row starts of every tensor must sit on a vector boundary for the 128-bit path; the remainder of
    a row (hidden % width) is handled by the kernel's scalar tail.
    """
    vec = VECTOR_BYTES // itemsize
    for s in row_strides:
        vec = math.gcd(vec, int(s))
    for p in data_ptrs:
        vec = math.gcd(vec, int(p) // itemsize if int(p) % itemsize == 0 else 1)
    return max(vec, 1)


def iters_needed(hidden: int, vec: int, tpr: int) -> int:
    """Vectors each thread holds so that tpr threads cover the vector part of a row."""
    nvec = hidden // vec
    return max(1, -(-nvec // tpr))


def shape_fits(shape: LaunchShape, hidden: int, vec: int) -> str | None:
    """None if the shape can run this row width, else the reason it cannot."""
    if hidden < 1:
        return f"hidden size {hidden} < 1"
    if hidden > MAX_HIDDEN:
        return f"hidden size {hidden} > {MAX_HIDDEN}, the widest row the fused kernel keeps in registers"
    iters = iters_needed(hidden, vec, shape.tpr)
    if iters * vec > MAX_ROW_FLOATS_PER_THREAD:
        return (
            f"{shape.name} needs {iters * vec} row values per thread at hidden {hidden} "
            f"(limit {MAX_ROW_FLOATS_PER_THREAD}); use more threads per row"
        )
    if hidden % vec >= shape.tpr:
        return f"{shape.name}: scalar tail of {hidden % vec} needs more than {shape.tpr} threads per row"
    return None


def _threads_for(count: int) -> int:
    """Smallest allowed threads-per-row value >= count."""
    if count <= 16:
        return max(4, 1 << (max(count, 1) - 1).bit_length())
    return min(MAX_THREADS, -(-count // 32) * 32)


def auto_shape(rows: int, hidden: int, vec: int, sms: int = 132) -> LaunchShape:
    """Launch shape chosen from the shape alone.

    One vector per thread (a row spread over up to 1024 threads): measured on the H200
    (kernels/results/h200.json of 2026-12-02, first run), t256r1 at 8192 x 2048 bf16 took 22.1 us
    against 26.0 us for 4 vectors per thread (t64r2) and 36.7 us for 8 (t32r4); at 512 rows 3.12 vs
    3.30 us (2 per thread). Fewer registers per thread give more resident warps to hide latency.
    Narrow rows share a block (128 threads) unless that leaves fewer blocks than multiprocessors.
    `rows` only sets rows per block.
    """
    nvec = max(1, hidden // vec)
    tpr = _threads_for(nvec)
    while iters_needed(hidden, vec, tpr) * vec > MAX_ROW_FLOATS_PER_THREAD and tpr < MAX_THREADS:
        tpr = _threads_for(tpr * 2)
    tpr = max(tpr, _threads_for(hidden % vec + 1) if hidden % vec else tpr)
    min_rpb = max(1, 32 // tpr)
    max_rpb = max(min_rpb, 128 // tpr)
    want = max(1, -(-rows // sms))
    rpb = min(max_rpb, max(min_rpb, want))
    while (tpr * rpb) % 32:
        rpb += 1
    return LaunchShape(tpr, rpb)
