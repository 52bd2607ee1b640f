"""Decode-step time from CUDA-graph replays: CUDA events around many replays of the step's graph.

A compiled vLLM decode step (1-256 requests on the 8B shape) is one FULL CUDA graph: the whole
forward pass, norms included. `captured_graphs` records which graphs one engine step replayed;
`replay_times` replays that graph many times back to back and times each replay with CUDA events
(its inputs are the step's persistent buffers, so every replay recomputes that step). This is the
step's GPU time with the host, the scheduler and the sampler taken out, and it includes what a
profiler's per-kernel durations miss: the overlap that programmatic dependent launch buys.

Each profiling engine (stock, patched, a planted control) replays in its own turns, alone on the
GPU, the arms' order reversed every round (integration.proof.prove). `compare` reduces the samples:
per round the median replay time of each arm, the log ratio to stock's median in the same round,
and a t interval over rounds. Prefill steps, which are not one FULL graph, are compared by their
wall-clock step times (`prefill_rows`). Pure apart from the GPU helpers; rebuild a graph-steps file from a
run's raw data with

    python -m integration.proof.graphtime --raw OUT/raw-steps.json.xz --out OUT/h200-graph-steps.json
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from scipy import stats

from common.cliargs import refuse_output
from common.jsonfile import ResultFileError, read_json, write_json
from common.tstats import mean_t_interval
from integration.proof import normcalls

WARM_REPLAYS = 10  # replays before the timed ones (clocks up, caches warm)
BOOTSTRAP_RESAMPLES = 2000  # for the prefill steps' difference of medians


@contextlib.contextmanager
def captured_graphs() -> Iterator[list]:
    """Within the block, every torch.cuda.CUDAGraph replayed is appended to the yielded list."""
    import torch

    seen: list = []
    original = torch.cuda.CUDAGraph.replay

    def spy(self) -> None:  # noqa: ANN001 (a torch.cuda.CUDAGraph)
        seen.append(self)
        original(self)

    torch.cuda.CUDAGraph.replay = spy
    try:
        yield seen
    finally:
        torch.cuda.CUDAGraph.replay = original


def replay_times(graph, n: int) -> list[float]:  # noqa: ANN001 (a torch.cuda.CUDAGraph)
    """Microseconds of each of `n` back-to-back replays of `graph`, after WARM_REPLAYS untimed ones."""
    import torch

    for _ in range(WARM_REPLAYS):
        graph.replay()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        graph.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1000.0 for i in range(n)]


def time_step(step, n: int) -> dict:  # noqa: ANN001 (a callable running one engine step)
    """Run `step()` once, spying on its graph replays; if it replayed exactly one graph (a FULL
    graph: the whole forward), time `n` replays of it. Otherwise say why nothing was timed."""
    with captured_graphs() as seen:
        step()
    if len(seen) != 1:
        return {"graphs_in_step": len(seen), "replay_us": [],
                "why_not_timed": f"the step replayed {len(seen)} CUDA graphs, not one FULL graph"}
    return {"graphs_in_step": 1, "replay_us": replay_times(seen[0], n)}


def pct(log_ratio: float) -> float:
    """A log ratio as a percent change."""
    return 100.0 * math.expm1(log_ratio)


def compare(rounds: Mapping[str, Sequence[Sequence[float]]], baseline: str = "stock",
            calls_per_step: int | None = None) -> dict:
    """Per arm against `baseline`, from {arm: [replay_us of round 1, of round 2, ...]}.

    Per round r where both arms have samples: d_r = ln(median arm_r / median baseline_r). The
    change is the mean of d_r with a 95% t interval over rounds (arms' order alternates between
    rounds, so a position effect cancels over each pair of rounds), in percent. With fewer than
    two rounds there is no interval. `calls_per_step` adds the change per norm call in us."""
    base = rounds.get(baseline) or []
    out: dict = {"baseline": baseline,
                 "baseline_median_us": _median_of_medians(base),
                 "replays_per_round": sorted({len(s) for s in base if s}), "arms": {}}
    for arm, arm_rounds in rounds.items():
        if arm == baseline:
            continue
        pairs = [(statistics.median(b), statistics.median(x))
                 for b, x in zip(base, arm_rounds) if b and x]
        d = [math.log(x / b) for b, x in pairs]
        row: dict = {"rounds": len(d), "median_us": _median_of_medians(arm_rounds),
                     "per_round_log_ratio": d}
        if len(d) >= 2:
            mean, lo, hi = mean_t_interval(d)
            row.update(change_pct=pct(mean), ci95_pct=[pct(lo), pct(hi)],
                       excludes_zero=bool(lo > 0 or hi < 0))
            if calls_per_step:
                diff = [x - b for b, x in pairs]
                m, dlo, dhi = mean_t_interval(diff)
                row.update(change_per_norm_call_us=m / calls_per_step,
                           ci95_per_norm_call_us=[dlo / calls_per_step, dhi / calls_per_step])
        else:
            row["why_no_interval"] = f"{len(d)} round(s) with samples from both arms; an interval needs 2"
        out["arms"][arm] = row
    return out


def _median_of_medians(rounds: Sequence[Sequence[float]]) -> float | None:
    meds = [statistics.median(s) for s in rounds if s]
    return statistics.median(meds) if meds else None


def _steps(results: Mapping[str, dict | None], mode: str, kind: str) -> Iterator[tuple[str, dict]]:
    """(arm, step row) for every `kind` step row of the prove_arm results {"<arm>-<mode>": result}."""
    suffix = f"-{mode}"
    for name, res in results.items():
        if name.endswith(suffix) and res:
            for row in res.get("steps", []):
                if row.get("kind") == kind:
                    yield name[: -len(suffix)], row


def from_results(results: Mapping[str, dict | None], mode: str = "compiled",
                 calls_per_step: int | None = None) -> list[dict]:
    """One `compare` row per decode size, from prove_arm results {"<arm>-<mode>": result}: each
    result's "steps" rows carry "graph_rounds" (one entry per round: time_step's dict)."""
    by_size: dict[int, dict[str, list[list[float]]]] = {}
    why: dict[int, set[str]] = {}
    for arm, row in _steps(results, mode, "decode"):
        if "graph_rounds" not in row:
            continue
        n = row["batch_tokens"]
        by_size.setdefault(n, {})[arm] = [r["replay_us"] for r in row["graph_rounds"]]
        why.setdefault(n, set()).update(r["why_not_timed"] for r in row["graph_rounds"]
                                        if r.get("why_not_timed"))
    rows = []
    for n in sorted(by_size):
        row = {"batch_tokens": n, **compare(by_size[n], calls_per_step=calls_per_step)}
        if why[n]:
            row["why_not_timed"] = sorted(why[n])
        rows.append(row)
    return rows


def prefill_rows(results: Mapping[str, dict | None], mode: str = "compiled",
                 calls_per_step: int | None = None, baseline: str = "stock") -> list[dict]:
    """Per prefill size, each arm's wall-clock step time against `baseline` (prefill steps are not one
    FULL graph, so they are timed whole, host included): the difference of the medians of the
    timed steps with a 95% percentile-bootstrap interval (scipy, seeded), and per norm call."""
    by_size: dict[int, dict[str, list[float]]] = {}
    for arm, row in _steps(results, mode, "prefill"):
        if row.get("step_wall_us"):
            by_size.setdefault(row["batch_tokens"], {})[arm] = row["step_wall_us"]
    rows = []
    for n in sorted(by_size):
        base = by_size[n].get(baseline)
        if not base:
            continue
        row: dict = {"batch_tokens": n, "baseline": baseline, "baseline_median_us": statistics.median(base),
                     "arms": {}}
        for arm, samples in by_size[n].items():
            if arm == baseline:
                continue
            diff = statistics.median(samples) - statistics.median(base)
            ci = stats.bootstrap((samples, base), lambda a, b, axis=-1: np.median(a, axis=axis)
                                 - np.median(b, axis=axis), vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES,
                                 method="percentile", rng=np.random.default_rng(0)).confidence_interval
            entry = {"steps": len(samples), "median_us": statistics.median(samples), "change_us": diff,
                     "ci95_us": [float(ci.low), float(ci.high)]}
            if calls_per_step:
                entry.update(change_per_norm_call_us=diff / calls_per_step,
                             ci95_per_norm_call_us=[float(ci.low) / calls_per_step,
                                                    float(ci.high) / calls_per_step])
            row["arms"][arm] = entry
        rows.append(row)
    return rows


def document(raw: Mapping) -> dict:
    """The graph-steps file of a prove run, from its raw-steps.json.xz content: per decode size each arm
    against stock from graph replays, per prefill size from wall-clock steps, and the change per norm
    call from the model's norm calls per forward pass."""
    calls = normcalls.norm_shape(normcalls.recorded_model_dir(raw["model"])).expected()
    per_step = sum(calls.values())
    return {"command": raw.get("command"), "model": raw["model"], "environment": raw.get("environment"),
            "norm_calls_per_step": calls,
            "sizes": from_results(raw["results"], "compiled", per_step),
            "prefill": prefill_rows(raw["results"], "compiled", per_step)}


def main(argv: list[str] | None = None) -> int:
    """CLI: rebuild <gpu>-graph-steps.json from a prove run's raw-steps.json.xz."""
    ap = argparse.ArgumentParser(
        prog="python -m integration.proof.graphtime", description=main.__doc__)
    ap.add_argument("--raw", required=True, help="raw-steps.json.xz of python -m integration.proof.prove")
    ap.add_argument("--out", required=True, help="graph-steps JSON to write (e.g. OUT/h200-graph-steps.json)")
    a = ap.parse_args(argv)
    refuse_output(ap.prog, "--out", a.out, [a.raw])
    try:
        raw = read_json(a.raw, None, "raw-steps")
    except ResultFileError as exc:
        ap.error(f"--raw: {exc}")
    write_json(a.out, document(raw), allow_nan=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
