"""run.json: the run's record, written at the start and rewritten atomically after every replay.

The layout is the "experiments run directory" contract that experiments/analyze.py reads.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Sequence

from common.jsonfile import write_json
from experiments.core.runfile import Run
from experiments.runner import readiness
from experiments.runner.config import ConfigError, RunConfig
from experiments.runner.metrics_scrape import accumulate
from experiments.runner.plan import Plan
from experiments.runner.servers import Server, endpoint_urls
from integration.arms import is_planted, policy_table, uses_policy
from integration.endpoint import Endpoint
from integration.launcher import server_command
from integration.names import PROVIDER
from loadgen.records import RequestRecord

TOOL_VERSION = "0.1.0"
MISMATCH_EXAMPLES = 5  # prompt-length mismatches kept as examples in run.json
CPU_NOTE = ("A/A run: on CPU the patched arm's fused RMSNorm (a CUDA kernel) is not available, so the "
            "patched arm falls back to stock everywhere and both arms run the same kernels; differences "
            "between them measure the noise floor, not the kernel.")
AA_NOTE = ("A/A run: every arm runs {arm}, so every difference between them is noise "
           "(the noise floor of this setup).")
NO_TABLE_NOTE = ("A/A for {arms}: GPU {gpu} has no policy table (--allow-no-table), so they declined every "
                 "call and ran stock; their differences from the baseline measure the noise floor, not the "
                 "kernel.")
USER_DECLARED = ("started by the user (--endpoint): the kit did not start it, so what the arm is (its "
                 "kernels, flags, environment) is what the user declared")


def mode_note(cfg: RunConfig) -> str | None:
    """Why the run is A/A (every arm the same, the patched arm's CPU fallback, or a GPU without a policy
    table run with --allow-no-table), None for an A/B run."""
    if len(set(cfg.arms)) == 1:
        return AA_NOTE.format(arm=cfg.arms[0]) + (" It runs on CPU." if cfg.device == "cpu" else "")
    defs = cfg.arm_definitions
    if cfg.device == "cpu" and not cfg.endpoints and all(
            a == defs[0] or (a.provider == PROVIDER and not is_planted(a)) for a in defs[1:]) \
            and defs[0].provider is None:  # a planted arm delays every call on CPU too: an A/B
        return CPU_NOTE
    if cfg.device == "cuda" and cfg.allow_no_table and not cfg.endpoints:
        gpu = readiness.gpu_of(cfg)
        stock = [a.name for a in dict.fromkeys(defs)
                 if uses_policy(a) and policy_table(a, cfg.eager, gpu) is None]
        if stock:
            return NO_TABLE_NOTE.format(arms=", ".join(stock), gpu=gpu)
    return None


def arm_records(cfg: RunConfig) -> dict[str, dict]:
    """label -> the arm's whole definition, its difference from vLLM as shipped and from the first arm,
    the shared flags it sets, and who started its server: a re-analysis needs no arm file."""
    base = cfg.arm_definitions[0]
    urls = endpoint_urls(cfg)
    return {label: {**arm.to_json(), "difference": arm.difference(),
                    "vs_baseline": arm.differences_from(base), "shared_flags_set": arm.shared_flags_set(),
                    "endpoint": urls.get(label),
                    "identity": USER_DECLARED if label in urls else "started by the kit with this definition"}
            for label, arm in cfg.arms_by_label}


def patched_policy(cfg: RunConfig) -> dict | None:
    """The shape policy the patched arm dispatches by (None on CPU, where the provider is
    unsupported, and when no arm is patched)."""
    if cfg.device == "cpu" or "patched" not in cfg.arms:
        return None
    from integration import arms

    patched = cfg.arm_definitions[cfg.arms.index("patched")]  # its own table ('all' with --fuse-all)
    return arms.policy_record(cfg.model_dir, cfg.dtype, "eager" if cfg.eager else "compiled",
                              policy_table(patched, cfg.eager, readiness.gpu_of(cfg)))


def default_name(cfg: RunConfig) -> str:
    """Timestamp-based run name with the device, on a GPU its slug (kernels.environment.gpu_slug), so
    two GPUs' runs never share a name: 20261202-153012-cpu-tiny-llama, 20261207-101500-h200-llama-3.1-8b."""
    where = (readiness.gpu_of(cfg) or "cuda") if cfg.device == "cuda" else cfg.device
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{where}-{Path(cfg.model_dir).name}"


