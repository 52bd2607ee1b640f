"""Launch shapes of the fused RMSNorm kernel: vector width, threads per row, rows per block.

Pure Python (no CUDA): the wrapper, the policy and the CPU tests all use it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# the dtypes the kernel takes as model configs and vLLM's --dtype spell them (no torch needed, so the
# analysis can read a run's model on any machine)
CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16",
                 "float": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}

VECTOR_BYTES = 16  # one 128-bit access per vector
MAX_ROW_FLOATS_PER_THREAD = 64  # row values a thread keeps in registers; more spills (ptxas -v, bf16 t32)
MAX_THREADS = 1024
MAX_HIDDEN = MAX_THREADS * MAX_ROW_FLOATS_PER_THREAD  # 65536: wider rows go to stock
DTYPE_IDS = {"fp32": 0, "fp16": 1, "bf16": 2}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
_NAME = re.compile(r"^t(\d+)r(\d+)(s?)(p?)$")
# vectors per thread of the launch shapes the benchmark times at each grid shape; 8 was slowest of
# these at both 1 and 4096 rows x 4096 in the first v2 smoke run on the H200 (2.78 / 21.3 us against
# 1.72 / 17.5 us), so it is not timed
VECTORS_PER_THREAD = (1, 2, 4)
PDL_MAX_ROWS = 1024  # programmatic dependent launch candidates are timed up to this many rows
# Staged builds (rows through shared memory by cp.async, a persistent grid; rmsnorm_staged.cu) are
# timed from this many rows on, with these vectors per thread (the field's choice: about 8 16-byte
# vectors per thread in 128-thread CTAs). Below 256 rows a grid has at most two row groups per
# multiprocessor, so there is nothing to overlap the next group's loads with.
STAGED_MIN_ROWS = 256
STAGED_VECTORS_PER_THREAD = (4, 8)
STAGES = 2  # row groups in shared memory per CTA: the one being normalized and the next
# sm_90 (H100/H200) limits the persistent grid is sized by: shared memory per multiprocessor and per
# block (opt-in), threads and CTAs per multiprocessor. A GPU with less gets more CTAs than fit at
# once, which stays correct (the grid just runs in waves).
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK = 227 * 1024
SMEM_RESERVED_PER_CTA = 1024
THREADS_PER_SM = 2048
CTAS_PER_SM = 32


@dataclass(frozen=True)
class LaunchShape:
    """Threads per row (tpr), rows per block (rpb), programmatic dependent launch (pdl), staged
    through shared memory on a persistent grid (staged); named 't<tpr>r<rpb>[s][p]'."""

    tpr: int
    rpb: int
    pdl: bool = False
    staged: bool = False

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
        return f"t{self.tpr}r{self.rpb}" + ("s" if self.staged else "") + ("p" if self.pdl else "")

    @property
    def block(self) -> int:
        return self.tpr * self.rpb

    @staticmethod
    def parse(name: str) -> "LaunchShape":
        """Parse 't<tpr>r<rpb>[s][p]' (e.g. 't256r1', 't512r1p', 't64r2s'); ValueError naming the
        bad string otherwise."""
        m = _NAME.match(name)
        if not m:
            raise ValueError(f"variant {name!r}: expected 't<threads per row>r<rows per block>[s][p]', "
                             "e.g. 't256r1', 't512r1p' or 't64r2s'")
        return LaunchShape(int(m.group(1)), int(m.group(2)), m.group(4) == "p", m.group(3) == "s")

    def without_pdl(self) -> "LaunchShape":
        """The same shape launched without programmatic dependent launch."""
        return LaunchShape(self.tpr, self.rpb, False, self.staged)


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


def shape_for(hidden: int, vec: int, vectors_per_thread: int, pdl: bool = False,
              staged: bool = False) -> LaunchShape:
    """The launch shape giving each thread about `vectors_per_thread` vectors of a row: fewest
    threads per row that cover it, at least a warp-sized block (rows share a block of 128 threads
    when a row takes fewer), and enough threads for the scalar tail."""
    nvec = max(1, hidden // vec)
    tpr = _threads_for(-(-nvec // vectors_per_thread))
    while iters_needed(hidden, vec, tpr) * vec > MAX_ROW_FLOATS_PER_THREAD and tpr < MAX_THREADS:
        tpr = _threads_for(tpr * 2)
    if hidden % vec:
        tpr = max(tpr, _threads_for(hidden % vec + 1))
    rpb = max(1, 128 // tpr)
    while (tpr * rpb) % 32:
        rpb += 1
    return LaunchShape(tpr, rpb, pdl, staged)


def candidates(rows: int, hidden: int, vec: int) -> list[LaunchShape]:
    """Launch shapes the benchmark times at one grid shape (distinct, each able to run it):
    VECTORS_PER_THREAD vectors per thread, from STAGED_MIN_ROWS rows on also the staged builds with
    STAGED_VECTORS_PER_THREAD, each plus the same with programmatic dependent launch up to
    PDL_MAX_ROWS rows (where launch latency is a large part of a call)."""
    kinds = [(False, k) for k in VECTORS_PER_THREAD]
    kinds += [(True, k) for k in STAGED_VECTORS_PER_THREAD] if rows >= STAGED_MIN_ROWS else []
    out: list[LaunchShape] = []
    for pdl in ((False, True) if rows <= PDL_MAX_ROWS else (False,)):
        for staged, k in kinds:
            shape = shape_for(hidden, vec, k, pdl, staged)
            if shape not in out and shape_fits(shape, hidden, vec) is None:
                out.append(shape)
    return out


def staged_smem_bytes(shape: LaunchShape, hidden: int, vec: int, itemsize: int, fused_add: bool) -> int:
    """Dynamic shared memory of a staged launch: STAGES row groups of rpb rows, x (and the residual)."""
    return STAGES * shape.rpb * (2 if fused_add else 1) * (hidden // vec) * vec * itemsize


def persistent_grid(groups: int, block: int, smem: int, sms: int) -> int:
    """CTAs of a staged launch: as many as fit on the GPU at once (threads, CTAs and shared memory per
    multiprocessor), never more than there are row groups."""
    per_sm = min(THREADS_PER_SM // block, CTAS_PER_SM, SMEM_PER_SM // (smem + SMEM_RESERVED_PER_CTA))
    return min(groups, max(1, per_sm) * sms)


def auto_shape(rows: int, hidden: int, vec: int, sms: int = 132) -> LaunchShape:
    """Launch shape chosen from the shape alone, where no measured choice (policy table) names one.

    One vector per thread (a row spread over up to 1024 threads), as the first H200 run measured
    best (its benchmark h200-first-run.json.xz: t256r1 at 8192 x 2048 bf16 22.1 us against 26.0 us
    for 4 vectors per thread and 36.7 us for 8; at 512 rows 3.12 vs 3.30 us). Narrow rows share a
    block (128 threads) unless that leaves fewer blocks than multiprocessors. `rows` only sets rows
    per block. Never programmatic dependent launch: a caller that did not ask for it may write the
    weight in the kernel just before.
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
