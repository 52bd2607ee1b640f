"""Builders of hand-made records and synthetic run directories for the analysis tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from experiments.core.schedule import build_schedule
from loadgen.records import RecordWriter, RequestRecord

MS = 1_000_000  # ns per ms


def record(ttft_ms: float | None, tpot_ms: float, *, out: int = 10, completion: int | None = None,
           error: str | None = None, status: int | None = 200, index: int = 0, tags: dict | None = None,
           due_ms: float = 0.0, itl: bool = False) -> RequestRecord:
    """A record whose TTFT and TPOT are exactly the given values (times in integer ns); with `itl` its
    token gaps kept, each the TPOT."""
    completion = out if completion is None else completion
    due = int(due_ms * MS)
    first = None if ttft_ms is None else due + int(round(ttft_ms * MS))
    last = None if first is None else first + int(round(tpot_ms * MS)) * max(completion - 1, 0)
    return RequestRecord(
        index=index, due_ns=due, sent_ns=due, first_token_ns=first, last_token_ns=last,
        end_ns=last if last is not None else due + 5 * MS, input_tokens=100, output_tokens=out,
        prompt_tokens=100, completion_tokens=completion, n_chunks=completion or 0, max_gap_ms=tpot_ms,
        status=status, error=error, tags=dict(tags or {}),
        itl_us=(int(round(tpot_ms * 1e3)),) * max((completion or 0) - 1, 0) if itl else None,
    )


# (arm, window, load) -> list of (ttft_ms, tpot_ms, error)
CellFn = Callable[[str, int, float, np.random.Generator], list[tuple[float, float, str | None]]]


def write_run(run_dir: Path, cell_fn: CellFn, *, labels: Sequence[str] = ("stock", "patched"),
              arms: Sequence[str] | None = None, windows: int = 6, loads: Sequence[float] = (1.0, 2.0),
              duration_s: float = 20.0, requests: int = 40, skip: set | None = None, status: str = "complete",
              stopped_reason: str | None = None, mode_note: str | None = None, device: str = "cuda",
              step_histograms: dict | None = None, warmup: int = 3, seed: int = 0, itl: bool = False,
              host: Callable[[str, int, float], dict | None] | None = None,
              sets: Sequence[tuple[str, ...]] | None = None, instances: int = 1) -> Path:
    """Write run.json + requests.jsonl for a synthetic run; cells in ``skip`` are not run. With ``itl``
    the records keep their token gaps; with ``host`` run.json lists every measured replay with its host
    entry host(arm, window, load). With resident ``sets`` the cells' orders are
    experiments.core.schedule's for them on ``instances`` instances (the records tagged with theirs),
    each cell replayed by its set's arms only."""
    rng = np.random.default_rng(seed)
    skip = skip or set()
    run_dir.mkdir(parents=True, exist_ok=True)
    schedule = []
    steps = {(s.window, s.load): list(s.order) for s in build_schedule(
        windows, tuple(loads), tuple(labels), sets=sets, instances=instances, seed=seed)} if sets else {}
    with RecordWriter(run_dir / "requests.jsonl") as w:
        for lab in labels:
            for i in range(warmup):
                w.write(record(9999.0, 999.0, index=i, tags={"arm": lab, "window": 0, "load": loads[0],
                                                              "phase": "warmup"}))
        for win in range(windows):
            for load in loads:
                order = steps.get((win, load)) or (list(labels) if win % 2 == 0 else list(reversed(labels)))
                done = [lab for lab in order if (lab, win, load) not in skip]
                schedule.append({"window": win, "load": load, "order": order, "done": done})
                for lab in done:
                    cell = cell_fn(lab, win, load, rng)
                    assert len(cell) == requests
                    for i, (ttft, tpot, err) in enumerate(cell):
                        tags = {"arm": lab, "window": win, "load": load, "phase": "measure",
                                **({"instance": win * instances // windows} if instances > 1 else {})}
                        w.write(record(ttft, tpot, index=i, error=err, status=500 if err else 200,
                                       completion=0 if err else None, tags=tags, itl=itl))
    run = {
        "schema_version": 1, "tool_version": "0.1.0", "created": "2026-01-01T00:00:00+00:00",
        "command": ["python", "experiments/run.py", "--trace", "traces/chat.jsonl"], "config": {},
        "trace": {"path": "traces/chat.jsonl", "sha256": "ab" * 32, "requests": 1000},
        "model": {"name": "tiny-llama", "dir": "integration/models/tiny-llama",
                  "config": {"hidden_size": 4096, "num_hidden_layers": 2, "torch_dtype": "bfloat16"},
                  "dtype": "bfloat16", "eager": False},
        "device": device, "mode_note": mode_note, "arms": list(arms or labels), "arm_labels": list(labels),
        "windows": [{"id": i, "start_s": i * duration_s, "duration_s": duration_s, "requests": requests}
                    for i in range(windows)],
        "loads": list(loads), "warmup": {"requests": warmup, "duration_s": 5.0}, "schedule": schedule,
        "step_histograms": step_histograms or {}, "status": status, "stopped_reason": stopped_reason,
        "servers": {lab: {"log": f"server-{lab}.log", "cmd": [], "kv_cache_memory_bytes": 1}
                    for lab in labels},
        **({"resident_sets": [list(s) for s in sets]} if sets else {}),
    }
    if host is not None:
        run["replays"] = [{"arm": lab, "window": e["window"], "load": e["load"], "phase": "measure",
                           "started_s": 10.0 * k, "host": host(lab, e["window"], e["load"])}
                          for k, e in enumerate(schedule) for lab in e["done"]]
    (run_dir / "run.json").write_text(json.dumps(run, indent=1), encoding="utf-8")
    return run_dir
