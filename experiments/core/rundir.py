"""Reading a run directory back: run.json with its version and keys checked, and its request records.

One reader for every consumer (experiments.analyze for the report, experiments.stats.runframe for a
user's DataFrame); the writer is experiments.runner.runrecord. `check_records` finds what makes a records
file damaged (missing, a torn last line, a key recorded twice, a finished cell with the wrong count).
"""

from __future__ import annotations

import gzip
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common.jsonfile import ResultFileError, read_json
from loadgen.records import RequestRecord, read_records, read_whole_records

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


def _read_records(path: Path, read=read_records):
    """read_records (or `read`), with a truncated or corrupt gzip file named and said so (not a bare
    EOFError)."""
    try:
        return read(path)
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


@dataclass(frozen=True)
class CheckedRecords:
    """A run's records as analysed: the torn last line and repeated keys left out; `damage` says what
    was wrong, one sentence each (empty: the file is whole)."""

    records: list[RequestRecord]
    source: str | None
    damage: tuple[str, ...]


def _key(r: RequestRecord) -> tuple:
    """What names one scheduled request: its arm, window, load, phase and index, and where a run
    replays a window more than once, the server (a duet's GPU, an instance) and the burn-in round."""
    t = r.tags
    return (str(t.get("arm")), t.get("window"), t.get("load"), t.get("phase"), r.index, t.get("gpu"),
            t.get("instance"), t.get("burnin"))


class DamagedRecords(ValueError):
    """A run's records failed their integrity checks (missing, torn, repeated, miscounted)."""


def check_records(run_dir: Path, run: dict, accept_damaged: bool = False) -> CheckedRecords:
    """The records of RUN_DIR checked against themselves and run.json: a missing file (when a cell
    finished), a torn last line, records that repeat a scheduled request's key (`_key`), and cells
    run.json says finished whose measured records are not one per request of their window. Damage
    raises DamagedRecords unless `accept_damaged`."""
    checked = _checked(run_dir, run)
    if checked.damage and not accept_damaged:
        raise DamagedRecords(f"{run_dir}: the records fail their integrity checks, so nothing was analysed: "
                             f"{'; '.join(checked.damage)}; pass --accept-damaged to analyse them anyway "
                             "(the report is then titled damaged)")
    return checked


def _checked(run_dir: Path, run: dict) -> CheckedRecords:
    done = [(lab, int(e["window"]), float(e["load"])) for e in run["schedule"] for lab in e.get("done", [])]
    found = [run_dir / name for name in RECORD_FILES if (run_dir / name).is_file()]
    if not found:
        return CheckedRecords([], None, (f"{run_dir}: no records file ({' or '.join(RECORD_FILES)}) though "
                                         f"run.json lists {len(done)} finished cells",) if done else ())
    path, (records, tail) = max(((p, _read_records(p, read_whole_records)) for p in found),
                                key=lambda x: len(x[1][0]))
    damage = []
    if tail:
        damage.append(f"{path.name}:{len(records) + 1}: torn last line ({len(tail)} characters without a "
                      "newline), left out")
    seen: Counter = Counter()
    kept = []
    for r in records:
        seen[_key(r)] += 1
        if seen[_key(r)] == 1:
            kept.append(r)
    repeats = {k: n for k, n in seen.items() if n > 1}
    if repeats:
        extra = sum(repeats.values()) - len(repeats)
        damage.append(f"{path.name}: {extra} records repeat an (arm, window, load, phase, index, gpu, "
                      f"instance, burn-in) already recorded (first: {next(iter(repeats))}); the first of "
                      "each is analysed")
    counts = Counter((k[0], k[1], k[2]) for k in seen if k[3] == "measure")  # goodput.MEASURE
    expected = {int(w["id"]): int(w["requests"]) for w in run["windows"]}
    wrong = [f"{lab} window {w} load {ld:g}: {counts.get((lab, w, ld), 0)} of {expected.get(w)}"
             for lab, w, ld in done if counts.get((lab, w, ld), 0) != expected.get(w)]
    if wrong:
        damage.append(f"{path.name}: {len(wrong)} cells run.json lists as finished hold another number of "
                      f"records than their window's requests (first: {wrong[0]})")
    return CheckedRecords(kept, path.name, tuple(damage))
