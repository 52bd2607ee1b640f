"""run.json as a typed record: `Run`, its one reader (`read_run`) and its JSON (`Run.to_json`).

experiments.runner.runrecord writes it (through `Run.to_json`); every reader (experiments.analyze, the
stats, the report, experiments.stats.runframe, research/) gets a `Run` from `read_run`, an older
version upgraded once as it is read, so no reader branches on old formats.

Version 2 (RUN_SCHEMA_VERSION): every key is present and the SLO tiers the run was made with are in
`config.slos`. Version 1 left out the keys later runs added and wrote `config.slos` null for the
default tiers; `upgrade_v1` fills both (the tiers from experiments/slos.toml, those its reports were
analysed with).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from common.jsonfile import ResultFileError, read_json, stored
from experiments.core.slo import DEFAULT_SLO_FILE, SLO, load_slo_file
from integration import arms

RUN_SCHEMA_VERSION = 2
REQUIRED = ("arms", "arm_labels", "windows", "loads", "schedule", "status")  # in every version
# version 1 left these settings out of "config" when they were off (v2 writes every setting)
V1_CONFIG_OFF = {"layout": "turns", "gpus": [], "allow_no_table": False, "fuse_all": False, "pin_cpus": False,
                 "sleep_mode": False, "start_order": "waves", "knee_max": None, "knee_lateness_ms": None,
                 "resident": None}


@dataclass
class Run:
    """One run's run.json: its design (config, trace, model, arms, windows, loads, schedule) and what
    happened (servers, replays, burn-in, warnings, status). Nested entries stay JSON as written."""

    schema_version: int = RUN_SCHEMA_VERSION
    tool_version: str | None = None
    created: str | None = None
    command: list[str] | None = None
    config: dict = field(default_factory=dict)  # RunConfig.to_json: every setting, the SLO tiers whole
    trace: dict = field(default_factory=dict)  # path, sha256, requests
    model: dict = field(default_factory=dict)  # name, dir, config (config.json), dtype, eager
    device: str | None = None
    mode_note: str | None = None  # why the run is A/A, None for an A/B run
    arms: list[str] = field(default_factory=list)  # each arm's name, in label order
    arm_labels: list[str] = field(default_factory=list)
    arm_definitions: dict[str, dict] = field(default_factory=dict)  # label -> the arm's whole definition
    allow_arm_differences: bool = False
    windows: list[dict] = field(default_factory=list)  # id, requests, duration_s, start_s
    loads: list[float] = field(default_factory=list)
    warmup: dict | None = None
    clipping: dict | None = None
    resident: bool = True
    resident_sets: list[list[str]] | None = None
    layout: str = "turns"
    duet: dict | None = None
    schedule: list[dict] = field(default_factory=list)  # window, load, order, done
    patched_policy: dict | None = None
    step_histograms: dict = field(default_factory=dict)  # label -> load -> vLLM's step histograms
    status: str = "running"
    stopped_reason: str | None = None
    servers: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    finished: str | None = None
    prompts: dict | None = None
    prompt_tokens: dict | None = None
    order: dict | None = None
    replays: list[dict] = field(default_factory=list)
    burnin: list[dict] = field(default_factory=list)
    knee: dict | None = None
    instances: dict | None = None
    instance_design: dict | None = None
    placement: dict | None = None
    sleep_mode: dict | None = None
    analysis_error: str | None = None

    def to_json(self) -> dict:
        """Every key, as run.json holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Run":
        """A record from its JSON (older versions upgraded); ValueError naming an unknown key."""
        data = upgrade(dict(data))
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        return cls(**data)

    def slos(self) -> list[SLO]:
        """The SLO tiers the run was made with."""
        return [SLO(**s) for s in self.config.get("slos") or []]

    def arm_of(self) -> dict[str, str]:
        """label -> the arm's name."""
        return dict(zip(self.arm_labels, self.arms))

    def arm(self, label: str) -> arms.Arm | None:
        """The Arm of a label: its recorded definition, else, for a run that predates the record of
        definitions, the built-in or parsed arm of its name, else None."""
        recorded = self.arm_definitions.get(label)
        if recorded:
            return arms.Arm.from_json({k: recorded[k] for k in arms.ARM_FIELDS if k in recorded},
                                      f"run.json arm_definitions[{label!r}]")
        try:
            return arms.get(self.arm_of()[label])
        except ValueError:
            return None

    def durations(self) -> dict[int, float]:
        """window id -> its duration (s)."""
        return {int(w["id"]): float(w["duration_s"]) for w in self.windows}

    def window_requests(self) -> dict[int, int]:
        """window id -> its requests."""
        return {int(w["id"]): int(w["requests"]) for w in self.windows}

    def done_cells(self) -> list[tuple[str, int, float]]:
        """(label, window, load) of every cell the schedule lists as finished, in schedule order."""
        return [(lab, int(e["window"]), float(e["load"])) for e in self.schedule for lab in e.get("done", [])]