def make_run_dir(cfg: RunConfig) -> Path:
    """Create results_dir/<name>; ConfigError if a --name's folder already holds files (runs are never
    overwritten). Without --name, a folder of its own: default_name, then with -2, -3, ... where runs
    started in the same second took it (made with mkdir, so two processes never share one)."""
    if cfg.name:
        run_dir = Path(cfg.results_dir) / cfg.name
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"{run_dir} already exists and is not empty; choose another --name")
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    Path(cfg.results_dir).mkdir(parents=True, exist_ok=True)
    base, k = default_name(cfg), 1
    while True:
        run_dir = Path(cfg.results_dir) / (base if k == 1 else f"{base}-{k}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            k += 1


class RunRecord:
    """The run's run.json (experiments.core.runfile.Run) in its run directory, with the methods that
    update it and save it."""

    def __init__(self, run_dir: Path, run: Run, plan: Plan) -> None:
        self.run_dir, self.run, self._plan = Path(run_dir), run, plan
        self.requests_path = self.run_dir / "requests.jsonl"
        self._warmed: set[str] = set()

    @classmethod
    def create(cls, run_dir: Path, plan: Plan, argv: Sequence[str] | None) -> "RunRecord":
        """The initial run.json (status "running"), saved."""
        cfg = plan.cfg
        run = Run(
            tool_version=TOOL_VERSION, created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            command=list(argv) if argv is not None else None, config=cfg.to_json(),
            trace={"path": str(cfg.trace), "sha256": plan.trace_sha256, "requests": plan.trace_requests},
            model={"name": Path(cfg.model_dir).name, "dir": str(cfg.model_dir), "config": plan.model_config,
                   "dtype": cfg.dtype, "eager": cfg.eager},
            device=cfg.device, mode_note=mode_note(cfg),
            arms=list(cfg.arms), arm_labels=list(cfg.labels), arm_definitions=arm_records(cfg),
            allow_arm_differences=cfg.allow_arm_differences,
            windows=[w.to_json() for w in plan.windows], loads=list(cfg.loads),
            warmup={"requests": len(plan.warmup), "duration_s": plan.warmup_duration_s,
                    "start_s": plan.warmup_start_s, "load": plan.warmup_load},
            clipping={"max_input_tokens": cfg.max_input_tokens, "max_output_tokens": cfg.max_output_tokens,
                      "clipped_requests": plan.clipped_requests},
            resident=not cfg.one_at_a_time,
            resident_sets=[list(s) for s in plan.sets] if len(plan.sets) > 1 else None,
            schedule=[s.to_json() for s in plan.steps], patched_policy=patched_policy(cfg))
        rec = cls(run_dir, run, plan)
        rec.save()
        return rec

    def save(self) -> None:
        """Rewrite run.json atomically (the schedule's done lists included)."""
        self.run.schedule = [s.to_json() for s in self._plan.steps]
        write_json(self.run_dir / "run.json", self.run.to_json())

    def add_server(self, label: str, server: Server) -> None:
        """Record a server of `label` (one more start); an endpoint's own description goes to
        environment.json."""
        entry = self.run.servers.setdefault(label, {"starts": 0})
        if isinstance(server, Endpoint):
            self._add_endpoint(label, server, entry)
            return
        cfg = server.config
        log = server.log_path
        entry.update({
            "arm": cfg.arm.name,
            "log": log.name if log.parent.resolve() == self.run_dir.resolve() else str(log),
            "cmd": server_command(cfg), "env": dict(cfg.extra_env), "port": cfg.port,
            "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
        })
        entry["starts"] += 1
        self.save()

    def place_server(self, key: str, label: str, gpu: int) -> None:
        """Say which arm a duet's server `key` serves and on which GPU."""
        self.run.servers[key].update(label=label, gpu=gpu)

    def _add_endpoint(self, label: str, server: Endpoint, entry: dict) -> None:
        entry.update({"arm": self.run.arm_of()[label], "endpoint": server.url,
                      "started_by": "user", "served_model": server.model_name,
                      "kv_cache_memory_bytes": None, "gpu_memory_utilization": None})
        entry["starts"] += 1
        try:
            described = server.describe()
        except (OSError, ValueError) as exc:
            described = {"url": server.url, "error": f"{type(exc).__name__}: {exc}"}
        root = (described.get("model") or {}).get("root")
        model_dir = self.run.model["dir"]
        if root and Path(str(root)).resolve() != Path(model_dir).resolve():
            self.warn(f"endpoint {label} serves {root}, not --model {model_dir}: prompts are made for "
                      "--model's tokenizer or vocabulary")
        self._update_environment({"endpoints": {label: described}})
        self.save()

    def set_design(self, prompts: dict, instance_design: dict | None, placement: dict | None) -> None:
        """Where the prompts come from, the design that chose the server instances and the placement's
        levers (with "starts": the labels of each start), before the first server starts."""
        self.run.prompts, self.run.instance_design = prompts, instance_design
        self.run.placement = None if placement is None else {**placement, "starts": []}

    def started_together(self, labels: Sequence[str]) -> None:
        """The labels of one start of servers (run.json "placement", where recorded)."""
        if self.run.placement is not None:
            self.run.placement["starts"].append(list(labels))

    def set_order(self, method: str, seed: int) -> None:
        """How the cells' arm orders were drawn."""
        self.run.order = {"method": method, "seed": seed}

    def set_duet(self, duet: dict) -> None:
        """A duet run's GPUs and their Latin-square schedule."""
        self.run.layout, self.run.duet = "duet", duet

    def new_burnin(self, window: int, load: float, order: Sequence[str], **more) -> dict:
        """A burn-in cell's entry, appended (its "burnin" index, "done" filled as its replays end)."""
        entry = {"burnin": len(self.run.burnin), "window": window, "load": load, "order": list(order),
                 **more, "done": []}
        self.run.burnin.append(entry)
        return entry

    def add_replay(self, entry: dict) -> None:
        """One replay's start, wall time and the host's and GPU's state (run.json "replays")."""
        self.run.replays.append(entry)

    def set_knee(self, decided: dict) -> None:
        """The knee search's decision; the measured loads become the loads it chose, if any."""
        self.run.knee = decided
        if decided["loads"]:
            self.run.loads = list(decided["loads"])

    def start_instances(self, n: int) -> None:
        """run.json "instances" for a run of `n` server instances per arm."""
        self.run.instances = {"count": n, "arms": {}, "differences": {}}

    def set_instance_windows(self, windows: list[list[int]]) -> None:
        self.run.instances["windows"] = windows

    def add_instance(self, label: str, entry: dict) -> list[dict]:
        """One more start of `label`'s server instance (given its "index"); every start of it so far."""
        entries = self.run.instances["arms"].setdefault(label, [])
        entries.append({"index": len(entries), **entry})
        return entries

    def set_instance_differences(self, label: str, differences: dict) -> None:
        """How the starts of `label`'s server instances differ (experiments.runner.instances)."""
        self.run.instances["differences"][label] = differences

    def sleep_switches(self, level: int) -> list[dict]:
        """The list of --sleep-mode's switches (run.json "sleep_mode"), made on first use."""
        if self.run.sleep_mode is None:
            self.run.sleep_mode = {"level": level, "switches": []}
        return self.run.sleep_mode["switches"]

    def no_report(self, why: str) -> None:
        """Why the report is missing and the command that makes it (run.json "analysis_error")."""
        self.run.analysis_error = why

    def _update_environment(self, changes: dict) -> None:
        """Merge `changes` into environment.json (dict values one level deep)."""
        path = self.run_dir / "environment.json"
        if not path.is_file():
            return
        env = json.loads(path.read_text(encoding="utf-8"))
        for key, value in changes.items():
            env[key] = {**env.get(key, {}), **value} if isinstance(value, dict) and isinstance(
                env.get(key), dict) else value
        write_json(path, env)

    def check_prompt_tokens(self, label: str, records: Sequence[RequestRecord]) -> None:
        """Count the records whose server-reported usage.prompt_tokens differs from the trace's
        input_tokens (run.json "prompt_tokens": per arm and in all, with the first examples)."""
        if self.run.prompt_tokens is None:
            self.run.prompt_tokens = {"checked": 0, "mismatched": 0, "per_arm": {}, "examples": []}
        check = self.run.prompt_tokens
        arm = check["per_arm"].setdefault(label, {"checked": 0, "mismatched": 0})
        for r in records:
            if r.prompt_tokens is None:
                continue
            for c in (check, arm):
                c["checked"] += 1
                c["mismatched"] += r.prompt_tokens != r.input_tokens
            if r.prompt_tokens != r.input_tokens and len(check["examples"]) < MISMATCH_EXAMPLES:
                check["examples"].append({**r.tags, "index": r.index, "input_tokens": r.input_tokens,
                                          "prompt_tokens": r.prompt_tokens})

    def add_histogram(self, label: str, load: float, hist: dict) -> None:
        per_arm = self.run.step_histograms.setdefault(label, {})
        per_arm[str(load)] = accumulate(per_arm.get(str(load)), hist)

    def warn(self, message: str) -> None:
        self.run.warnings.append(message)

    def warmed(self, label: str) -> bool:
        return label in self._warmed

    def mark_warmed(self, label: str) -> None:
        self._warmed.add(label)

    def finish(self, status: str, reason: str | None) -> None:
        self.run.status, self.run.stopped_reason = status, reason
        self.run.finished = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.save()

    def set_environment_after(self, clocks: dict | None) -> None:
        """Add the GPU clocks seen at the end to environment.json (thermal or power drift shows here)."""
        self._update_environment({"clocks_after": clocks})
