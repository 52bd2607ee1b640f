"""The built wheel works outside the checkout: built from the tree, installed (no dependencies, no
network) into a fresh virtual environment that sees only the test environment's installed
dependencies, its commands plan a run and re-derive a committed CPU run from a folder of their own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_RUN = ROOT / "experiments" / "results" / "cpu-tiny-aa"
INSTALLED = ("common", "kernels", "integration", "traces", "loadgen", "experiments", "runtime_tables")
# what a build leaves or a checkout holds that is not source: not copied into the build's tree
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".vllm-bundle", "build", "dist", "*.egg-info",
                                    "__pycache__", ".*_cache", "reanalysis", "_scratch")

pytestmark = pytest.mark.slow  # builds a wheel and a venv (about a minute on 2 cores)


def _run(cmd: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout (so no build folder of the checkout's goes in)."""
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, tmp / "src", ignore=NOT_SOURCE)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                  "-w", tmp / "dist", tmp / "src"], tmp)
    assert built.returncode == 0, built.stderr
    return next((tmp / "dist").glob("rmsnorm_goodput-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only the wheel installed, its dependencies read from this environment's
    site-packages (a .pth line, which runs none of that folder's own .pth files: not the checkout's
    editable install)."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], venv.parent)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    inner = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv.parent)
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(inner.stdout.strip()) / "deps.pth").write_text("\n".join(deps) + "\n")
    installed = _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                      "--no-index", wheel], venv.parent)
    assert installed.returncode == 0, installed.stderr
    return venv


def test_the_wheel_holds_every_module_and_table_and_no_evidence(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for room in INSTALLED for p in (ROOT / room).rglob("*.py")
               if "__pycache__" not in p.parts}
    tables = {p.relative_to(ROOT).as_posix() for p in (ROOT / "runtime_tables").rglob("*.json*")}
    assert tables and modules - names == set() and tables - names == set()
    assert [n for n in names if "results/" in n or n.startswith(("research/", "tests/"))] == []


def test_the_installed_packages_are_the_wheels(venv: Path, tmp_path: Path) -> None:
    where = _run([venv / "bin" / "python", "-c", "import experiments, runtime_tables; print(experiments."
                  "__file__); print(runtime_tables.path('profiles.json').is_file())"], tmp_path)
    assert where.returncode == 0, where.stderr
    module, table = where.stdout.split()
    assert Path(module).is_relative_to(venv) and not Path(module).is_relative_to(ROOT) and table == "True"


def test_the_experiment_command_plans_a_run(venv: Path, tmp_path: Path) -> None:
    plan = _run([venv / "bin" / "rmsnorm-experiment", "--trace", ROOT / "traces" / "chat.jsonl", "--dry-run",
                 "--device", "cpu"], tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "tiny-llama" in plan.stdout and not list(tmp_path.iterdir())  # a plan writes nothing
    # runs of an installed kit go under the current directory, never into site-packages
    assert json.loads(plan.stdout[plan.stdout.index("{"):])["config"]["results_dir"] == "rmsnorm-results"


def test_the_analysis_command_rederives_a_committed_cpu_run(venv: Path, tmp_path: Path) -> None:
    run = tmp_path / "cpu-tiny-aa"
    shutil.copytree(CPU_RUN, run)
    done = _run([venv / "bin" / "rmsnorm-analyze", run, "--out", tmp_path / "out"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "report.md").read_text() == (CPU_RUN / "report.md").read_text()
