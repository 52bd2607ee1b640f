"""report.json as one typed object: the only module that writes and reads it.

`Report` holds every top-level entry in report.json's order; `Report.from_json` refuses a key it does
not know, `to_json` gives the same document back (keys, order and values), so a report read and
written again is the same file. A report of an older schema version is upgraded when read, one
function per old version (`UPGRADES[v]` turns version v into v + 1), so renderers see today's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from common.jsonfile import ResultFileError, read_json, write_json

REPORT_SCHEMA_VERSION = 1
# version -> the function that turns a report of that version into the next one; none older than 1 yet
UPGRADES: dict[int, Callable[[dict], dict]] = {}
# entries written only when set: the layout of a duet run; the analysis inputs, noise floor and plots
# of reports written before them (filled in by analyze before every write today)
OPTIONAL = ("noise_floor", "layout", "inputs", "plots", "over_instances", "slow_host", "gpu_share")

Json = dict[str, Any]
TYPED = ("aa", "records", "aa_in_run", "gpu_share", "inputs")  # entries held as dataclasses (the rest: JSON)
LATER_INPUTS = ("planted_steps", "graph_steps", "gpu_steps")  # recorded only when given


@dataclass
class AA:
    """Whether the run is A/A (every arm the same kernel), why, and the interleaved A/A control arms."""

    is_aa: bool
    why: str | None
    controls: list[str]


@dataclass
class AAInRun:
    """The interleaved A/A pair's comparisons: [baseline, its second server], the paired latency
    (metric -> experiments.stats.paired result), goodput (SLO -> comparison) and the per-window
    secondary metrics (metric -> comparison)."""

    pair: list[str]
    paired_latency: dict[str, Json] | None
    goodput: dict[str, Json]
    secondary: dict[str, Json]


@dataclass
class Records:
    """The records file and how many records were not compared."""

    file: str | None
    total: int
    warmup_excluded: int
    burnin_excluded: int = 0
    damage: list[str] | None = None  # what the integrity checks found (analysed anyway: --accept-damaged)


@dataclass
class AnalysisInputs:
    """What the report was derived from besides run.json and the records, as report.json names them
    (paths relative to the project root where inside it; experiments.reporting.inputs reads them back).
    The graph-steps files came later and are recorded only when given."""

    slos: list[Json]
    aa_report: str | None
    patched_policy: str | None
    profile: str | None
    kernel_results: str | None
    planted_steps: str | None = None
    graph_steps: str | None = None
    gpu_steps: str | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AnalysisInputs:
        try:
            return cls(**doc)
        except TypeError as exc:
            raise ResultFileError(f"report: bad \"inputs\" entry ({exc})") from None


@dataclass
class GpuShareRow:
    """One arm and load of the host-bound guard (experiments.stats.gpushare.shares)."""

    arm: str
    load: float
    gaps: int  # token gaps compared
    prefill: int  # gaps left out: a prefill ran in the step
    above_timed: int  # gaps left out: a batch above the largest timed size
    batch_p50: float | None  # over the compared steps, each counted once
    served_step_ms: float | None
    gpu_step_ms: float | None  # the graph step at batch_p50
    gpu_share: float | None  # the median over steps of graph step / served step


@dataclass
class GpuShare:
    """The share of a served decode step that is GPU time, per arm and load, or why it is not known."""

    bound: float  # a share below it: more than about a quarter of a step is host time
    source: str | None  # the graph-steps file whose stock decode steps were the GPU time
    reason: str | None  # why there are no rows (a CPU run, no step times of the shape, no token gaps)
    rows: list[GpuShareRow]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GpuShare:
        return cls(**{**doc, "rows": [GpuShareRow(**row) for row in doc["rows"]]})

    def below_bound(self) -> list[GpuShareRow]:
        """The rows whose served steps are more than about a quarter host time."""
        return [row for row in self.rows if row.gpu_share is not None and row.gpu_share < self.bound]


@dataclass
class Report:
    """report.json, entry by entry (docs/DESIGN.md's contract keys first)."""

    trace: Json | None
    model: Json
    gpu: str | None
    arms: list[str]
    arm_labels: list[str]
    comparison: list[str]  # [baseline, primary treatment]
    design: Json
    slos: list[Json]
    attribution: Json
    schema_version: int
    tool_version: str | None
    device: str | None
    aa: AA
    status: str  # "complete" or "partial"
    run_status: str | None
    stopped_reason: str | None
    missing: list[Json]
    warnings: list[Any]
    records: Records
    arm_definitions: dict[str, Json]
    prompts: Json
    planted: list[Json]
    paired_latency: dict[str, dict[str, Json]]  # treatment label -> metric -> paired comparison
    aa_in_run: AAInRun | None
    burnin: list[Json]
    drift: Json
    knee: Json | None
    latency: list[Json]
    secondary: dict[str, Json]
    mde_pct: Json
    command: list[str] | str | None
    noise_floor: Json | None = None
    layout: Json | None = None
    inputs: AnalysisInputs | None = None
    plots: list[str] | None = None
    over_instances: Json | None = None  # paired TPOT with the server-instance variance (stats.instances)
    slow_host: Json | None = None  # replays that ran in a slow host episode (stats.hostslow); new runs only
    gpu_share: GpuShare | None = None  # the host-bound guard (reporting.hostbound)

    @property
    def baseline(self) -> str:
        return self.comparison[0]

    @property
    def treatment(self) -> str:
        return self.comparison[1]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Report:
        """The typed report of a report.json document of today's version."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(doc) - set(names))
        if unknown:
            raise ResultFileError(f"report: entries this schema does not know: {', '.join(unknown)}")
        kw = dict(doc)
        kw["aa"] = AA(**doc["aa"])
        kw["records"] = Records(**doc["records"])
        if doc.get("aa_in_run") is not None:
            kw["aa_in_run"] = AAInRun(**doc["aa_in_run"])
        if doc.get("gpu_share") is not None:
            kw["gpu_share"] = GpuShare.from_json(doc["gpu_share"])
        if doc.get("inputs") is not None:
            kw["inputs"] = AnalysisInputs.from_json(doc["inputs"])
        return cls(**kw)

    def to_json(self) -> Json:
        """The report.json document, entries in their order; unset optional entries left out."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL:
                continue
            out[f.name] = asdict(value) if f.name in TYPED and value is not None else value
        if self.records.damage is None:  # only a damaged run's report has the entry
            del out["records"]["damage"]
        for key in LATER_INPUTS if self.inputs else ():
            if out["inputs"][key] is None:
                del out["inputs"][key]
        return out


def upgrade(doc: Mapping[str, Any], what: str = "report") -> Json:
    """A report.json document brought to today's version, one upgrade per version it is behind."""
    doc = dict(doc)
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > REPORT_SCHEMA_VERSION:
        raise ResultFileError(f"{what}: schema_version {version!r}, this reader knows up to "
                              f"{REPORT_SCHEMA_VERSION}")
    while version < REPORT_SCHEMA_VERSION:
        if version not in UPGRADES:
            raise ResultFileError(f"{what}: no upgrade from schema_version {version}")
        doc = UPGRADES[version](doc)
        version = doc["schema_version"] = version + 1
    return doc


def read_report(path: str | Path, what: str = "report") -> Report:
    """The typed report in `path`, upgraded from an older schema version if need be."""
    return Report.from_json(upgrade(read_json(path, None, what), f"{path} ({what})"))


def write_report_json(path: str | Path, report: Report) -> None:
    """Write report.json atomically (common.jsonfile)."""
    write_json(path, report.to_json())
