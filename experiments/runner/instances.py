"""Server instances as a level of the design: every arm restarted between blocks of windows.

With `--instances N` (N > 1) the measured windows are cut into N contiguous blocks of equal size;
before each block after the first every resident server is stopped and started again (every arm, in
the order of the first start, waited for as then), warmed up and burnt in as a fresh server is, so
each arm runs on N server instances. Every record of the run carries its arm's instance index (tag
"instance"); run.json "instances" lists each arm's instances: when each started, how long it took to
answer (`ready_s`, the cost of a restart: the compile cache is warm after the first), its pid, the
GPU's state then, the KV cache and engine start-up its log reported, and under "differences" what
was not the same between an arm's instances. `--instances 1` (the default) changes nothing.

`--precision PCT` or `--budget-min MIN` choose instances x windows by experiments.stats.design from
the committed prior (runtime_tables/instance-prior.json: its variance components and costs,
the costs rescaled to this run's servers and loads: a start costs what the prior's run took per
server from its start to its first replay, warm-up included, burn-in not; with resident sets, the
start waves of the sets, the arms that replay a window and the windows each compared pair shares)
and say what they predict before a server starts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import runtime_tables
from common.jsonfile import read_json
from common.tstats import t_quantile
from experiments.core.schedule import Segment, Step, set_segments, split_blocks
from experiments.core.schedule import segments as block_segments
from experiments.runner import resident
from experiments.runner.config import ConfigError, RunConfig
from experiments.runner.replays import gpu_state
from experiments.runner.runrecord import RunRecord
from experiments.runner.servers import Server
from experiments.stats import comparisons, design
from experiments.stats.paired import pct

PRIOR = runtime_tables.path("instance-prior.json")
GPU_INSTANCES = 3  # a GPU run the kit starts, without --instances: the fewest that give an interval over
# instance pairs with 2 df (two instances give one; experiments.stats.instances)
_KV_RE = re.compile(r"KV cache size: ([\d,]+) tokens")
_INIT_RE = re.compile(r"init engine .* took ([\d.]+) s(?: \(compilation: ([\d.]+) s\))?")
# what is expected to differ between two instances of an arm, so not listed under "differences"
_ALWAYS_DIFFERENT = ("index", "started_at", "ready_s", "pid", "engine_init_s", "compile_s")


def check(cfg: RunConfig, n: int, handed_in: bool = False, windows: int | None = None) -> None:
    """ConfigError for an --instances the run cannot restart its servers for (`windows`: the run's, where
    chosen before its config is made, else cfg.windows)."""
    windows = cfg.windows if windows is None else windows
    if n < 1:
        raise ConfigError(f"--instances must be 1 or more, got {n}")
    if n == 1:
        return
    refused = [(cfg.one_at_a_time and cfg.blocks != n,
                f"--one-at-a-time and --blocks {cfg.blocks} (its blocks are the instances: give "
                f"--blocks {n})"),
               (bool(cfg.endpoints), "--endpoint (the kit cannot restart servers the user started)"),
               (cfg.layout == "duet", "--layout duet"), (handed_in, "servers handed in")]
    for bad, what in refused:
        if bad:
            raise ConfigError(f"--instances {n}: not with {what}")
    if windows % n:
        raise ConfigError(f"--instances {n}: --windows {windows} is not a multiple of it (every "
                          "instance replays the same number of windows)")


def default_count(cfg: RunConfig) -> int:
    """Instances when none are asked for: GPU_INSTANCES on a GPU run of resident servers the kit starts
    (ConfigError when --windows does not split into them), else 1."""
    if cfg.device != "cuda" or cfg.endpoints or cfg.one_at_a_time or cfg.layout != "turns":
        return 1
    if cfg.windows % GPU_INSTANCES:
        raise ConfigError(f"--windows {cfg.windows}: a GPU run has {GPU_INSTANCES} server instances per arm "
                          f"unless --instances says otherwise, and every instance replays the same number "
                          f"of windows: give a multiple of {GPU_INSTANCES}, or --instances")
    return GPU_INSTANCES


def segments(steps: Sequence[Step], n: int) -> list[Segment]:
    """The resident run's steps in n blocks of contiguous windows, one per instance, every block with
    the arms of the first step's order (with resident sets, one segment per set in turn)."""
    if not steps:
        return []
    windows = sorted({s.window for s in steps})
    blocks = [set(windows[i] for i in b) for b in split_blocks(len(windows), n)]
    return [seg for i, b in enumerate(blocks)
            for seg in set_segments([s for s in steps if s.window in b], steps, i)]


