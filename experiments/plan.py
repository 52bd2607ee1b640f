"""Everything decided before a server starts: the trace read and checked, windows cut, schedule built.

Windows are consecutive stretches of trace time: window i covers
[start_s + i * window_s, start_s + (i + 1) * window_s). At load k the same requests are replayed k
times faster (the replay lasts window_s / k). The warm-up is the warmup_s of trace just before the
first window when there is room (start_s >= warmup_s), else the warmup_s just after the last one,
replayed at the highest --loads factor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.config import ConfigError, RunConfig
from experiments.schedule import Step, build_schedule
from loadgen.replay import clip_tokens
from traces.trace import TraceError, TraceRequest, file_sha256, load_trace, time_window


@dataclass(frozen=True)
class Window:
    """One measured stretch of the trace, rebased to start at 0."""

    id: int
    start_s: float
    duration_s: float
    requests: tuple[TraceRequest, ...]

    def to_json(self) -> dict:
        return {"id": self.id, "start_s": self.start_s, "duration_s": self.duration_s,
                "requests": len(self.requests)}


@dataclass
class Plan:
    """The checked inputs of a run."""

    cfg: RunConfig
    trace_requests: int  # in the whole trace file
    trace_sha256: str
    windows: tuple[Window, ...]
    warmup: tuple[TraceRequest, ...]
    warmup_start_s: float
    warmup_duration_s: float
    warmup_load: float
    steps: list[Step]
    model_config: dict
    clipped_requests: int  # measured or warm-up requests whose token counts the clip changed

    @property
    def vocab_size(self) -> int:
        return int(self.model_config.get("vocab_size", 32000))


def _warmup_span(cfg: RunConfig, last_end: float) -> float:
    first = cfg.first_window_s
    return first - cfg.warmup_s if first >= cfg.warmup_s else last_end


def _check_lengths(cfg: RunConfig, reqs: list[TraceRequest], spans: list[tuple[float, float]]) -> None:
    """Raise TraceError (path:line) for a used request longer than --max-model-len."""
    if cfg.max_model_len is None:
        return
    for i, r in enumerate(reqs):
        used = any(lo <= r.timestamp < hi for lo, hi in spans)
        if used and r.input_tokens + r.output_tokens > cfg.max_model_len:
            raise TraceError(
                f"{cfg.trace}:{i + 1}: input_tokens + output_tokens = {r.input_tokens + r.output_tokens} "
                f"(after clipping) exceeds --max-model-len {cfg.max_model_len}; raise it or clip with "
                "--max-input-tokens/--max-output-tokens")


def prepare(cfg: RunConfig) -> Plan:
    """Read and check the trace, cut windows and warm-up, build the schedule.

    Raises TraceError (file:line) for a bad trace and ConfigError for windows the trace cannot fill.
    """
    original = load_trace(cfg.trace)
    reqs = clip_tokens(original, cfg.max_input_tokens, cfg.max_output_tokens)
    first, w = cfg.first_window_s, cfg.window_s
    last_end = first + cfg.windows * w
    trace_end = original[-1].timestamp
    if last_end > trace_end:
        raise ConfigError(f"{cfg.windows} windows of {w:g} s from --start-s {first:g} end at {last_end:g} s, "
                          f"but the trace {cfg.trace} ends at {trace_end:g} s; use fewer or shorter windows")
    windows = []
    for i in range(cfg.windows):
        got = time_window(reqs, first + i * w, w)
        if not got:
            raise ConfigError(f"window {i} [{first + i * w:g}, {first + (i + 1) * w:g}) s of {cfg.trace} "
                              "has no requests; choose other windows (--start-s, --window-s)")
        windows.append(Window(i, first + i * w, w, tuple(got)))
    warm_start = _warmup_span(cfg, last_end)
    warmup = tuple(time_window(reqs, warm_start, cfg.warmup_s)) if cfg.warmup_s > 0 else ()
    if cfg.warmup_s > 0 and not warmup:
        raise ConfigError(f"the warm-up stretch [{warm_start:g}, {warm_start + cfg.warmup_s:g}) s of "
                          f"{cfg.trace} has no requests; change --warmup-s or --start-s")
    spans = [(first, last_end)] + ([(warm_start, warm_start + cfg.warmup_s)] if warmup else [])
    _check_lengths(cfg, reqs, spans)
    changed = sum(a != b for a, b in zip(original, reqs) if any(lo <= a.timestamp < hi for lo, hi in spans))
    return Plan(
        cfg=cfg, trace_requests=len(original), trace_sha256=file_sha256(cfg.trace), windows=tuple(windows),
        warmup=warmup, warmup_start_s=warm_start, warmup_duration_s=cfg.warmup_s, warmup_load=max(cfg.loads),
        steps=build_schedule(cfg.windows, cfg.loads, cfg.labels, cfg.one_at_a_time, cfg.blocks, cfg.seed),
        model_config=json.loads((Path(cfg.model_dir) / "config.json").read_text()),
        clipped_requests=changed,
    )
