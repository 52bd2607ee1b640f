"""The command line a results file records: runnable as written, and the same on every machine."""

from __future__ import annotations

import shlex

import pytest

from common.cliargs import command_line


def test_arguments_are_quoted_so_the_line_runs_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    line = command_line("python -m kernels.bench", ["--prefill-sizes", "", "--name", "a b"])
    assert line == "python -m kernels.bench --prefill-sizes '' --name 'a b'"
    assert shlex.split(line)[3:] == ["--prefill-sizes", "", "--name", "a b"]


def test_an_empty_argument_list_is_not_replaced_by_this_process_arguments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["prog", "--from-sys"])
    assert command_line("python -m x", []) == "python -m x"
    assert command_line("python -m x") == "python -m x --from-sys"


def test_paths_under_out_are_written_as_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", "/root/out/")
    line = command_line("python -m kernels.suite", ["--out", "/root/out/suite/h200.json", "/root/outer/x",
                                                    "/root/out/odd name"])
    assert line == "python -m kernels.suite --out $OUT/suite/h200.json /root/outer/x '/root/out/odd name'"
