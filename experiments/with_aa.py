"""An A/B run and its own A/A noise floor from one set of server starts (`run.py --with-aa`).

Three servers are started in turn with identical flags (stock, patched, a second stock); the A/B
run (stock vs patched) and then the A/A run (stock vs the second stock) replay the same windows at
the same loads. The A/B report takes the A/A report as its noise floor. On a GPU, where a server
start costs minutes, this measures both for the price of three starts instead of four.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from experiments.analyze import analyze_run
from experiments.config import ConfigError, RunConfig
from experiments.orchestrate import run_experiment, sigterm_as_interrupt, start_arm
from experiments.plan import prepare
from experiments.runrecord import default_name
from integration.launcher import VllmServer

log = logging.getLogger(__name__)


def aa_config(ab: RunConfig) -> RunConfig:
    """The A/A twin of an A/B config: same everything, arms stock,stock, name `<name>-aa`."""
    return dataclasses.replace(ab, arms=("stock", "stock"), name=f"{ab.name}-aa")


def run_with_aa(cfg: RunConfig, argv: Sequence[str] | None = None) -> tuple[Path, Path]:
    """Run the A/B experiment `cfg` and its A/A twin on shared servers; return (ab_dir, aa_dir).

    Server logs go to `<results_dir>/<name>-servers/`. Raises ConfigError before any server
    starts when `cfg` is not a resident stock,patched run.
    """
    if cfg.arms != ("stock", "patched") or cfg.one_at_a_time:
        raise ConfigError("--with-aa needs --arms stock,patched and resident servers (no --one-at-a-time)")
    ab = dataclasses.replace(cfg, name=cfg.name or default_name(cfg))
    aa = aa_config(ab)
    prepare(ab)  # bad trace or flags fail here, before any server starts
    log_dir = Path(ab.results_dir) / f"{ab.name}-servers"
    for run in (ab, aa):
        if (Path(run.results_dir) / run.name).exists():
            raise ConfigError(f"{Path(run.results_dir) / run.name} already exists; choose another --name")
    servers: list[VllmServer] = []
    with sigterm_as_interrupt():
        try:
            for label, arm, run in (("stock", "stock", ab), ("patched", "patched", ab), ("stock-b", "stock", aa)):
                servers.append(start_arm(run, label, arm, log_dir))
            stock, patched, stock_b = servers
            ab_dir = run_experiment(ab, argv=argv, servers={"stock": stock, "patched": patched}, analyze=False)
            aa_dir = run_experiment(aa, argv=argv, servers={"stock-a": stock, "stock-b": stock_b})
        finally:
            for server in servers:
                server.stop()
    analyze_run(ab_dir, list(ab.slos) if ab.slos else None, aa_report=aa_dir / "report.json")
    log.info("A/B %s with A/A noise floor %s", ab_dir, aa_dir)
    return ab_dir, aa_dir