def engine_start(log_text: str) -> dict:
    """What a server's log says of its last start: KV-cache tokens, engine start-up and compile s."""
    text = log_text.rsplit("\n$ ", 1)[-1]  # the launcher writes "$ <command>" before every start
    kv, init = _KV_RE.findall(text), _INIT_RE.findall(text)
    return {"kv_cache_tokens": int(kv[-1].replace(",", "")) if kv else None,
            "engine_init_s": float(init[-1][0]) if init else None,
            "compile_s": float(init[-1][1]) if init and init[-1][1] else None}


def differences(entries: Sequence[Mapping]) -> dict:
    """field -> its value per instance, for the fields (gpu_state's one level down) not the same in
    every entry, leaving out those that always differ (_ALWAYS_DIFFERENT)."""
    flat = [{**{k: v for k, v in e.items() if k not in _ALWAYS_DIFFERENT and k != "gpu_state"},
             **{f"gpu_state.{k}": v for k, v in (e.get("gpu_state") or {}).items()}} for e in entries]
    keys = sorted({k for f in flat for k in f})
    return {k: [f.get(k) for f in flat] for k in keys if len({repr(f.get(k)) for f in flat}) > 1}


class Instances:
    """The instance index of every arm, the "instance" tag of its records and run.json "instances"."""

    def __init__(self, record: RunRecord, n: int) -> None:
        self.record, self.n = record, n
        self.current: dict[str, int] = {}
        if n > 1:
            record.start_instances(n)

    def segments(self, steps: Sequence[Step], one_at_a_time: bool = False) -> list[Segment]:
        """`segments` of the run's steps (with --one-at-a-time its (block, arm) segments, block k on
        instance k of every arm), the windows of each instance kept in run.json."""
        segs = block_segments(list(steps), True) if one_at_a_time else segments(steps, self.n)
        blocks: dict[int, set[int]] = {}
        for seg in segs:
            blocks.setdefault(seg.block, set()).update(s.window for s in seg.steps)
        self.record.set_instance_windows([sorted(b) for b in blocks.values()])
        return segs

    def tags(self, label: str) -> dict:
        """The tag every record of `label` gets now ({} with one instance: records as before)."""
        return {"instance": self.current.get(label, 0)} if self.n > 1 else {}

    def started(self, label: str, server: Server, at: float, ready_s: float) -> None:
        """Record a start of `label`'s server (`at` wall-clock, `ready_s` until it answered)."""
        if self.n == 1:
            return
        proc, config = getattr(server, "proc", None), getattr(server, "config", None)  # none: an endpoint
        started_at = dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="milliseconds")
        entries = self.record.add_instance(label, {
            "started_at": started_at, "ready_s": round(ready_s, 3), "pid": proc.pid if proc else None,
            "gpu_state": gpu_state(), "port": getattr(config, "port", None),
            "kv_cache_memory_bytes": getattr(config, "kv_cache_memory_bytes", None),
            "cpus": list(getattr(config, "cpus", ())) or None, **engine_start(server.log_tail(400))})
        self.current[label] = len(entries) - 1
        self.record.set_instance_differences(label, differences(entries))


# --- the design: instances x windows from a wanted precision or a GPU-minute budget ---


def prior(cfg: RunConfig, path: Path = PRIOR,
          found: resident.Sets | None = None) -> tuple[design.Components, design.Costs, str]:
    """The committed components and costs, the costs rescaled to this run's servers and loads (a
    server start and a replay cost what they cost in the prior's run; resident sets start their servers
    in more waves, each a start, and replay each window on their own arms only), and where they come
    from; `found`: the resident sets (default: resident.sets)."""
    doc = read_json(path, 1, "instance floor")
    p = doc["plan"]
    base = design.Costs(**p["costs"])
    servers, found = len(cfg.labels), found or resident.sets(cfg)
    waves = (resident.start_waves_per_instance(cfg, found)
             / resident.start_waves_per_instance(cfg, (cfg.labels,)))  # 1 with every arm resident
    costs = dataclasses.replace(base, start_min=base.start_min * servers / base.arms * waves,
                                arms=servers if len(found) == 1 else resident.replays_per_window(found),
                                loads=len(cfg.loads))
    source = (f"{path.name}: instance variance of {', '.join(doc['instance'])}, timings of "
              f"{p['basis']['timing_run']}")
    return design.Components(**p["components"]), costs, source


