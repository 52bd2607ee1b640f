"""Everything decided before a server starts: the trace read and checked, windows cut, schedule built.

Windows are consecutive stretches of trace time: window i covers
[start_s + i * window_s, start_s + (i + 1) * window_s). At load k the same requests are replayed k
times faster (the replay lasts window_s / k). The warm-up is the warmup_s of trace just before the
first window when there is room (start_s >= warmup_s), else the warmup_s just after the last one,
replayed at the highest --loads factor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from experiments.core.schedule import Step, build_schedule, simultaneous_schedule
from experiments.runner import readiness, resident
from experiments.runner.config import ConfigError, RunConfig
from experiments.stats import duet
from traces.gaps import busy_spans, count_in, describe_spans
from traces.trace import (
    MAX_TIMESTAMP_S,
    TraceError,
    TraceRequest,
    clip_tokens,
    read_trace,
    scale_rate,
    time_window,
)


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
    placements: list[duet.Placement] = field(default_factory=list)  # duet: the GPU of each arm per window
    design: dict = field(default_factory=dict)  # readiness.design: each arm's server, memory, length
    sets: resident.Sets = ()  # the resident sets in the order they take the GPU (one: every arm at once)

    @property
    def vocab_size(self) -> int:
        return int(self.model_config.get("vocab_size", 32000))


def _warmup_span(cfg: RunConfig, first: float) -> float:
    """Start of the warm-up stretch when the first window starts at `first`."""
    return first - cfg.warmup_s if first >= cfg.warmup_s else first + cfg.windows * cfg.window_s


def _empty_stretch(cfg: RunConfig, ts: Sequence[float], first: float) -> str | None:
    """The first window or warm-up stretch that holds no arrival of `ts` when the first window starts
    at `first` (as text: "window 0 [10, 20) s"), or None when every one holds requests."""
    w = cfg.window_s
    for i in range(cfg.windows):
        if not count_in(ts, first + i * w, first + (i + 1) * w):
            return f"window {i} [{first + i * w:g}, {first + (i + 1) * w:g}) s"
    warm = _warmup_span(cfg, first)
    if cfg.warmup_s > 0 and not count_in(ts, warm, warm + cfg.warmup_s):
        return f"the warm-up stretch [{warm:g}, {warm + cfg.warmup_s:g}) s"
    return None


def working_start(cfg: RunConfig, ts: Sequence[float]) -> int | None:
    """A whole-second --start-s at which every window and the warm-up hold requests: the first at or
    after the configured start, else the first from 0; None when there is none."""
    latest = math.floor(ts[-1] - cfg.windows * cfg.window_s)  # the windows must end inside the trace
    given = min(max(0, math.ceil(cfg.first_window_s)), latest + 1)
    candidates = [*range(given, latest + 1), *range(given)]
    return next((s for s in candidates if _empty_stretch(cfg, ts, float(s)) is None), None)


def _gap_hint(cfg: RunConfig, ts: Sequence[float]) -> str:
    """Where the trace's requests are and which --start-s would fill every window."""
    spans = busy_spans(ts, cfg.window_s)
    where = (f"its requests lie in {describe_spans(spans)} (gaps of {cfg.window_s:g} s or more between "
             "spans)")
    start = working_start(cfg, ts)
    if start is None:
        return (f"{where}; no --start-s gives {cfg.windows} windows of {cfg.window_s:g} s that all hold "
                "requests: use fewer or longer windows (--windows, --window-s)")
    return (f"{where}; --start-s {start} gives {cfg.windows} windows of {cfg.window_s:g} s that all hold "
            "requests")


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


