"""Results files of the kit: written atomically, read back with their schema version checked.

Every JSON results file (kernel results, policy tables, step profiles, run.json, report.json) carries
`schema_version`; a reader names the file and the version it knows when they differ, and a file
that is missing, truncated or not JSON gets one error naming it. A name ending in `.xz` or `.gz` is
compressed (COMPRESSED), written and read the same way; a file committed compressed (the evidence over
20 kB, docs/DESIGN.md) is read by its plain name too: `read_json("report.json")` reads report.json.xz
where report.json is absent (`stored`).
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import zlib
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

from common.atomicfile import write_atomic

# suffix -> module with compress/decompress/open: xz for the evidence committed compressed (records,
# logs, bulky JSON: a third smaller than gzip on the request records), gzip for files written before
COMPRESSED = {".xz": lzma, ".gz": gzip}
# what a truncated or corrupt compressed file raises on reading
COMPRESSION_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError)


def stored(path: str | Path) -> Path:
    """Where `path` is kept: itself if it exists, else the first of its name with .xz, with .gz and
    without either that does (a file committed compressed, or recompressed: `x.json.gz` finds
    x.json.xz), else `path`."""
    path = Path(path)
    if path.exists():
        return path
    base = path.with_suffix("") if path.suffix in COMPRESSED else path
    found = (c for c in [*(base.with_name(base.name + s) for s in COMPRESSED), base] if c.exists())
    return next(found, path)


def open_bytes(path: str | Path) -> IO[bytes]:
    """A file opened for reading where it is kept (`stored`), decompressed where that name ends in
    `.xz` or `.gz`."""
    path = stored(path)
    return COMPRESSED[path.suffix].open(path, "rb") if path.suffix in COMPRESSED else path.open("rb")


def open_text(path: str | Path, errors: str | None = None) -> IO[str]:
    """open_bytes as UTF-8 text."""
    return io.TextIOWrapper(open_bytes(path), encoding="utf-8", errors=errors)


def _compress(path: Path, body: bytes) -> bytes:
    if path.suffix == ".gz":
        return gzip.compress(body, mtime=0)  # no timestamp: the same data gives the same bytes
    return lzma.compress(body) if path.suffix == ".xz" else body


def compress_file(path: str | Path, suffix: str = ".xz") -> Path | None:
    """Compress `path` to `path` + `suffix` (atomically) and remove it; None when there is no file."""
    path = Path(path)
    if not path.is_file():
        return None
    packed = path.with_name(path.name + suffix)
    write_atomic(packed, _compress(packed, path.read_bytes()))
    path.unlink()
    return packed


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
    the old file or the new one, never half of one); compressed where the name ends in `.xz` or `.gz`. NaN and
    infinities are refused unless `allow_nan` (a raw file that keeps every sample as it came);
    `indent=None` writes one line (the kernel benchmark's large raw-sample files keep that layout)."""
    path = Path(path)
    body = (json.dumps(data, indent=indent, allow_nan=allow_nan) + "\n").encode("utf-8")
    write_atomic(path, _compress(path, body))


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (same rule as write_json)."""
    write_atomic(path, text)


def read_json(path: str | Path, schema_version: int | Collection[int] | None, what: str) -> dict:
    """The JSON object in `path` (a `what`, e.g. "step profile"), its schema_version checked against
    `schema_version` (one version or the versions a reader knows; None: no check); ResultFileError
    naming the file otherwise. A plain name absent but committed compressed reads that (`stored`)."""
    path = stored(path)
    try:
        with open_bytes(path) as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such {what} file") from None
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}:{exc.lineno}: {what} is not valid JSON ({exc.msg}); "
                              "truncated or corrupt?") from None
    except (OSError, *COMPRESSION_ERRORS, UnicodeDecodeError) as exc:
        raise ResultFileError(f"{path}: cannot read {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise ResultFileError(f"{path}: {what} must be a JSON object, got {type(doc).__name__}")
    known = {schema_version} if isinstance(schema_version, int) else set(schema_version or ())
    if schema_version is not None and doc.get("schema_version") not in known:
        raise ResultFileError(f"{path}: {what} schema_version {doc.get('schema_version')!r}; this reader "
                              f"knows {', '.join(map(str, sorted(known)))}")
    return doc
