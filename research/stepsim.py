"""A step-level model of vLLM's chunked-prefill scheduler: what a per-step delay does to a replay's
token times, the prefill feedback included. Pure functions; research.plantedsim applies it to
a run's planted control.

The planted control's prediction (experiments.stats.plantedline) divides the decode time a delay adds by the
reference's decode time: it holds the steps fixed. A slower decode step also keeps every request
decoding longer, so more requests arrive meanwhile and their prefills join its steps. `simulate`
replays requests (due time, prompt and output tokens) through this model of the server, step by
step:

- running requests in admission order: one token each when decoding, the rest of their prompt (up
  to the budget left) when still in prefill; then waiting requests in arrival order while the
  budget, `max_seqs` and the KV cache (prompt + output tokens of the running ones) allow;
- it lasts `step_us(tokens)`: for the server, `StepTime`, the model's forward time at that many
  tokens (measured decode and prefill steps of the same model and GPU, linear between them and
  beyond the last) plus a fixed host overhead per step; a delay adds its cost at that size;
- every request in it gets a token at its end (a prefill's last chunk gives the first token).

The overhead is the one free figure: `fit_overhead` sets it so that a measured median (inter-token
gap, or TPOT) of a set of replays is met.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import optimize

BUDGET = 8192  # vLLM's max_num_batched_tokens for the API server on a GPU of >= 70 GiB
MAX_SEQS = 1024  # its max_num_seqs there


@dataclass(frozen=True)
class Request:
    """One request as a replay sent it: due time (us from the replay's start) and token counts."""

    due_us: float
    prompt: int
    output: int


@dataclass(frozen=True)
class StepTime:
    """Step duration (us) at a number of scheduled tokens: `points` (tokens, us) of the forward pass,
    linear between them, the first value below them and the last segment's slope beyond them, plus
    `overhead_us` per step."""

    points: tuple[tuple[float, float], ...]
    overhead_us: float = 0.0

    @cached_property
    def _xy(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        xs, ys = zip(*self.points)
        return xs, ys

    def __call__(self, tokens: float) -> float:
        xs, ys = self._xy  # called once per simulated step: split the points once
        if tokens <= xs[-1] or len(xs) < 2:
            return float(np.interp(tokens, xs, ys)) + self.overhead_us
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (tokens - xs[-1]) + self.overhead_us


@dataclass(frozen=True)
class Outcome:
    """Per request, in the order given: its token times (us from the replay's start)."""

    token_us: tuple[np.ndarray, ...]

    def tpot_us(self, reqs: Sequence[Request]) -> np.ndarray:
        """(last - first token time) / (output - 1); NaN for one-token requests."""
        return np.array([(t[-1] - t[0]) / (r.output - 1) if r.output > 1 else math.nan
                         for t, r in zip(self.token_us, reqs)])

    def median_gap_us(self) -> np.ndarray:
        """Each request's median gap between its tokens (us; NaN with one token)."""
        return np.array([float(np.median(np.diff(t))) if len(t) > 1 else math.nan for t in self.token_us])

    def gaps_us(self) -> np.ndarray:
        """Every gap between two tokens of a request, all requests together (us)."""
        return np.concatenate([np.diff(t) for t in self.token_us] or [np.array([])])


def simulate(reqs: Sequence[Request], step_us: Callable[[int], float], *, budget: int = BUDGET,
             max_seqs: int = MAX_SEQS, kv_tokens: int | None = None) -> Outcome:
    """Replay `reqs` through the scheduler model of the module text; `step_us(tokens)` the duration of
    a step of that many scheduled tokens."""
    n = len(reqs)
    order = sorted(range(n), key=lambda i: reqs[i].due_us)
    done_prompt, made = [0] * n, [0] * n
    times: list[list[float]] = [[] for _ in range(n)]
    waiting: deque[int] = deque()
    running: list[int] = []
    kv_used, t, nxt, finished = 0, 0.0, 0, 0
    while finished < n:
        while nxt < n and reqs[order[nxt]].due_us <= t:
            waiting.append(order[nxt])
            nxt += 1
        if not running and not waiting:
            t = reqs[order[nxt]].due_us
            continue
        left, scheduled = budget, []
        for i in running:
            if left == 0:
                break
            take = min(reqs[i].prompt - done_prompt[i], left) if done_prompt[i] < reqs[i].prompt else 1
            scheduled.append((i, take))
            left -= take
        while waiting and left > 0 and len(running) < max_seqs:
            i = waiting[0]
            need = reqs[i].prompt + reqs[i].output
            if kv_tokens is not None and kv_used + need > kv_tokens and running:
                break
            waiting.popleft()
            running.append(i)
            kv_used += need
            take = min(reqs[i].prompt, left)
            scheduled.append((i, take))
            left -= take
        t += step_us(budget - left)
        for i, take in scheduled:
            if done_prompt[i] < reqs[i].prompt:
                done_prompt[i] += take
                if done_prompt[i] < reqs[i].prompt:
                    continue  # a prefill chunk: no token yet
            made[i] += 1
            times[i].append(t)
            if made[i] == reqs[i].output:
                running.remove(i)
                kv_used -= reqs[i].prompt + reqs[i].output
                finished += 1
    return Outcome(tuple(np.array(ts) for ts in times))


Cells = Mapping[object, Sequence[Request]]  # cell -> its requests, each cell a replay of its own
Metric = Callable[[Cells, StepTime, Mapping], float]


def median_gap(cells: Cells, step: StepTime, limits: Mapping = {}) -> float:
    """The median over every request of `cells` of its simulated median inter-token gap (us)."""
    gaps = np.concatenate([simulate(reqs, step, **limits).median_gap_us() for reqs in cells.values()])
    return float(np.nanmedian(gaps))


def median_tpot(cells: Cells, step: StepTime, limits: Mapping = {}) -> float:
    """The median simulated TPOT (us) over every request of `cells`."""
    return float(np.nanmedian(np.concatenate([simulate(reqs, step, **limits).tpot_us(reqs)
                                              for reqs in cells.values()])))


def fit_overhead(cells: Cells, points: Sequence[tuple[float, float]], target_us: float,
                 metric: Metric = median_gap, **limits) -> float:
    """The per-step overhead (us, >= 0, to 1 us) at which `metric` of the simulated `cells` reaches
    `target_us` (Brent's method between 0 and an overhead that overshoots, found by doubling; the
    metric rises with the overhead, in steps where a median moves to another request); 0 where the
    metric without any overhead already reaches the target."""
    def excess(overhead: float) -> float:
        return metric(cells, StepTime(tuple(points), overhead), limits) - target_us

    if excess(0.0) >= 0:
        return 0.0
    high = 1000.0
    while excess(high) < 0:
        high *= 2.0
    return float(optimize.brentq(excess, 0.0, high, xtol=1.0))
