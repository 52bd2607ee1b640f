"""One A/B (or A/A) run: cut the trace, start the arms, replay every window at every load, record.

The arms' servers are started in turn (experiments.runner.servers), or, with --endpoint, servers the user
started are waited for and measured alike; every replay of a run uses the same prompt source.

After each server start the runner warms the server up (phase "warmup", at the highest load) and
then replays one burn-in cell on the freshly started arms (phase "burnin": recorded, shown in the
report, never compared). Every replay's start, wall time, where a GPU exists its clocks and
temperature right after it, and the host's signals over it (experiments.runner.hostprobe) are appended
to run.json's "replays". With --instances N every server is restarted between N blocks of windows
(experiments.runner.instances); --pin-cpus and --start-order place them (experiments.runner.placement);
--resident K swaps sets of K (experiments.runner.resident); with --sleep-mode only the replayed arm's
server is awake (experiments.runner.sleepmode).

    run_dir = run_experiment(make_config("traces/chat.jsonl"))

Everything that can be checked is checked before a server starts (flags, trace, windows, output
directory). run.json is rewritten atomically after every replay, so a crash loses nothing; a server
that dies, a replay that fails entirely, or Ctrl-C stops the run cleanly with status "partial" and
the reason, and the (partial) report is still written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from common.jsonfile import write_json
from experiments.core.schedule import (
    Segment,
    Step,
    build_schedule,
    burnin_seed,
    burnin_step,
    knee_seed,
    replay_seed,
    segments,
)
from experiments.runner import closing, duetrun, instances, kneesearch, placement, readiness, sleepmode
from experiments.runner.config import RunConfig
from experiments.runner.environment import capture_environment
from experiments.runner.hostprobe import Probe
from experiments.runner.metrics_scrape import CumulativeHistogram, difference, scrape
from experiments.runner.plan import Plan, Window, prepare
from experiments.runner.replays import BeforeReplay, StopRun, gpu_state, settle
from experiments.runner.runrecord import RunRecord, make_run_dir
from experiments.runner.servers import Server, StartFailed, prompt_source, start_groups, start_servers
from loadgen.prompts import PromptSource
from loadgen.records import RequestRecord
from loadgen.replay import ReplayOptions, replay_sync
from traces.trace import scale_rate

log = logging.getLogger("experiments")
class Runner:
    """Executes a plan's segments against the servers and records every replay."""

    def __init__(self, plan: Plan, record: RunRecord, servers: Mapping[str, Server] | None,
                 before_replay: BeforeReplay | None, prompts: PromptSource | None = None,
                 n_instances: int = 1, place: placement.Placement | None = None) -> None:
        self.plan, self.cfg, self.record, self.prompts = plan, plan.cfg, record, prompts
        self.instances = instances.Instances(record, n_instances)
        self.place = place or placement.Placement({})
        self.start_order: list[str] = []  # the labels in the order their servers first started
        self.servers: dict[str, Server] = dict(servers or {})
        self.owned: set[str] = set()  # servers this runner started (and must stop)
        self.before_replay = before_replay
        self.where = "before the first replay"
        self.t_start = time.time()
        self.awake = sleepmode.Awake(plan, record, self.t_start)  # --sleep-mode's switches
        self.burned: set[str] = set()  # arms burnt in since their server (re)started
        self.loads: tuple[float, ...] = tuple(self.cfg.loads)  # measured loads: --loads, or the knee's
        self.record.set_order("randomised balanced per load (experiments.core.schedule)", self.cfg.seed)
        self.bar = tqdm(total=sum(len(s.order) for s in plan.steps), unit="replay", desc="run",
                        disable=not self.cfg.progress, position=0, leave=True)

    def execute(self) -> None:
        """Run every segment: bring up its arms (warming each new one up and burning it in), replay
        its steps; with --knee, search the knee on the baseline first (the servers warmed up, the
        burn-in left for the loads the search chooses) and measure at the loads it chose. With
        --instances N, every server is restarted before each of the N blocks of windows but the first
        (--one-at-a-time: every arm's server is new in every block, none carried into the next; resident
        sets: a block's segments are its sets in turn, a new block restarting the first set's)."""
        if self.cfg.knee_factors:
            self._ensure(self.plan.sets[0], burn_in=False)
            self._knee_search()
        n, one = self.instances.n, self.cfg.one_at_a_time
        segs = self.instances.segments(self.plan.steps, one) if n > 1 else segments(self.plan.steps, one)
        for k, seg in enumerate(segs):
            if n > 1 and one:
                self._retire_earlier_instances(seg)
            elif k and n > 1 and seg.block != segs[k - 1].block:
                self._restart(seg.block, seg.arms)
            self._ensure(seg.arms)
            for step in seg.steps:
                for label in step.order:
                    if label in seg.arms:
                        self._replay_step(step, label)

    def owned_servers(self) -> list[Server]:
        """The servers this runner started (and must stop)."""
        return [self.servers[label] for label in sorted(self.owned)]

    def stop_owned(self) -> None:
        """Stop every server this runner started."""
        for label in sorted(self.owned):
            log.info("stopping %s server", label)
            self.servers[label].stop()
        self.owned.clear()
        self.bar.close()

    def _stop(self, label: str, why: str) -> None:
        log.info("stopping %s server (%s)", label, why)
        self.servers[label].stop()
        self.owned.discard(label)
        self.burned.discard(label)
        self.awake.forget(label)

    def _retire_earlier_instances(self, seg: Segment) -> None:
        """Stop the server of an arm of `seg` that an earlier block started, so that block k runs on
        instance k of every arm."""
        for label in seg.arms:
            if label in self.owned and self.instances.current.get(label) != seg.steps[0].block:
                self._stop(label, "next instance")

    def _restart(self, instance: int, arms: tuple[str, ...]) -> None:
        """Stop every server and start those of `arms` (the block's first resident set; every arm without
        sets) again as instance `instance`, in the order of their first start, rotated by `instance` with
        --start-order rotate, each warmed up as new; the block's _ensure burns them in."""
        for label in [lab for lab in self.start_order if lab in self.owned]:
            self._stop(label, "next instance")
        order = placement.rotated(self.start_order, instance, self.place.start_order)
        self._ensure(tuple(lab for lab in order if lab in arms), burn_in=False)

    def _ensure(self, arms: tuple[str, ...], burn_in: bool = True) -> None:
        """The servers of `arms` up, new ones started and warmed up a group at a time (--sleep-mode:
        each group put to sleep before the next), the fresh ones burnt in unless `burn_in` is off."""
        for label in [lab for lab in self.owned if lab not in arms]:
            self._stop(label, "one at a time" if self.cfg.one_at_a_time else "not in the next resident set")
        new = [lab for lab in arms if lab not in self.servers or not self.servers[lab].is_alive()]
        for group in start_groups(new, self.awake.start_awake):
            self._start(group)
            for label in group:
                self._warm_up(label)
            self.awake.sleep(group, self.servers, "the next start group")
        for label in arms:
            if label not in new and not self.record.warmed(label):
                self._warm_up(label)
        fresh = tuple(lab for lab in arms if lab in new or lab not in self.burned)
        if fresh and burn_in:
            self._burn_in(fresh)

    def _start(self, new: list[str]) -> None:
        times: dict[str, tuple[float, float]] = {}
        self.where = f"while starting the {', '.join(new)} server(s)"
        try:
            started = start_servers(self.cfg, new, self.record.run_dir, times, self.place.cpus)
        except StartFailed as exc:
            raise StopRun(f"server {exc.label} failed to start: {exc}") from None
        self.record.started_together(new)
        for label in new:
            self.servers[label] = started[label]
            self.owned.add(label)
            if label not in self.start_order:
                self.start_order.append(label)
            self.record.add_server(label, self.servers[label])
            self.instances.started(label, self.servers[label], *times[label])

    def _warm_up(self, label: str) -> None:
        plan = self.plan
        if not plan.warmup:
            self.record.mark_warmed(label)
            return
        self.where = f"in the warm-up of {label}"
        log.info("warm-up of %s: %d requests over %.1f s", label, len(plan.warmup),
                 plan.warmup_duration_s / plan.warmup_load)
        tags = {"arm": label, "window": -1, "load": plan.warmup_load, "phase": "warmup"}
        reqs = scale_rate(plan.warmup, plan.warmup_load)
        self.awake.only(label, self.servers, f"the warm-up on {label}")  # --sleep-mode: the only one awake
        self._replay(label, reqs, tags, replay_seed(self.cfg.seed, -1, 0), "the warm-up")
        self.record.mark_warmed(label)

    def _burn_in(self, fresh: tuple[str, ...]) -> None:
        """One burn-in cell on the freshly started arms: measured and kept, never compared."""
        step = burnin_step(self.plan.steps, self.loads, fresh)
        entry = self.record.new_burnin(step.window, step.load, step.order)
        n = entry["burnin"]
        window = self.plan.windows[step.window]
        for label in step.order:
            what = f"the burn-in at load {step.load:g}"
            self.where = f"in {what} on {label}"
            log.info("burn-in on %s: window %d at load %g", label, step.window, step.load)
            tags = {"arm": label, "window": step.window, "load": step.load, "phase": "burnin", "burnin": n}
            self._timed_replay(label, step, "burnin", scale_rate(window.requests, step.load), tags,
                               burnin_seed(self.cfg.seed, n), what)
            entry["done"].append(label)
            self.burned.add(label)
            self.record.save()

    def _knee_search(self) -> None:
        """experiments.runner.kneesearch on the baseline arm; then the schedule is rebuilt at the loads
        it chose (kept as they are when it finds none)."""
        cfg = self.cfg
        decided = kneesearch.search(cfg, self.plan.windows, self._knee_replay)
        self.record.set_knee(decided)
        loads = decided["loads"]
        if loads:
            log.info("knee of %s at %.3gx: measuring at %s", decided["tier"], decided["knee"], loads)
            self.plan.steps = build_schedule(cfg.windows, loads, cfg.labels, False, cfg.blocks, cfg.seed,
                                             self.plan.sets, self.instances.n)
            self.loads = tuple(loads)
            self.bar.total = sum(len(s.order) for s in self.plan.steps)
        else:
            log.info("knee search: %s; measuring at --loads %s", decided["reason"], cfg.loads)
        self.record.save()

    def _knee_replay(self, factor: float, j: int, window: Window) -> list[RequestRecord]:
        """One window of the knee search at `factor` (its `j`-th) on the baseline arm."""
        label = self.cfg.labels[0]
        what = f"the knee search at load {factor:g}"
        self.where = f"in {what} on {label}"
        log.info("knee search on %s: window %d at load %g", label, window.id, factor)
        tags = {"arm": label, "window": window.id, "load": factor, "phase": "knee"}
        seed = knee_seed(self.cfg.seed, j, window.id)
        return self._timed_replay(label, Step(window.id, factor, j, (label,)), "knee",
                                  scale_rate(window.requests, factor), tags, seed, what)

    def _timed_replay(self, label: str, step: Step, phase: str, reqs: Sequence, tags: dict, seed: int,
                      what: str) -> list[RequestRecord]:
        """_replay, with its start, wall time, the GPU's clocks after it and the host's signals appended;
        with --sleep-mode the arm's server made the only one awake first, outside all of them."""
        self.awake.only(label, self.servers, f"{what} on {label}")
        started, probe = time.time(), Probe.of(self.servers[label])
        records = self._replay(label, reqs, tags, seed, what)
        self.record.add_replay({
            "arm": label, "window": step.window, "load": step.load, "phase": phase,
            "started_s": round(started - self.t_start, 3), "wall_s": round(time.time() - started, 3),
            "gpu": gpu_state(), "host": probe.finish()})
        return records

    def _replay_step(self, step: Step, label: str) -> None:
        window = self.plan.windows[step.window]
        what = f"window {step.window} at load {step.load:g}"
        self.where = f"in {what} on {label}"
        self.awake.only(label, self.servers, f"{what} on {label}")  # before the hook looks at the servers
        if self.before_replay is not None:
            self.before_replay(step, label, self.servers)
        log.info("replay %s on %s: %d requests over %.1f s", what, label, len(window.requests),
                 window.duration_s / step.load)
        tags = {"arm": label, "window": step.window, "load": step.load, "phase": "measure"}
        before = self._scrape(label)
        reqs = scale_rate(window.requests, step.load)
        self._timed_replay(label, step, "measure", reqs, tags,
                           replay_seed(self.cfg.seed, step.window, step.load_index), what)
        after = self._scrape(label)
        if before is not None and after is not None:
            try:
                self.record.add_histogram(label, step.load, difference(before, after))
            except ValueError as exc:
                self.record.warn(f"step histogram of {label} in {what}: {exc}")
        step.done.append(label)
        self.record.save()
        self.bar.update(1)

    def _replay(self, label: str, reqs: Sequence, tags: dict, seed: int, what: str) -> list[RequestRecord]:
        server = self.servers[label]
        try:
            outcome: list[RequestRecord] | BaseException = replay_sync(server.url, reqs, ReplayOptions(
                out=self.record.requests_path, model=server.model_name,
                tags={**tags, **self.instances.tags(label)},
                timeout_s=self.cfg.request_timeout_s, seed=seed, progress=self.cfg.progress,
                vocab_size=self.plan.vocab_size, prompts=self.prompts))
        except (OSError, RuntimeError, ValueError) as exc:  # ReplayStopped among them
            outcome = exc
        return settle(self.record, label, server, what, outcome)

    def _scrape(self, label: str) -> CumulativeHistogram | None:
        try:
            return scrape(self.servers[label].url)
        except (OSError, ValueError) as exc:
            self.record.warn(f"could not read /metrics of {label}: {exc}")
            return None


