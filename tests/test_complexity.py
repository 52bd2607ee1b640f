"""ruff's complexity ceilings (pyproject.toml) sit at the worst function of the kit: a ceiling one lower
fails somewhere, so once that function is simplified the ceiling must come down with it."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.test_layout import ROOT

LINT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
CEILINGS = [("C901", "mccabe", "max-complexity"), ("PLR0913", "pylint", "max-args"),
            ("PLR0915", "pylint", "max-statements")]


@pytest.mark.parametrize(("rule", "section", "key"), CEILINGS)
def test_each_ceiling_is_the_worst_function_of_today(rule: str, section: str, key: str) -> None:
    assert rule in LINT["select"] or rule[:3] in LINT["select"]
    ceiling = LINT[section][key]
    lower = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", rule, "--config",
                            f"lint.{section}.{key}={ceiling - 1}", "--output-format", "concise", "."],
                           cwd=ROOT, capture_output=True, text=True)
    assert lower.returncode == 1 and f" {rule} " in lower.stdout, f"{key} {ceiling} is above every function"
