"""run.json: the run's record, written at the start and rewritten atomically after every replay.

The layout is the "experiments run directory" contract that experiments/analyze.py reads.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Sequence

from experiments.config import ConfigError, RunConfig
from experiments.metrics_scrape import accumulate
from experiments.plan import Plan
from integration.launcher import VllmServer, server_command
from kernels.resultfile import write_json

RUN_SCHEMA_VERSION = 1  # run.json's format; experiments.analyze.load_run checks it
TOOL_VERSION = "0.1.0"
CPU_NOTE = ("A/A run: on CPU the patched arm's fused RMSNorm (a CUDA kernel) is not available, so the "
            "patched arm falls back to stock everywhere and both arms run the same kernels; differences "
            "between them measure the noise floor, not the kernel.")
AA_NOTE = ("A/A run: both arms run stock vLLM, so every difference between them is noise "
           "(the noise floor of this setup).")


def mode_note(cfg: RunConfig) -> str | None:
    """Why the run is A/A (CPU fallback or stock,stock), None for a real A/B run."""
    if cfg.arms[0] == cfg.arms[1]:
        return AA_NOTE + (" It runs on CPU." if cfg.device == "cpu" else "")
    return CPU_NOTE if cfg.device == "cpu" else None


def patched_policy(cfg: RunConfig) -> dict | None:
    """The shape policy the patched arm dispatches by (None on CPU, where the provider is
    unsupported, and when no arm is patched)."""
    if cfg.device == "cpu" or "patched" not in cfg.arms:
        return None
    from integration import arms

    return arms.policy_record(cfg.model_dir, cfg.dtype, "eager" if cfg.eager else "compiled")


def default_name(cfg: RunConfig) -> str:
    """Timestamp-based run name, e.g. 20261202-153012-cpu-tiny-llama."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.device}-{Path(cfg.model_dir).name}"


def make_run_dir(cfg: RunConfig) -> Path:
    """Create results_dir/<name>; ConfigError if it already holds files (runs are never overwritten)."""
    run_dir = Path(cfg.results_dir) / (cfg.name or default_name(cfg))
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"{run_dir} already exists and is not empty; choose another --name")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class RunRecord:
    """The run.json dict of one run directory, with helpers that update and save it."""

    def __init__(self, run_dir: Path, data: dict, plan: Plan) -> None:
        self.run_dir, self.data, self._plan = Path(run_dir), data, plan
        self.requests_path = self.run_dir / "requests.jsonl"
        self._warmed: set[str] = set()

    @classmethod
    def create(cls, run_dir: Path, plan: Plan, argv: Sequence[str] | None) -> "RunRecord":
        """The initial run.json (status "running"), saved."""
        cfg = plan.cfg
        data = {
            "schema_version": RUN_SCHEMA_VERSION, "tool_version": TOOL_VERSION,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": list(argv) if argv is not None else None,
            "config": cfg.to_json(),
            "trace": {"path": str(cfg.trace), "sha256": plan.trace_sha256, "requests": plan.trace_requests},
            "model": {"name": Path(cfg.model_dir).name, "dir": str(cfg.model_dir),
                      "config": plan.model_config, "dtype": cfg.dtype, "eager": cfg.eager},
            "device": cfg.device, "mode_note": mode_note(cfg),
            "arms": list(cfg.arms), "arm_labels": list(cfg.labels),
            "windows": [w.to_json() for w in plan.windows], "loads": list(cfg.loads),
            "warmup": {"requests": len(plan.warmup), "duration_s": plan.warmup_duration_s,
                       "start_s": plan.warmup_start_s, "load": plan.warmup_load},
            "clipping": {"max_input_tokens": cfg.max_input_tokens, "max_output_tokens": cfg.max_output_tokens,
                         "clipped_requests": plan.clipped_requests},
            "resident": not cfg.one_at_a_time,
            "schedule": [s.to_json() for s in plan.steps],
            "patched_policy": patched_policy(cfg),
            "step_histograms": {}, "status": "running", "stopped_reason": None,
            "servers": {}, "warnings": [], "finished": None,
        }
        rec = cls(run_dir, data, plan)
        rec.save()
        return rec

    def save(self) -> None:
        """Rewrite run.json atomically (the schedule's done lists included)."""
        self.data["schedule"] = [s.to_json() for s in self._plan.steps]
        write_json(self.run_dir / "run.json", self.data)

    def add_server(self, label: str, server: VllmServer) -> None:
        cfg = server.config
        log = server.log_path
        entry = self.data["servers"].setdefault(label, {"starts": 0})
        entry.update({
            "arm": cfg.arm,
            "log": log.name if log.parent.resolve() == self.run_dir.resolve() else str(log),
            "cmd": server_command(cfg), "env": dict(cfg.extra_env), "port": cfg.port,
            "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
        })
        entry["starts"] += 1
        self.save()

    def add_histogram(self, label: str, load: float, hist: dict) -> None:
        per_arm = self.data["step_histograms"].setdefault(label, {})
        per_arm[str(load)] = accumulate(per_arm.get(str(load)), hist)

    def warn(self, message: str) -> None:
        self.data["warnings"].append(message)

    def warmed(self, label: str) -> bool:
        return label in self._warmed

    def mark_warmed(self, label: str) -> None:
        self._warmed.add(label)

    def finish(self, status: str, reason: str | None) -> None:
        self.data.update(status=status, stopped_reason=reason,
                         finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        self.save()

    def set_environment_after(self, clocks: dict | None) -> None:
        """Add the GPU clocks seen at the end to environment.json (thermal or power drift shows here)."""
        path = self.run_dir / "environment.json"
        if path.is_file():
            env = json.loads(path.read_text(encoding="utf-8"))
            env["clocks_after"] = clocks
            write_json(path, env)