def run_experiment(cfg: RunConfig, *, argv: Sequence[str] | None = None,
                   servers: Mapping[str, Server] | None = None,
                   before_replay: BeforeReplay | None = None, analyze: bool = True, n_instances: int = 1,
                   design: dict | None = None) -> Path:
    """Run the experiment `cfg` describes; return its run directory (run.json, records, report).

    `servers`: already-healthy servers for every label (resident mode only); they are used and left
    running (each is warmed up and burnt in first, like a server the run starts). `before_replay` is
    called before every measured replay (a hook for tests and tools). `n_instances`: server instances
    per arm (experiments.runner.instances), `design` the record of the design that chose them.
    Raises ConfigError/TraceError before any server starts; never raises for a failed run
    (status "partial" with stopped_reason in run.json).
    """
    instances.check(cfg, n_instances, servers is not None)
    place = placement.placement_for(cfg, n_instances)
    plan = prepare(cfg, n_instances)
    keys = duetrun.slot_keys(cfg) if cfg.layout == "duet" else list(cfg.labels)
    if servers is not None and (cfg.one_at_a_time or set(servers) != set(keys) or len(plan.sets) > 1):
        raise ValueError(f"servers must map every label (a duet: every server) {keys} and the run must be "
                         "resident, every arm at once")
    prompts, prompt_record = prompt_source(cfg, plan.vocab_size)
    run_dir = make_run_dir(cfg)
    record = RunRecord.create(run_dir, plan, argv)
    record.set_design(prompt_record, design,
                      place.to_json() if cfg.pin_cpus or cfg.start_order != "waves" else None)
    write_json(run_dir / "environment.json", capture_environment(cfg.trace, cfg.model_dir))
    for label, server in (servers or {}).items():
        record.add_server(label, server)
    log.info("run %s: %d windows x %d loads x %d arms, %s", run_dir, len(plan.windows), len(cfg.loads),
             len(cfg.labels), record.run.mode_note or "A/B")
    for line in readiness.summary(plan.design):
        log.info("%s", line)
    runner = (duetrun.DuetRunner(plan, record, servers, before_replay, prompts) if cfg.layout == "duet" else
              Runner(plan, record, servers, before_replay, prompts, n_instances, place))
    with logging_redirect_tqdm(), closing.sigterm_as_interrupt(), placement.pinned(place.of(placement.KIT)):
        try:
            runner.execute()
            status, reason = "complete", None
        except StopRun as exc:
            log.error("run stopped: %s", exc)
            status, reason = "partial", str(exc)
        except KeyboardInterrupt:
            log.error("interrupted %s", runner.where)
            status, reason = "partial", f"{closing.INTERRUPTED} {runner.where}"
        except OSError as exc:  # the run's own files could not be written (a full disk)
            log.error("could not write to %s %s: %s", run_dir, runner.where, exc)
            status, reason = "partial", f"could not write to {run_dir} {runner.where}: {exc.strerror or exc}"
        except Exception as exc:
            closing.close(runner, record, "partial", f"internal error {runner.where}: {exc!r}")
            raise
        problems = closing.close(runner, record, status, reason)
        if problems:
            raise closing.not_finished(record, reason, problems)
        if analyze and record.run.analysis_error is None:
            closing.analyze(record)
    return run_dir
