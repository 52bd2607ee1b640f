"""What a results file records about the machine: GPU, driver, versions, clocks."""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
import sys

from common.cliargs import fail

_SMI_FIELDS = "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,temperature.gpu,power.draw,pstate"


def smi(query: str) -> list[str] | str:
    """One line of `nvidia-smi --query-gpu=<query>` split on commas, or the error text."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return f"nvidia-smi exit {out.returncode}: {out.stderr.strip()}"
    return [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]


def clocks() -> dict | str:
    """Current clocks, temperature and power of GPU 0 (nvidia-smi), as strings with units."""
    vals = smi(_SMI_FIELDS)
    if isinstance(vals, str):
        return vals
    return dict(zip(_SMI_FIELDS.split(","), vals))


def describe(vllm_version: str | None) -> dict:
    """GPU, driver, CUDA, torch, CuPy, vLLM and Python versions of this process."""
    import torch  # here, not at the top: the analysis imports gpu_slug on machines without torch

    props = torch.cuda.get_device_properties(0)
    driver = smi("driver_version")
    try:
        import cupy
        cupy_version = cupy.__version__
    except ImportError:
        cupy_version = None
    return {
        "gpu": props.name, "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None), "memory_bytes": props.total_memory,
        "driver": driver[0] if isinstance(driver, list) else driver,
        "cuda": torch.version.cuda, "torch": torch.__version__, "cupy": cupy_version,
        "vllm": vllm_version, "python": sys.version.split()[0], "platform": platform.platform(),
    }


def gpu_slug(name: str) -> str:
    """The short name results files of a GPU carry: 'NVIDIA H200' -> 'h200',
    'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    words = re.sub(r"^(nvidia|amd)\s+", "", name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-") or "unknown-gpu"


def gpu_missing(prog: str) -> bool:
    """True, after saying so on stderr under `prog`'s name, when this process sees no CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return False
    fail(prog, "no CUDA GPU visible (torch.cuda.is_available() is False)")
    return True


def width_list(text: str) -> set[int]:
    """The argparse type of a --hidden flag: a comma list of hidden sizes."""
    try:
        return {int(w) for w in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of integers") from None
