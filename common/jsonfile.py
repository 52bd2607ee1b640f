"""Results files of the kit: written atomically, read back with their schema version checked.

Every JSON results file (kernel results, policy tables, step profiles, run.json, report.json) carries
`schema_version`; a reader names the file and the version it knows when they differ, and a file
that is missing, truncated or not JSON gets one error naming it. A name ending in `.gz` is gzip
(the bulky raw files: profiler traces), written and read the same way.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from common.atomicfile import write_atomic


class ResultFileError(ValueError):
    """A results file is missing, unreadable, not JSON, or of a schema version this reader does not know."""


class RepeatedKeys(ValueError):
    """A JSON object names a key more than once (json.loads alone would keep the last silently)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An ``object_pairs_hook`` for json.loads: the object as a dict; RepeatedKeys naming each key
    given more than once."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        keys = [k for k, _ in pairs]
        raise RepeatedKeys(f"key(s) {', '.join(sorted({k for k in keys if keys.count(k) > 1}))} "
                           "given more than once")
    return obj


def project_relative(path: str | Path, root: Path) -> str:
    """`path` relative to `root` (the project) when it lies inside it, so a results file that names it
    stays true on another machine; else as it is."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except (ValueError, OSError):
        return str(path)


def write_json(path: str | Path, data: Any, allow_nan: bool = False, indent: int | None = 1) -> None:
    """Write JSON atomically: a temporary file in the same directory, then os.replace (a crash leaves
    the old file or the new one, never half of one); gzip where the name ends in `.gz`. NaN and
    infinities are refused unless `allow_nan` (a raw file that keeps every sample as it came);
    `indent=None` writes one line (the kernel benchmark's large raw-sample files keep that layout)."""
    path = Path(path)
    body = (json.dumps(data, indent=indent, allow_nan=allow_nan) + "\n").encode("utf-8")
    if path.suffix == ".gz":
        body = gzip.compress(body, mtime=0)  # no timestamp: the same data gives the same bytes
    write_atomic(path, body)


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (same rule as write_json)."""
    write_atomic(path, text)


def read_json(path: str | Path, schema_version: int | Collection[int] | None, what: str) -> dict:
    """The JSON object in `path` (a `what`, e.g. "step profile"), its schema_version checked against
    `schema_version` (one version or the versions a reader knows; None: no check); ResultFileError
    naming the file otherwise."""
    path = Path(path)
    try:
        data = path.read_bytes()
        doc = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such {what} file") from None
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}:{exc.lineno}: {what} is not valid JSON ({exc.msg}); "
                              "truncated or corrupt?") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # gzip: BadGzipFile is an OSError, EOFError a cut
        raise ResultFileError(f"{path}: cannot read {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise ResultFileError(f"{path}: {what} must be a JSON object, got {type(doc).__name__}")
    known = {schema_version} if isinstance(schema_version, int) else set(schema_version or ())
    if schema_version is not None and doc.get("schema_version") not in known:
        raise ResultFileError(f"{path}: {what} schema_version {doc.get('schema_version')!r}; this reader "
                              f"knows {', '.join(map(str, sorted(known)))}")
    return doc
