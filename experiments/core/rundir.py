"""Reading a run directory back: run.json with its version and keys checked, and its request records.

One reader for every consumer (experiments.analyze for the report, experiments.stats.runframe for a
user's DataFrame); the writer is experiments.runner.runrecord. `check_records` finds what makes a records
file damaged (missing, a torn last line, a key recorded twice, a finished cell with the wrong count).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.jsonfile import COMPRESSION_ERRORS, ResultFileError, read_json, stored
from loadgen.records import RequestRecord, read_records, read_whole_records

RUN_SCHEMA_VERSION = 1  # run.json's format (runner.runrecord writes it, read_run_record checks it)
# what a finished run writes, what one finished before the records were xz wrote, and a running one
RECORD_FILES = ("requests.jsonl.xz", "requests.jsonl.gz", "requests.jsonl")


PHASES = ("warmup", "burnin", "knee", "measure")  # what a run's records are tagged with, in run order
REQUIRED_TAGS = ("arm", "window", "load", "phase")  # every record of a run carries these


def read_run_record(run_dir: Path) -> dict:
    """run.json of a run directory; rejects unknown schema versions, missing keys and values of the
    wrong type or range (what the analysis reads), naming the field."""
    path = stored(run_dir / "run.json")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no run.json (is {run_dir} an experiments run directory?)")
    run = read_json(path, RUN_SCHEMA_VERSION, "run record")
    missing = [k for k in ("arms", "arm_labels", "windows", "loads", "schedule", "status") if k not in run]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    problem = _run_problem(run)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return run


def _shown(v: object) -> str:
    return json.dumps(v)[:200]


def _count(v: object) -> bool:
    return type(v) is int and v >= 0


def _positive(v: object) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v > 0


_WINDOW = {"id": (_count, "an integer >= 0"), "requests": (_count, "an integer >= 0"),
           "duration_s": (_positive, "a finite number > 0")}


def _run_problem(run: dict) -> str | None:
    """The first value of run.json of the wrong type or range, or None."""
    labels, arms = run["arm_labels"], run["arms"]
    if not (isinstance(labels, list) and isinstance(arms, list) and len(labels) >= 2 and
            all(isinstance(x, str) and x for x in labels) and len(set(labels)) == len(labels) == len(arms)):
        return f"arm_labels must be two or more distinct labels, one per arm, got {labels} for arms {arms}"
    if not isinstance(run["status"], str):
        return f"status must be a string, got {_shown(run['status'])}"
    for key in ("loads", "windows", "schedule"):
        if not isinstance(run[key], list):
            return f"{key} must be a list, got {_shown(run[key])}"
    for i, load in enumerate(run["loads"]):
        if not _positive(load):
            return f"loads[{i}] must be a finite number > 0, got {_shown(load)}"
    for i, w in enumerate(run["windows"]):
        if not isinstance(w, dict):
            return f"windows[{i}] must be an object, got {_shown(w)}"
        for key, (ok, what) in _WINDOW.items():
            if not ok(w.get(key)):
                return f"windows[{i}].{key} must be {what}, got {_shown(w.get(key))}"
    ids = [w["id"] for w in run["windows"]]
    if len(set(ids)) != len(ids):
        return f"windows: an id given twice in {ids}"
    for i, e in enumerate(run["schedule"]):
        problem = _step_problem(e, ids, run["loads"], labels)
        if problem is not None:
            return f"schedule[{i}]{problem}"
    return None


def _step_problem(e: object, ids: list[int], loads: list[float], labels: list[str]) -> str | None:
    """What is wrong with one schedule entry (its window, load, order and done arms), or None."""
    if not isinstance(e, dict):
        return f" must be an object, got {_shown(e)}"
    if not _count(e.get("window")) or e["window"] not in ids:
        return f".window {_shown(e.get('window'))} is not one of the windows' ids"
    if not _positive(e.get("load")) or e["load"] not in loads:
        return f".load {_shown(e.get('load'))} is not one of the loads"
    for key in ("order", "done"):
        v = e.get(key, [])
        if not (isinstance(v, list) and all(isinstance(x, str) and x in labels for x in v)):
            return f".{key} must be a list of arm_labels, got {_shown(v)}"
    return None


# the tags of a run's records: (test, what the tag must be)
_TAGS = {"arm": (lambda v: isinstance(v, str), "a string"),
         "window": (lambda v: type(v) is int, "an integer"),  # -1: the warm-up
         "load": (_positive, "a finite number > 0"),
         "phase": (lambda v: v in PHASES, f"one of {', '.join(PHASES)}"),
         "instance": (_count, "an integer >= 0"), "burnin": (_count, "an integer >= 0")}


def _record_check(run: dict) -> Callable[[RequestRecord], str | None]:
    """What is wrong with a record against run.json (None: nothing): a tag of the run missing or of the
    wrong type, an index past the requests of the window (or the warm-up) its phase replays."""
    requests = {w["id"]: w["requests"] for w in run["windows"]}
    warmup = (run.get("warmup") or {}).get("requests")

    def problem(r: RequestRecord) -> str | None:
        t = r.tags
        lacking = [k for k in REQUIRED_TAGS if k not in t]
        if lacking:
            return f"tags lack {', '.join(lacking)}"
        for key, (ok, what) in _TAGS.items():
            if key in t and not ok(t[key]):
                return f"tags.{key} must be {what}, got {_shown(t[key])}"
        n, of = (warmup, "the warm-up") if t["phase"] == "warmup" else (requests.get(t["window"]),
                                                                           f"window {t['window']}")
        if isinstance(n, int) and r.index >= n:
            return f"index {r.index} is past the {n} requests of {of}"
        return None
    return problem


def _read_records(path: Path, read=read_records):
    """read_records (or `read`), with a truncated or corrupt compressed file named and said so (not a
    bare EOFError)."""
    try:
        return read(path)
    except COMPRESSION_ERRORS as exc:
        raise ResultFileError(f"{path}: truncated or corrupt compressed file ({exc}): the records after the "
                              "damage are missing; copy the file again from where the run wrote it") from None
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{path}: not UTF-8 text ({exc.reason}); is it a records file?") from None


def load_records(run_dir: Path) -> tuple[list[RequestRecord], str | None]:
    """Records from requests.jsonl.xz, .jsonl.gz or .jsonl (the longest if several exist), and the file
    used."""
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
    check = _record_check(run)

    def read(p: Path) -> tuple[Path, list[RequestRecord], str, list[tuple[int, str]]]:
        bad: list[tuple[int, str]] = []
        records, tail = _read_records(p, lambda q: read_whole_records(q, check, bad))
        return p, records, tail, bad
    path, records, tail, bad = max((read(p) for p in found), key=lambda x: len(x[1]) + len(x[3]))
    damage = []
    if bad:
        damage.append(f"{path.name}: {len(bad)} records with a field of the wrong type or range, left out "
                      f"(first: {path.name}:{bad[0][0]}: {bad[0][1]})")
    if tail:
        damage.append(f"{path.name}:{len(records) + len(bad) + 1}: torn last line ({len(tail)} characters "
                      "without a newline), left out")
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
