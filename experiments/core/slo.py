"""Latency SLOs: a named set of bounds on TTFT, TPOT and optionally end-to-end latency.

A request meets an SLO when it finished without error with exactly the asked number of output
tokens and every bound holds. TPOT is undefined for a 1-token reply; that bound then counts as held.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from loadgen.records import RequestRecord, e2e_ms, succeeded, tpot_ms, ttft_ms

DEFAULT_SLO_FILE = Path(__file__).resolve().parents[1] / "slos.toml"


@dataclass(frozen=True)
class SLO:
    """Latency bounds in milliseconds; ``e2e_ms`` None means no end-to-end bound."""

    name: str
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"SLO name must be non-empty and contain no ':', got {self.name!r}")
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, key)
            if value is None and key == "e2e_ms":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"SLO {self.name!r}: {key} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"SLO {self.name!r}: {key} must be a positive finite number, got {value!r}")

    def describe(self) -> str:
        """Short human form, e.g. 'TTFT<=2000 ms, TPOT<=100 ms'."""
        parts = [f"TTFT<={self.ttft_ms:g} ms", f"TPOT<={self.tpot_ms:g} ms"]
        if self.e2e_ms is not None:
            parts.append(f"E2E<={self.e2e_ms:g} ms")
        return ", ".join(parts)

    def to_json(self) -> dict:
        """JSON-ready dict of the bounds."""
        return {"name": self.name, "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}


def parse_slo(text: str) -> SLO:
    """Parse 'name:ttft_ms:tpot_ms[:e2e_ms]', e.g. 'chat:2000:100'; raises ValueError saying what is wrong."""
    parts = text.strip().split(":")
    if len(parts) not in (3, 4):
        raise ValueError(
            f"bad SLO {text!r}: expected 'name:ttft_ms:tpot_ms[:e2e_ms]' (3 or 4 fields), got {len(parts)}"
        )
    name, *numbers = parts
    keys = ("ttft_ms", "tpot_ms", "e2e_ms")
    values: list[float] = []
    for key, raw in zip(keys, numbers):
        try:
            values.append(float(raw))
        except ValueError:
            raise ValueError(f"bad SLO {text!r}: {key} {raw!r} is not a number") from None
    try:
        return SLO(name.strip(), *values)
    except ValueError as exc:
        raise ValueError(f"bad SLO {text!r}: {exc}") from None


def load_slo_file(path: str | Path = DEFAULT_SLO_FILE) -> list[SLO]:
    """SLO tiers from a TOML file of [[slo]] tables (name, ttft_ms, tpot_ms, optional e2e_ms); ValueError
    naming the file, and --slo-file (how run.py and analyze.py are given one) for any but the default."""
    path = Path(path)
    where = str(path) if path == DEFAULT_SLO_FILE else f"--slo-file {path}"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: cannot read (not UTF-8 text: byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML: {exc}") from None
    tables = data.get("slo")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"{where}: expected one or more [[slo]] tables")
    stray = sorted(set(data) - {"slo"})
    if stray:  # a misspelled [[sol]] would drop its tier from the report unseen
        raise ValueError(f"{where}: unknown top-level key(s) {', '.join(stray)}; expected only [[slo]] "
                         "tables")
    slos: list[SLO] = []
    for i, table in enumerate(tables, start=1):
        if not isinstance(table, dict):
            raise ValueError(f"{where}: [[slo]] #{i} is not a table, got {table!r}")
        unknown = sorted(set(table) - {"name", "ttft_ms", "tpot_ms", "e2e_ms"})
        missing = [k for k in ("name", "ttft_ms", "tpot_ms") if k not in table]
        if unknown or missing:
            raise ValueError(f"{where}: [[slo]] #{i}: missing {missing}, unknown {unknown}")
        try:
            slos.append(SLO(str(table["name"]), table["ttft_ms"], table["tpot_ms"], table.get("e2e_ms")))
        except ValueError as exc:
            raise ValueError(f"{where}: [[slo]] #{i}: {exc}") from None
    names = [s.name for s in slos]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: duplicate SLO names in {names}")
    return slos


def meets(record: RequestRecord, slo: SLO) -> bool:
    """True when the request succeeded (exact output length, no error) and every bound of ``slo`` holds."""
    if not succeeded(record):
        return False
    ttft = ttft_ms(record)
    if ttft is None or ttft > slo.ttft_ms:
        return False
    tpot = tpot_ms(record)
    if tpot is None and (record.completion_tokens or 0) >= 2:
        return False  # 2+ tokens but no token timestamps: cannot show the bound holds
    if tpot is not None and tpot > slo.tpot_ms:
        return False
    if slo.e2e_ms is not None:
        e2e = e2e_ms(record)
        if e2e is None or e2e > slo.e2e_ms:
            return False
    return True
