"""Reading a run directory back: run.json with its version and keys checked, and its request records.

One reader for every consumer (experiments.analyze for the report, experiments.stats.runframe for a
user's DataFrame); the writer is experiments.runner.runrecord.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from common.jsonfile import ResultFileError, read_json
from loadgen.records import RequestRecord, read_records

RUN_SCHEMA_VERSION = 1  # run.json's format (runner.runrecord writes it, read_run_record checks it)
RECORD_FILES = ("requests.jsonl.gz", "requests.jsonl")  # what a finished run and a running one write


def read_run_record(run_dir: Path) -> dict:
    """run.json of a run directory; rejects unknown schema versions and missing keys."""
    path = run_dir / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no run.json (is {run_dir} an experiments run directory?)")
    run = read_json(path, RUN_SCHEMA_VERSION, "run record")
    missing = [k for k in ("arms", "arm_labels", "windows", "loads", "schedule", "status") if k not in run]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    labels = run["arm_labels"]
    if len(labels) < 2 or len(set(labels)) != len(labels) or len(run["arms"]) != len(labels):
        raise ValueError(f"{path}: arm_labels must be two or more distinct labels, one per arm, got "
                         f"{labels} for arms {run['arms']}")
    return run


def _read_records(path: Path) -> list[RequestRecord]:
    """read_records, with a truncated or corrupt gzip file named and said so (not a bare EOFError)."""
    try:
        return read_records(path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ResultFileError(f"{path}: truncated or corrupt gzip file ({exc}): the records after the damage "
                              "are missing; copy the file again from where the run wrote it") from None
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{path}: not UTF-8 text ({exc.reason}); is it a records file?") from None


def load_records(run_dir: Path) -> tuple[list[RequestRecord], str | None]:
    """Records from requests.jsonl.gz or requests.jsonl (the longer if both exist), and the file used."""
    found = [run_dir / name for name in RECORD_FILES if (run_dir / name).is_file()]
    if not found:
        return [], None
    loaded = [(_read_records(p), p.name) for p in found]
    return max(loaded, key=lambda x: len(x[0]))
