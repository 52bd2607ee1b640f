"""What the code reads at run time lives in the runtime_tables package, each file noted in its README;
the results folders are evidence that no module names (docs/DESIGN.md, "Rooms")."""

from __future__ import annotations

import json
import re
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

import runtime_tables
from common.jsonfile import stored

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_ROOMS = ("common", "runtime_tables", "kernels", "integration", "traces", "loadgen", "experiments")
EVIDENCE_NAMES = re.compile(r"kernels/results|integration/results|instance-floor")


def test_no_module_of_the_kit_names_an_evidence_folder() -> None:
    named = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for room in RUNTIME_ROOMS
             for path in sorted((ROOT / room).rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if EVIDENCE_NAMES.search(line)]
    assert named == []


def test_every_table_is_noted_in_the_readme() -> None:
    readme = (ROOT / "runtime_tables" / "README.md").read_text(encoding="utf-8")
    patterns = [re.compile(re.escape(name).replace(re.escape("<gpu>"), r"[\w.-]+")
                           .replace(re.escape("<model>"), r"[\w.-]+") + r"(\.xz)?")
                for name in re.findall(r"`([\w<>.-]+\.(?:json|md))`", readme)]
    kept = sorted(p.name for p in runtime_tables.DIR.iterdir() if p.name not in ("__init__.py", "README.md")
                  and p.is_file() and not p.name.startswith((".", "__")))
    assert kept and [name for name in kept if not any(p.fullmatch(name) for p in patterns)] == []


def test_tables_are_read_from_the_package() -> None:
    assert runtime_tables.DIR == Path(str(files("runtime_tables")))
    assert runtime_tables.resolve("kernels/results/policy-h200-in-graph-v1.json").is_file()
    assert runtime_tables.resolve("integration/results/h200.json") == Path("integration/results/h200.json")
    assert all(runtime_tables.path(name).is_file()
               for name in ("profiles.json", "instance-prior.json", "policy-h200-in-graph.json"))


def _default_paths() -> dict[str, Path]:
    """Every file the kit's defaults resolve to for the GPUs and model shapes the tables hold."""
    from experiments.stats.attribution import default_kernel_results
    from integration.proof import profiles
    from kernels import counters_worker

    index = json.loads(profiles.INDEX.read_text(encoding="utf-8"))
    gpus = {p.name.removeprefix("policy-").removesuffix(".json")
            for p in runtime_tables.DIR.glob("policy-*.json")
            if not p.name.endswith(("-in-graph.json", "-in-vllm-eager.json"))}
    models = {m for section in ("planted_steps", "graph_steps") for g in index[section].values() for m in g}
    models |= {json.loads(p.read_text())["key"]["model"]["name"]
               for p in runtime_tables.DIR.glob("calibration-*.json")}
    found = {f"profile {g} {mode}": profiles.default_profile(g, mode)
             for g in gpus for mode in ("compiled", "eager")}
    for g in gpus:
        found[f"kernel results {g}"] = default_kernel_results(g)
        for m in models:
            found[f"planted steps {g} {m}"] = profiles.default_planted_steps(g, m)
            found[f"graph steps {g} {m}"] = profiles.default_graph_steps(g, m)
    found["kernels.counters' benchmark"] = counters_worker.bench_file()
    return {what: path for what, path in found.items() if path is not None}


def test_no_default_path_lies_under_a_results_folder() -> None:
    paths = _default_paths()
    assert {"profile h200 compiled", "kernel results h200", "planted steps h200 llama-3.1-8b",
            "graph steps h100-80gb-hbm3 llama-3.2-1b", "graph steps h200 llama-3.1-8b"} <= set(paths)
    assert {what: str(p) for what, p in paths.items() if "results" in p.parts} == {}
    assert all(stored(p).is_file() and p.parent == runtime_tables.DIR for p in paths.values())


# what a table is, by its file name: policy tables (and a run's record of one), calibration records,
# planted costs, the profile index, the instance prior
TABLE_KINDS = re.compile(r"(policy-[^/]*|patched-policy|policy-used|calibration-[^/]*|[^/]*planted-cost[^/]*"
                         r"|profiles|[^/]*prior[^/]*)\.json(\.xz|\.gz)?")


def test_no_table_is_tracked_under_a_results_folder() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.decode().strip()})")
    tracked = [p for p in listed.stdout.decode().split("\0") if p]
    assert [p for p in tracked if "results" in Path(p).parts and TABLE_KINDS.fullmatch(Path(p).name)] == []
    tables = [p for p in tracked if p.startswith("runtime_tables/") and TABLE_KINDS.fullmatch(Path(p).name)]
    assert len(tables) >= 20, tables


def test_every_moved_table_is_kept_here_and_nothing_else_is_in_its_folders() -> None:
    moved = json.loads(runtime_tables.MOVED.read_text(encoding="utf-8"))["moved"]
    assert all("results" in Path(old).parts and runtime_tables.resolve(old).is_file() for old in moved)
    nested = sorted(p.relative_to(runtime_tables.DIR).as_posix() for p in runtime_tables.DIR.rglob("*.json*")
                    if p.parent != runtime_tables.DIR)
    assert nested == sorted(moved.values())
