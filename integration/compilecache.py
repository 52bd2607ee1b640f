"""Compile caches of their own for the arms whose compiled graphs the kit's policy table decides.

vLLM's compile cache and Inductor's FX-graph cache key a compiled graph on vLLM's config, the IR-op
priority (the provider names) and each provider's source file (the IR lowering pass's uuid in
vllm/compilation/passes/ir/lowering_pass.py), not on the policy table that decides, per compile
range, whether the kit's provider takes a norm call (integration/plugin.py). Two servers that differ
only in their table, such as `patched` and `plugin-idle` (the same provider and compile ranges), or a
run with a new table after one with the old on the same machine, would load each other's compiled
graphs and run the other's choice. So an arm that follows the policy gets cache directories of its
own per resolved table (`VLLM_CACHE_ROOT` and `TORCHINDUCTOR_CACHE_DIR` under
~/.cache/rmsnorm-goodput/compile/<key>): servers of one table still share them (a repeat of an arm
loads the first one's graphs), servers of different tables never do. Other arms keep vLLM's default
caches, as users have. Nothing is set in eager mode or without CUDA, where nothing is compiled with
the provider.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from integration import arms, choice, names

CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")


def table_key(env: Mapping[str, str]) -> str:
    """A short hash of the policy tables a process with environment `env` resolves, per mode
    ($RMSNORM_FUSED_POLICY_COMPILED, then $RMSNORM_FUSED_POLICY, then this GPU's committed table):
    the keyword `all` or `none` as it is, a table file by its contents."""
    parts = []
    for mode in choice.MODES:
        path = choice.policy_path(mode, env=env)
        if path is None or str(path) in (names.ALL_FUSED, names.NONE_FUSED):
            parts.append(f"{mode}={path}")
        elif path.is_file():
            parts.append(f"{mode}={hashlib.sha256(path.read_bytes()).hexdigest()}")
        else:
            parts.append(f"{mode}=missing:{path}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_root() -> Path:
    """Where the per-table caches live: $XDG_CACHE_HOME (default ~/.cache)/rmsnorm-goodput/compile."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rmsnorm-goodput" / "compile"


def cache_env(arm: arms.Arm, eager: bool, cuda: bool) -> dict[str, str]:
    """The cache variables of a server or engine of `arm`: directories keyed by table_key of the
    environment its processes get (this process's, then the arm's own), for an arm that follows the
    policy in a compiled CUDA process; empty otherwise."""
    if eager or not cuda or not arms.uses_policy(arm):
        return {}
    root = cache_root() / table_key({**os.environ, **dict(arm.extra_env)})
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
