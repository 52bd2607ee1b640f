"""A tmpfs mounted for one test: a small filesystem to fill, or one made read-only (root only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `path` with mount `options` (size=8k, ro); skips the test where it cannot be."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def make_read_only(path: Path) -> None:
    """Remount the tmpfs at `path` read-only (its files stay)."""
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