def upgrade_v1(data: dict) -> dict:
    """A version-1 run.json as version 2: the settings v1 left out when off, and the SLO tiers of
    experiments/slos.toml where it wrote none (the tiers every v1 run's report was analysed with)."""
    config = {**V1_CONFIG_OFF, **(data.get("config") or {})}
    if not config.get("slos"):
        config["slos"] = [s.to_json() for s in load_slo_file(DEFAULT_SLO_FILE)]
    return {**data, "schema_version": 2, "config": config}


UPGRADES = {1: upgrade_v1}  # version -> the function that makes it the next one


def upgrade(data: dict) -> dict:
    """`data` upgraded one version at a time to RUN_SCHEMA_VERSION."""
    while data.get("schema_version", RUN_SCHEMA_VERSION) in UPGRADES:
        data = UPGRADES[data["schema_version"]](data)
    return data


def read_run(run_dir: Path) -> Run:
    """run.json of a run directory as a Run; rejects unknown schema versions, missing or unknown keys
    and values of the wrong type or range (what the analysis reads), naming the field."""
    path = stored(Path(run_dir) / "run.json")  # run.json.xz where it is kept compressed
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no run.json (is {run_dir} an experiments run directory?)")
    data = read_json(path, (*UPGRADES, RUN_SCHEMA_VERSION), "run record")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    try:
        run = Run.from_json(data)
    except ValueError as exc:
        raise ResultFileError(f"{path}: {exc}") from None
    problem = _run_problem(run)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return run


def shown(v: object) -> str:
    """A JSON value as shown in an error (its first 200 characters)."""
    return json.dumps(v)[:200]


def count(v: object) -> bool:
    """An integer >= 0 (not a bool)."""
    return type(v) is int and v >= 0


def positive(v: object) -> bool:
    """A finite number > 0 (not a bool)."""
    return type(v) in (int, float) and math.isfinite(v) and v > 0


_WINDOW = {"id": (count, "an integer >= 0"), "requests": (count, "an integer >= 0"),
           "duration_s": (positive, "a finite number > 0")}


def _run_problem(run: Run) -> str | None:
    """The first value of run.json of the wrong type or range, or None."""
    labels, arms = run.arm_labels, run.arms
    if not (isinstance(labels, list) and isinstance(arms, list) and len(labels) >= 2 and
            all(isinstance(x, str) and x for x in labels) and len(set(labels)) == len(labels) == len(arms)):
        return f"arm_labels must be two or more distinct labels, one per arm, got {labels} for arms {arms}"
    if not isinstance(run.status, str):
        return f"status must be a string, got {shown(run.status)}"
    for key in ("loads", "windows", "schedule"):
        if not isinstance(getattr(run, key), list):
            return f"{key} must be a list, got {shown(getattr(run, key))}"
    for i, load in enumerate(run.loads):
        if not positive(load):
            return f"loads[{i}] must be a finite number > 0, got {shown(load)}"
    for i, w in enumerate(run.windows):
        if not isinstance(w, dict):
            return f"windows[{i}] must be an object, got {shown(w)}"
        for key, (ok, what) in _WINDOW.items():
            if not ok(w.get(key)):
                return f"windows[{i}].{key} must be {what}, got {shown(w.get(key))}"
    ids = [w["id"] for w in run.windows]
    if len(set(ids)) != len(ids):
        return f"windows: an id given twice in {ids}"
    for i, e in enumerate(run.schedule):
        problem = _step_problem(e, ids, run.loads, labels)
        if problem is not None:
            return f"schedule[{i}]{problem}"
    return None


def _step_problem(e: object, ids: list[int], loads: list[float], labels: list[str]) -> str | None:
    """What is wrong with one schedule entry (its window, load, order and done arms), or None."""
    if not isinstance(e, dict):
        return f" must be an object, got {shown(e)}"
    if not count(e.get("window")) or e["window"] not in ids:
        return f".window {shown(e.get('window'))} is not one of the windows' ids"
    if not positive(e.get("load")) or e["load"] not in loads:
        return f".load {shown(e.get('load'))} is not one of the loads"
    for key in ("order", "done"):
        v = e.get(key, [])
        if not (isinstance(v, list) and all(isinstance(x, str) and x in labels for x in v)):
            return f".{key} must be a list of arm_labels, got {shown(v)}"
    return None
