"""Reading a run directory's request records back (run.json itself: experiments.core.runfile).

One reader for every consumer (experiments.analyze for the report, experiments.stats.runframe for a
user's DataFrame). `check_records` finds what makes a records
file damaged (missing, a torn last line, a key recorded twice, a finished cell with the wrong count).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.jsonfile import COMPRESSION_ERRORS, ResultFileError
from experiments.core.runfile import Run, count, positive, shown
from loadgen.records import RequestRecord, read_records, read_whole_records

# what a finished run writes, what one finished before the records were xz wrote, and a running one
RECORD_FILES = ("requests.jsonl.xz", "requests.jsonl.gz", "requests.jsonl")


PHASES = ("warmup", "burnin", "knee", "measure")  # what a run's records are tagged with, in run order
REQUIRED_TAGS = ("arm", "window", "load", "phase")  # every record of a run carries these


# the tags of a run's records: (test, what the tag must be)
_TAGS = {"arm": (lambda v: isinstance(v, str), "a string"),
         "window": (lambda v: type(v) is int, "an integer"),  # -1: the warm-up
         "load": (positive, "a finite number > 0"),
         "phase": (lambda v: v in PHASES, f"one of {', '.join(PHASES)}"),
         "instance": (count, "an integer >= 0"), "burnin": (count, "an integer >= 0")}


def _record_check(run: Run) -> Callable[[RequestRecord], str | None]:
    """What is wrong with a record against run.json (None: nothing): a tag of the run missing or of the
    wrong type, an index past the requests of the window (or the warm-up) its phase replays."""
    requests = run.window_requests()
    warmup = (run.warmup or {}).get("requests")

    def problem(r: RequestRecord) -> str | None:
        t = r.tags
        lacking = [k for k in REQUIRED_TAGS if k not in t]
        if lacking:
            return f"tags lack {', '.join(lacking)}"
        for key, (ok, what) in _TAGS.items():
            if key in t and not ok(t[key]):
                return f"tags.{key} must be {what}, got {shown(t[key])}"
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


def check_records(run_dir: Path, run: Run, accept_damaged: bool = False) -> CheckedRecords:
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


def _checked(run_dir: Path, run: Run) -> CheckedRecords:
    done = run.done_cells()
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
    expected = run.window_requests()
    wrong = [f"{lab} window {w} load {ld:g}: {counts.get((lab, w, ld), 0)} of {expected.get(w)}"
             for lab, w, ld in done if counts.get((lab, w, ld), 0) != expected.get(w)]
    if wrong:
        damage.append(f"{path.name}: {len(wrong)} cells run.json lists as finished hold another number of "
                      f"records than their window's requests (first: {wrong[0]})")
    return CheckedRecords(kept, path.name, tuple(damage))
