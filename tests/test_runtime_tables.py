"""What the code reads at run time lives in the runtime_tables package, each file noted in its README;
the results folders are evidence that no module names (docs/DESIGN.md, "Rooms")."""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path

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
                  and not p.name.startswith((".", "__")))
    assert kept and [name for name in kept if not any(p.fullmatch(name) for p in patterns)] == []


def test_tables_are_read_from_the_package() -> None:
    assert runtime_tables.DIR == Path(str(files("runtime_tables")))
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