def layout(cfg: RunConfig, found: resident.Sets | None = None) -> design.Resident:
    """The resident sets as the design sees them: how many, and the smallest share of the windows in
    which the two arms of a required comparison (comparisons.required_pairs: the A/B, the planted twin,
    the A/A) replay together, so that every one of them reaches the precision asked for; `found`: the
    resident sets (default: resident.sets)."""
    found = found or resident.sets(cfg)
    if len(found) == 1:
        return design.Resident()
    pairs = comparisons.required_pairs(resident.run_like(cfg))
    shared = min(sum(a in s and b in s for s in found) for a, b in pairs)
    return design.Resident(len(found), shared / len(found))


def predict(c: design.Components, costs: design.Costs, instances: int, windows: int, window_s: float,
            sets: design.Resident = design.Resident()) -> dict:
    """Half-width (percent, over instance pairs) and GPU minutes of `instances` x `windows` per instance."""
    var = design.variance(c, costs, instances, windows, window_s, sets)
    half = pct(float(t_quantile(0.975, instances - 1)) * math.sqrt(var)) if instances >= 2 else None
    return {"instances": instances, "windows": windows * instances, "windows_per_instance": windows,
            "half_width_pct": half, "gpu_minutes": float(design.cost(costs, instances, windows, window_s))}


def choose(cfg: RunConfig, instances: int | None, windows_given: bool, precision: float | None,
           budget_min: float | None, path: Path = PRIOR,
           most: int | None = None) -> tuple[int, int, dict | None]:
    """(windows, instances, the design's record or None) of cfg's run, its servers resident `most` at
    once where the GPU decides it (resident.sets): with --precision or --budget-min, the cheapest design
    reaching it (or the narrowest the budget buys) at the run's window length, its instances and windows
    taken where the user gave none; without them, the user's (default 1), a default --windows rounded
    up to split into the resident sets (resident.fit_windows)."""
    found = resident.sets(cfg, most)
    if precision is None and budget_min is None:
        n = instances or default_count(cfg)
        return resident.fit_windows(cfg.windows, n, windows_given, found), n, None
    c, costs, source = prior(cfg, path, found)
    sets = layout(cfg, found)
    if precision is not None:
        chosen = design.design_for_precision(c, costs, precision, window_s=(cfg.window_s,), resident=sets)
        goal = f"--precision {precision:g}%"
    else:
        chosen = design.design_for_budget(c, costs, budget_min, window_s=(cfg.window_s,), resident=sets)
        goal = f"--budget-min {budget_min:g}"
    n = instances or chosen["instances"]
    per = cfg.windows // n if windows_given else chosen["windows"]
    if windows_given and cfg.windows % n:
        raise ConfigError(f"--windows {cfg.windows} is not a multiple of {n} instances (every instance "
                          "replays the same number of windows)")
    if per < 1:
        raise ConfigError(f"--windows {cfg.windows} is fewer than {n} instances")
    run = predict(c, costs, n, per, cfg.window_s, sets)
    return n * per, n, {"goal": goal, "prior": source, "plan": chosen, "run": run}


def describe(rec: dict) -> str:
    """What the design chose and predicts, and what the run will do if the user's flags differ."""
    p, r = rec["plan"], rec["run"]
    lines = [f"design for {rec['goal']}: {p['instances']} instances x {p['windows']} windows of "
             f"{p['window_s']:g} s per instance at {p['loads']} loads on {p['costs']['arms']:g} servers: "
             f"{p['gpu_minutes']:.1f} GPU minutes, half-width +-{p['half_width_pct']:.3f}% over "
             f"instances ({p['df']} df), MDE {p['mde_pct']:.2f}% (prior: {rec['prior']})"]
    if (r["instances"], r["windows_per_instance"]) != (p["instances"], p["windows"]):
        half = "no interval over instances (one instance)" if r["half_width_pct"] is None else \
            f"half-width +-{r['half_width_pct']:.3f}%"
        lines.append(f"running {r['instances']} instances x {r['windows_per_instance']} windows (the flags "
                     f"given): {r['gpu_minutes']:.1f} GPU minutes, {half}")
    return "\n".join(lines)
