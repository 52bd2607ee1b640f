"""How much GPU memory a run's resident servers need, and the default GPU design that fits.

Per server: the weights (parameter count from the model's config.json x dtype size), the explicit
KV cache (the same for every server) and a measured reserve for the CUDA context, activations and
CUDA graphs. The KV cache must hold what the trace's requests need at the run's highest load
(`kv_need_tokens`). `Fit` adds them up for the servers resident at once and says whether they fit
the GPU's free memory; with sleep mode (--sleep-mode) one server is awake and each of the others holds
only what a server asleep keeps (ASLEEP_BYTES). `flags_that_fit` names the changes that would.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from traces.trace import TraceRequest

GIB = 1 << 30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# Measured per server beside the weights and the KV cache (CUDA context, activations, CUDA graphs):
# experiments/results/h200-llama8b-confirm3/server-stock-b.log.xz starts after stock and patched are
# up and reads "Initial free memory 83.12 GiB" of 139.29: (139.29 - 83.12) / 2 - 15.0 (weights) - 10.0
# (KV) = 3.09 GiB for the 8B shape, compiled, --max-model-len 16384; the 1B shape's
# (h200-llama1b-ab/server-stock-b.log.xz, 113.7 of 139.29 after two servers, 2.32 GiB weights, 8 GiB
# KV) is 2.47 GiB. The larger serves every model.
RESERVE_BYTES = int(3.1 * GIB)
MARGIN_BYTES = 1 * GIB  # left free on the GPU (fragmentation, the kit's own process)
# What a server asleep (vLLM's sleep mode, level 1: weights offloaded, KV cache discarded) still holds:
# on the H100, llama-3.1-8b with 7 GiB of KV, one server awake alone used 25,681 MiB and with a second
# asleep beside it 28,363 MiB (experiments/results/h100-llama8b-startcost/startcost.json, used_mib.one
# and sleep_cycles[].used_mib_asleep): 2.62 GiB, taken for every model.
ASLEEP_BYTES = (28_363 - 25_681) * (1 << 20)
# How long a request holds its KV cache at the run's highest load: the median TTFT plus its output
# tokens at the median TPOT of h200-llama8b-confirm3 at 8.1x (requests.jsonl.xz, phase measure).
RESIDENT_TTFT_S = 0.155
RESIDENT_TPOT_S = 0.0116
DESIGN_KV_BYTES = 10 * GIB  # the KV cache of the GPU design (confirm3's), shrunk to what fits
# Models of the GPU design, largest first: the first whose resident servers fit with the KV cache
# the trace needs is the default.
DESIGN_MODELS = ("llama-3.1-8b", "llama-3.2-1b")


@dataclass(frozen=True)
class Shape:
    """What one server of a model holds besides its KV cache, and its KV bytes per token."""

    model: str
    weight_bytes: int
    kv_bytes_per_token: int


def dtype_size(config: dict, dtype: str) -> int:
    """Bytes per element of `dtype` ('auto': the config's torch_dtype)."""
    name = (config.get("torch_dtype") or "float32") if dtype in ("auto", None) else dtype
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name!r}: expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def parameter_count(c: dict) -> int:
    """Parameters of a Llama/Qwen3-style decoder: embedding, per layer attention (q, k, v, o and
    their biases where attention_bias), q/k norms (Qwen3), MLP (gate, up, down) and two norms, the
    final norm and lm_head unless tied to the embedding."""
    hidden, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads", heads))
    head_dim = int(c.get("head_dim") or hidden // heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = hidden * (q + 2 * kv) + q * hidden
    if c.get("attention_bias"):
        attention += q + 2 * kv + hidden
    if (c.get("architectures") or [""])[0] == "Qwen3ForCausalLM":
        attention += 2 * head_dim
    layer = attention + 3 * hidden * int(c["intermediate_size"]) + 2 * hidden
    lm_head = 0 if c.get("tie_word_embeddings") else vocab * hidden
    return vocab * hidden + layers * layer + hidden + lm_head


def shape(model_dir: Path, dtype: str) -> Shape:
    """The Shape of a model directory's config.json at `dtype`."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    size = dtype_size(c, dtype)
    heads = int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    kv_token = 2 * int(c["num_hidden_layers"]) * int(c.get("num_key_value_heads", heads)) * head_dim * size
    return Shape(Path(model_dir).name, parameter_count(c) * size, kv_token)


def in_flight_tokens(reqs: Iterable[TraceRequest], load: float) -> int:
    """The most KV tokens (input + output) held at once when `reqs` arrive `load` times faster and
    each holds its tokens for RESIDENT_TTFT_S + output_tokens x RESIDENT_TPOT_S."""
    events = []
    for r in reqs:
        t, n = r.timestamp / load, r.input_tokens + r.output_tokens
        events += [(t, n), (t + RESIDENT_TTFT_S + r.output_tokens * RESIDENT_TPOT_S, -n)]
    held = most = 0
    for _, n in sorted(events, key=lambda e: (e[0], e[1])):
        held += n
        most = max(most, held)
    return most


def kv_need_tokens(stretches: Sequence[Sequence[TraceRequest]], loads: Iterable[float],
                   max_model_len: int | None) -> int:
    """KV tokens one server needs: the longest request (or --max-model-len, which vLLM's cache must
    hold) and the tokens in flight of the busiest stretch (window or warm-up) at the highest load."""
    top = max(loads)
    longest = max((r.input_tokens + r.output_tokens for s in stretches for r in s), default=1)
    busiest = max((in_flight_tokens(s, top) for s in stretches), default=0)
    return max(longest, max_model_len or 0, busiest)


@dataclass(frozen=True)
class Fit:
    """The memory of `servers` resident servers of one shape awake, and with sleep mode `asleep` more
    beside them, against the GPU's free memory."""

    shape: Shape
    servers: int
    kv_bytes: int
    need_tokens: int
    free_bytes: int
    asleep: int = 0

    @property
    def server_bytes(self) -> int:
        return self.shape.weight_bytes + self.kv_bytes + RESERVE_BYTES

    @property
    def total_bytes(self) -> int:
        return self.servers * self.server_bytes + self.asleep * ASLEEP_BYTES + MARGIN_BYTES

    @property
    def start_awake(self) -> int:
        """With sleep mode: the most of all the servers that fit awake at once, the others asleep (the
        size of a start group); 0 when not even one does."""
        n = self.servers + self.asleep
        return max((k for k in range(1, n + 1) if replace(self, servers=k, asleep=n - k).fits), default=0)

    @property
    def kv_tokens(self) -> int:
        return self.kv_bytes // self.shape.kv_bytes_per_token

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.free_bytes and self.kv_tokens >= self.need_tokens

    def why_not(self) -> str:
        """Why it does not fit ('' when it does)."""
        if self.kv_tokens < self.need_tokens:
            return (f"a KV cache of {gib(self.kv_bytes)} holds {self.kv_tokens:,} tokens of "
                    f"{self.shape.model}, the trace needs {self.need_tokens:,}")
        if self.total_bytes > self.free_bytes:
            return f"{self.describe()} need {gib(self.total_bytes)}, the GPU has {gib(self.free_bytes)} free"
        return ""

    def describe(self) -> str:
        asleep = f" and {self.asleep} asleep ({gib(ASLEEP_BYTES)} each)" if self.asleep else ""
        return (f"{self.servers} x {self.shape.model} (weights {gib(self.shape.weight_bytes)} + KV "
                f"{gib(self.kv_bytes)} + reserve {gib(RESERVE_BYTES)} = {gib(self.server_bytes)} each)"
                f"{asleep}")

    def to_json(self) -> dict:
        out = {"model": self.shape.model, "servers": self.servers, "weights_bytes": self.shape.weight_bytes,
               "kv_cache_bytes": self.kv_bytes, "reserve_bytes": RESERVE_BYTES, "margin_bytes": MARGIN_BYTES,
               "total_bytes": self.total_bytes, "free_bytes": self.free_bytes, "kv_tokens": self.kv_tokens,
               "need_tokens": self.need_tokens, "fits": self.fits}
        if self.asleep:  # sleep mode: one awake and the rest asleep, and what all awake would need
            awake = replace(self, servers=self.servers + self.asleep, asleep=0)
            out.update(asleep=self.asleep, asleep_bytes=ASLEEP_BYTES, all_awake_bytes=awake.total_bytes,
                       all_awake_fit=awake.fits, start_awake=self.start_awake)
        return out


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def need_bytes(s: Shape, need_tokens: int) -> int:
    """The KV cache that holds `need_tokens`, in whole GiB."""
    return math.ceil(need_tokens * s.kv_bytes_per_token / GIB) * GIB


def largest_kv(s: Shape, servers: int, free_bytes: int, need_tokens: int,
               cap: int = DESIGN_KV_BYTES, asleep: int = 0) -> int | None:
    """The largest whole-GiB KV cache up to `cap` (or the one the trace needs, if larger) with which
    `servers` servers fit awake (beside `asleep` asleep); None when even the one the trace needs does
    not."""
    room = (free_bytes - MARGIN_BYTES - asleep * ASLEEP_BYTES) // servers - s.weight_bytes - RESERVE_BYTES
    need = need_bytes(s, need_tokens)
    kv = min(max(cap, need), room // GIB * GIB)
    return kv if kv >= need else None


def utilization(server_bytes: int, total_bytes: int) -> float:
    """--gpu-memory-utilization of one server: its share of the GPU, rounded down to 0.01. With an
    explicit KV cache vLLM only checks at start that this share is free."""
    return max(0.01, math.floor(100 * server_bytes / total_bytes) / 100)


def awake_asleep(servers: int, sleep_mode: bool) -> tuple[int, int]:
    """(awake, asleep) of `servers` resident servers: with sleep mode one awake, the rest asleep."""
    return (1, servers - 1) if sleep_mode else (servers, 0)


def flags_that_fit(shapes: dict[str, Shape], model: str, arms: Sequence[str], aa: bool, free_bytes: int,
                   need_tokens: int, most: int = 3, sleep_mode: bool = False,
                   may_sleep: bool = True) -> list[str]:
    """Up to `most` flag sets with which a run of `arms` (plus the interleaved A/A when `aa`) fits,
    best first: the same model with fewer servers resident at once (--resident), with --sleep-mode
    (where `may_sleep`: no --resident given), no A/A, two arms, then --one-at-a-time; then each smaller
    model of `shapes` the same way; each with the KV cache that fits. A run that has --sleep-mode
    (`sleep_mode`: one server awake, the others asleep) gets the same model's no A/A and two arms."""
    n = len(arms) + aa
    layouts = [(n, "")]
    if not sleep_mode:
        layouts += [(k, f"--resident {k}") for k in range(n - 1, 1, -1)]
        layouts += [(n, "--sleep-mode")] if may_sleep else []
    if aa:
        layouts.append((len(arms), "--aa none"))
    if len(arms) > 2:
        two = f"--arms {','.join(arms[:2])}"
        layouts += [(2 + aa, two)] + ([(2, f"{two} --aa none")] if aa else [])
    if not sleep_mode:
        layouts.append((1, "--one-at-a-time"))
    models = [model] + [m for m, s in shapes.items() if s.weight_bytes < shapes[model].weight_bytes]
    out = []
    for name in models:
        for servers, flags in layouts:
            awake, asleep = awake_asleep(servers, sleep_mode or flags == "--sleep-mode")
            kv = largest_kv(shapes[name], awake, free_bytes, need_tokens, asleep=asleep)
            if kv is not None:
                words = ([f"--model {name}"] if name != model else []) + ([flags] if flags else [])
                out.append(" ".join([*words, f"--kv-cache-memory-bytes {kv // GIB}GiB"]).strip())
    return out[:most]


@functools.cache
def gpu_memory() -> tuple[int, int]:
    """(free, total) bytes of CUDA device 0 (torch.cuda.mem_get_info), asked in a child process so
    that this one holds no CUDA context (and none of the GPU's memory) while the servers run; OSError
    naming the failure when it cannot."""
    code = "import torch; print(*torch.cuda.mem_get_info(0))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"cannot read the GPU's memory (torch.cuda.mem_get_info in {sys.executable}): {why}")
    free, total = (int(x) for x in out.stdout.split())
    return free, total
