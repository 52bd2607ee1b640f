"""Start, watch and stop one vLLM OpenAI-compatible server per experiment arm.

What an arm is (plugin on or off, IR-op priority) is defined in integration/arms.py; everything else
about the servers of a run is identical: same model config, same flags, same KV-cache size.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import aiohttp

from integration import arms, compilecache, serverflags

MODELS_DIR = Path(__file__).resolve().parent / "models"


class ServerDied(RuntimeError):
    """The server process exited; the message carries its exit code and log tail."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything that defines one server; two arms differ only in `arm` (integration.arms.get
    resolves a name into one)."""

    model_dir: Path
    arm: arms.Arm
    port: int
    host: str = "127.0.0.1"
    dtype: str = "auto"
    eager: bool = False
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    cpus: tuple[int, ...] = ()  # the cores the server and every process it spawns run on (empty: any)

    def __post_init__(self) -> None:
        if not isinstance(self.arm, arms.Arm):
            raise TypeError(f"ServerConfig.arm: an integration.arms.Arm (integration.arms.get resolves a "
                            f"name), got {self.arm!r}")
        if not (Path(self.model_dir) / "config.json").is_file():
            raise FileNotFoundError(f"model dir {self.model_dir} has no config.json")
        if self.host != "127.0.0.1":
            raise ValueError("servers listen on 127.0.0.1 only")
        check_server_args(self.extra_args)
        serverflags.check_listen_address(self.arm.extra_args, f"arm {self.arm.name}: server_args")


# the flags server_command sets itself, from the ServerConfig and the arm; in any spelling vLLM takes
RUN_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--load-format", "--skip-tokenizer-init",
             "--dtype", "--seed", "--enforce-eager", "--gpu-memory-utilization", "--kv-cache-memory-bytes",
             "--max-model-len", "--max-num-seqs", "--compilation-config", "--ir-op-priority")


def check_server_args(args: Sequence[str], where: str = "server arguments") -> None:
    """ValueError naming `where` when the server arguments every arm gets (`--server-arg`) set where
    a server listens or a flag the run sets itself (RUN_FLAGS), which run.json would then misstate."""
    serverflags.check_listen_address(args, where)
    own = serverflags.setting(args, RUN_FLAGS)
    if own:
        raise ValueError(f"{where} {' '.join(own)}: sets what the run sets itself on every server (model, "
                         "dtype, seed, KV cache, context length, compile mode, the arms' kernels: "
                         "integration/launcher.py RUN_FLAGS), so run.json would misstate what ran; use "
                         "run.py's own flag where it has one (--max-model-len, --dtype, --seed, ...)")


def compile_range_args(cfg: "ServerConfig") -> list[str]:
    """`--compilation-config` of a compiled CUDA server (arms.compilation_config: the policy's compile
    ranges for the patched arm, vLLM's single range for stock); empty in eager mode and without
    CUDA, where the provider is unsupported."""
    if cfg.eager or not _cuda_available():
        return []
    cc = arms.compilation_config(cfg.model_dir, cfg.dtype, arm=cfg.arm)
    return ["--compilation-config", json.dumps(cc)]


def compile_cache(arm: arms.Arm, eager: bool) -> tuple[tuple[str, str], ...] | None:
    """The compile cache a CUDA server of `arm` writes and reads: its integration.compilecache
    variables (empty: vLLM's default caches, which every arm outside the kit's policy shares); None in
    eager mode, where nothing is compiled. Servers with the same cache should not start together."""
    if eager:
        return None
    return tuple(sorted(compilecache.cache_env(arm, eager, True).items()))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


WEIGHT_FILES = ("*.safetensors", "*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def has_weights(model_dir: Path) -> bool:
    """Whether a model directory holds weights (Hugging Face format); without them, random weights."""
    return any(next(Path(model_dir).glob(pattern), None) is not None for pattern in WEIGHT_FILES)


def has_tokenizer(model_dir: Path) -> bool:
    """Whether a model directory holds a tokenizer (then prompts can be text)."""
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def model_load_args(model_dir: Path) -> list[str]:
    """How vLLM loads the model: its weights where the directory has them, else random weights
    (`--load-format dummy`); without a tokenizer, prompts are token ids (`--skip-tokenizer-init`)."""
    args = [] if has_weights(model_dir) else ["--load-format", "dummy"]
    return args + ([] if has_tokenizer(model_dir) else ["--skip-tokenizer-init"])


def server_command(cfg: ServerConfig) -> list[str]:
    """The full command line of the vLLM OpenAI server for `cfg`."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(cfg.model_dir),
        "--served-model-name", Path(cfg.model_dir).name,
        "--host", cfg.host, "--port", str(cfg.port),
        *model_load_args(cfg.model_dir),
        "--dtype", cfg.dtype, "--seed", str(cfg.seed),
    ]
    if cfg.eager:
        cmd.append("--enforce-eager")
    if cfg.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.kv_cache_memory_bytes is not None:
        cmd += ["--kv-cache-memory-bytes", str(cfg.kv_cache_memory_bytes)]
    if cfg.max_model_len is not None:
        cmd += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(cfg.max_num_seqs)]
    return cmd + compile_range_args(cfg) + cfg.arm.server_args(cfg.eager) + list(cfg.extra_args)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """One vLLM server process with its log captured to a file."""

    def __init__(self, config: ServerConfig, log_path: Path) -> None:
        self.config = config
        self.log_path = Path(log_path)
        self.url = f"http://{config.host}:{config.port}"
        self.model_name = Path(config.model_dir).name
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Launch the server in its own process group (so stop() reaches its workers too)."""
        arm = self.config.arm
        arms.check_plugin_installed(arm)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **arm.env(), **compilecache.cache_env(arm, self.config.eager, _cuda_available()),
               **dict(self.config.extra_env)}
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = open(self.log_path, "ab")
        log.write(f"$ {' '.join(server_command(self.config))}\n".encode())
        log.flush()
        cpus = set(self.config.cpus)
        self.proc = subprocess.Popen(
            server_command(self.config), stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,  # before vLLM starts
        )
        log.close()

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        """The last `n` lines of the server log."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))

    def _died(self) -> ServerDied:
        code = self.proc.returncode if self.proc else None
        return ServerDied(f"vLLM server ({self.config.arm.name}, port {self.config.port}) exited "
                          f"with code "
                          f"{code}; log {self.log_path}, last lines:\n{self.log_tail()}")

    def check_alive(self) -> None:
        """Raise ServerDied (with the log tail) if the process has exited."""
        if not self.is_alive():
            raise self._died()

    def wait_healthy(self, timeout_s: float = 600.0) -> None:
        """Block until GET /health answers 200; raise ServerDied or TimeoutError with the log tail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if asyncio.run(_healthy(self.url)):
                return
            time.sleep(1.0)
        raise TimeoutError(f"vLLM server not healthy after {timeout_s:.0f} s; log {self.log_path}, "
                           f"last lines:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the group's id is the server's pid (its own session)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self.kill()  # workers that outlived the front-end

    def kill(self) -> None:
        """SIGKILL the server and every process it started (its process group), at once."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def launch(self, timeout_s: float = 600.0) -> "VllmServer":
        """start() and wait_healthy(); a server that fails to come up is stopped before the error."""
        self.start()
        try:
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


async def _healthy(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            async with s.get(f"{url}/health") as r:
                return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False
