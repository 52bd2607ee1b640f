"""One way the kit writes an output file whole: atomically, so a crash or Ctrl-C leaves the old file
or the new one, never half of one. Every room may import it (docs/DESIGN.md)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write `data` (str as UTF-8 with its newlines as given) to `path`: a temporary file in the same
    folder, then os.replace; readable by everyone (0644), like a file written the plain way."""
    path = Path(path)
    body = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
