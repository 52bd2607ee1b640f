"""The analysis inputs a report records (report.json "inputs") and reads back for a re-analysis.

Besides run.json and the records, a report is derived from SLO tiers, an A/A report, the patched
arm's policy record, a step profile, kernel results and graph-steps files; report.json names each (a
path relative to the project root where it lies inside it), so a re-analysis takes the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import runtime_tables
from common.jsonfile import ResultFileError, project_relative, stored
from experiments.core.slo import SLO
from experiments.reporting import schema
from integration.proof.profiles import PROJECT_ROOT


@dataclass(frozen=True)
class Inputs:
    """What a report is derived from besides run.json and the records (report.json "inputs").

    Paths are read as given; report.json shows them relative to the project root when inside it.
    ``profile``/``kernel_results`` None: the committed defaults for the run's GPU (environment.json).
    """

    slos: tuple[SLO, ...] = ()  # () : the run's own tiers (Run.slos)
    aa_report: Path | None = None
    patched_policy: Path | None = None
    profile: Path | None = None
    kernel_results: Path | None = None
    planted_steps: Path | None = None
    graph_steps: Path | None = None
    gpu_steps: Path | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)  # where each came from, for the CLI


# the input files, in the order report.json records them
PATH_INPUTS = tuple(f.name for f in fields(schema.AnalysisInputs) if f.name != "slos")


def shown(path: Path | None) -> str | None:
    """A path as report.json records it: relative to the project root when inside it."""
    return None if path is None else project_relative(path, PROJECT_ROOT)


def _from_root(text: str | None) -> Path | None:
    """A path recorded in a report: relative ones are relative to the project root; a table once kept in
    a results folder is found where it is kept now (runtime_tables.resolve)."""
    return None if text is None else PROJECT_ROOT / runtime_tables.resolve(text)


def recorded_inputs(run_dir: Path) -> Inputs:
    """The inputs recorded in RUN_DIR/report.json (a run's own analysis or the last --in-place one);
    Inputs() when there is no report, or one written before reports recorded their inputs."""
    path = stored(Path(run_dir) / "report.json")
    if not path.is_file():
        return Inputs()
    rec = schema.read_report(path).inputs  # the one reader of report.json, older versions upgraded
    if rec is None:
        return Inputs(notes=(f"{path} records no inputs (an older report): the run's SLO tiers and today's "
                             "defaults are used",))
    try:
        return Inputs(slos=tuple(SLO(**s) for s in rec.slos),
                      **{k: _from_root(getattr(rec, k)) for k in PATH_INPUTS},
                      notes=(f"inputs as recorded in {path}",))
    except (TypeError, ValueError) as exc:
        raise ResultFileError(f"{path}: bad \"inputs\" entry ({exc!r})") from None