def _check_stretch(cfg: RunConfig, windows: Sequence[Window], warmup: Sequence[TraceRequest]) -> None:
    """Raise ConfigError naming the flag for a load or knee factor so small that a stretch replayed at it
    would put its last request past the ceiling a schedule may span (traces.trace.scale_rate)."""
    w = max(windows, key=lambda w: w.requests[-1].timestamp)  # the window whose last request is latest
    replays = [("--loads", k, f"window {w.id}", w.requests) for k in cfg.loads]
    replays += [("--knee", k, f"window {w.id}", w.requests) for k in cfg.knee_factors or ()]
    replays += [("--loads", max(cfg.loads), "the warm-up stretch", warmup)] if warmup else []
    for flag, k, what, reqs in replays:
        try:
            scale_rate(reqs[-1:], k)  # sorted by time: the stretch's latest request
        except ValueError:
            need = reqs[-1].timestamp / MAX_TIMESTAMP_S
            step = 10.0 ** (math.floor(math.log10(need)) - 2)  # shown to 3 digits, rounded up
            raise ConfigError(f"{flag} {k:g}: {what} replayed at it puts its last request at "
                              f"{reqs[-1].timestamp / k:g} s, past the {MAX_TIMESTAMP_S:,.0f} s a schedule "
                              f"may span; it needs a load of at least {math.ceil(need / step) * step:.3g}"
                              ) from None


def prepare(cfg: RunConfig, n_instances: int = 1) -> Plan:
    """Read and check the trace, cut windows and warm-up, build the schedule.

    Raises TraceError (file:line) for a bad trace and ConfigError for windows the trace cannot fill or
    that do not split into the resident sets, or, on a GPU, a policy arm without a table or servers that
    do not fit (readiness.design).
    """
    trace = read_trace(cfg.trace)
    original = list(trace.requests)
    reqs = clip_tokens(original, cfg.max_input_tokens, cfg.max_output_tokens)
    first, w = cfg.first_window_s, cfg.window_s
    last_end = first + cfg.windows * w
    trace_end = original[-1].timestamp
    if last_end > trace_end:
        raise ConfigError(f"{cfg.windows} windows of {w:g} s from --start-s {first:g} end at {last_end:g} s, "
                          f"but the trace {cfg.trace} ends at {trace_end:g} s; use fewer or shorter windows")
    ts = [r.timestamp for r in original]
    empty = _empty_stretch(cfg, ts, first)
    if empty:
        raise ConfigError(f"{empty} of {cfg.trace} has no requests; {_gap_hint(cfg, ts)}")
    windows = tuple(Window(i, first + i * w, w, tuple(time_window(reqs, first + i * w, w)))
                    for i in range(cfg.windows))
    warm_start = _warmup_span(cfg, first)
    warmup = tuple(time_window(reqs, warm_start, cfg.warmup_s)) if cfg.warmup_s > 0 else ()
    _check_stretch(cfg, windows, warmup)
    spans = [(first, last_end)] + ([(warm_start, warm_start + cfg.warmup_s)] if warmup else [])
    _check_lengths(cfg, reqs, spans)
    changed = sum(a != b for a, b in zip(original, reqs) if any(lo <= a.timestamp < hi for lo, hi in spans))
    resident.check(cfg, n_instances)
    sets = resident.sets(cfg)
    return Plan(
        cfg=cfg, trace_requests=len(original), trace_sha256=trace.sha256, windows=windows,
        warmup=warmup, warmup_start_s=warm_start, warmup_duration_s=cfg.warmup_s, warmup_load=max(cfg.loads),
        steps=(simultaneous_schedule(cfg.windows, cfg.loads, cfg.labels) if cfg.layout == "duet" else
               build_schedule(cfg.windows, cfg.loads, cfg.labels, cfg.one_at_a_time, cfg.blocks, cfg.seed,
                              sets, n_instances)),
        model_config=json.loads((Path(cfg.model_dir) / "config.json").read_text()),
        clipped_requests=changed,
        placements=(duet.placements(cfg.labels, cfg.gpus, cfg.windows, cfg.seed) if cfg.layout == "duet"
                    else []),
        design=readiness.design(cfg, n_instances, sets),
        sets=sets,
    )
