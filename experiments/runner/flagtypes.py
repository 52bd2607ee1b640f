"""The value types of run.py's flags: each turns one flag's text into its value or raises
argparse.ArgumentTypeError saying what was expected."""

from __future__ import annotations

import argparse
import math
import re
import sys

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def byte_size(text: str) -> int:
    """'21474836480', '20GiB' or '512MiB' -> bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected bytes like 21474836480, 20GiB or 512MiB, got {text!r}")
    return int(m.group(1)) * _UNITS[(m.group(2) or "b").lower()]


def loads_list(text: str) -> tuple[float, ...]:
    """'0.5,1,2' -> (0.5, 1.0, 2.0), each finite, > 0 and a normal float (a subnormal one has lost the
    digits it was written with); whether a load fits the trace's windows is checked by the plan."""
    try:
        loads = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated numbers like 0.5,1,2, "
                                         f"got {text!r}") from None
    if not all(math.isfinite(x) and x >= sys.float_info.min for x in loads):
        raise argparse.ArgumentTypeError(f"expected finite numbers > 0, none subnormal (below "
                                         f"{sys.float_info.min:.3g}), got {text!r}")
    return loads


def knee_list(text: str) -> tuple[float, ...]:
    """--knee: loads_list, or 'none' -> () (no knee search)."""
    return () if text.strip().lower() == "none" else loads_list(text)


def arms_list(text: str) -> tuple[str, ...]:
    """'stock,patched' -> ("stock", "patched"); which names are arms is checked by the config."""
    parts = tuple(p.strip() for p in text.split(","))
    if len(parts) < 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected two or more comma-separated arm names, got {text!r}")
    return parts


def gpu_list(text: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1): CUDA device indices as this process sees them (on CPU: server slots)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated device indices like 0,1, "
                                         f"got {text!r}") from None


def endpoint(text: str) -> tuple[str, str]:
    """'NAME=URL' -> (NAME, URL); the URL is checked by the config."""
    name, sep, url = text.partition("=")
    if not sep or not name.strip() or not url.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=URL like stock=http://127.0.0.1:8000, got {text!r}")
    return name.strip(), url.strip()


NO_CLIP = "none"  # the value of --max-input-tokens / --max-output-tokens that turns clipping off


def clip(text: str) -> int | str:
    """A token cap: a positive int, or NO_CLIP for 'none' (or 0)."""
    if text.lower() in (NO_CLIP, "0"):
        return NO_CLIP
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'none', got {text!r}") from None
