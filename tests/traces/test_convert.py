"""The converter's CLI: output, printed counts of dropped rows, --report, --sort, determinism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traces.convert import convert, main
from traces.trace import load_trace

BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "46,ChatGPT,100,0,100,Conversation log\n"
    "118.25,GPT-4,417,276,693,API log\n"
)


def test_burstgpt_cli_prints_and_reports_drops(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, dst, rep = tmp_path / "b.csv", tmp_path / "b.jsonl", tmp_path / "report.json"
    src.write_text(BURSTGPT)
    assert main(["--format", "burstgpt", str(src), str(dst), "--report", str(rep)]) == 0
    out = capsys.readouterr().out
    assert "read 4 rows" in out and "wrote 2 requests" in out
    assert "dropped 2 rows" in out
    assert "2 failed (Response tokens == 0): lines 3, 4" in out
    assert "not carried over: Model, Total tokens" in out
    report = json.loads(rep.read_text())
    assert report["dropped"] == {"failed (Response tokens == 0)": [3, 4]}
    assert report["rows_read"] == 4 and report["written"] == 2
    assert dst.read_text() == (
        '{"timestamp": 0.0, "input_tokens": 472, "output_tokens": 18}\n'
        '{"timestamp": 113.25, "input_tokens": 417, "output_tokens": 276}\n'
    )


def test_bad_input_exits_nonzero_with_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, dst = tmp_path / "m.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n{"timestamp": 1}\n')
    assert main(["--format", "mooncake", str(src), str(dst)]) == 2
    err = capsys.readouterr().err
    assert err == f"python -m traces.convert: error: {src}:2: missing key(s) input_length, output_length\n"
    assert not dst.exists()


def test_all_rows_dropped_is_an_error(tmp_path: Path) -> None:
    src = tmp_path / "b.csv"
    src.write_text("Timestamp,Request tokens,Response tokens\n1,5,0\n")
    with pytest.raises(ValueError, match=r"no requests to write \(1 rows dropped\)"):
        convert("burstgpt", src, tmp_path / "o.jsonl")


def test_sort_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, dst = tmp_path / "m.jsonl", tmp_path / "o.jsonl"
    src.write_text(
        '{"timestamp": 2000, "input_length": 1, "output_length": 1}\n'
        '{"timestamp": 1000, "input_length": 2, "output_length": 2}\n'
    )
    assert main(["--format", "mooncake", str(src), str(dst)]) == 2
    assert ":2: not in time order" in capsys.readouterr().err
    assert main(["--format", "mooncake", "--sort", str(src), str(dst)]) == 0
    assert "1 rows were out of order" in capsys.readouterr().out
    assert [(r.timestamp, r.input_tokens) for r in load_trace(dst)] == [(0.0, 2), (1.0, 1)]


def test_output_is_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(
        "".join(
            f'{{"timestamp": {i * 333}, "input_length": {i + 1}, "output_length": 2, "hash_ids": [{i}]}}\n'
            for i in range(50)
        )
    )
    a = convert("mooncake", src, tmp_path / "a.jsonl")
    b = convert("mooncake", src, tmp_path / "b.jsonl")
    assert a.sha256 == b.sha256
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


MOONCAKE = '{"timestamp": 0, "input_length": 5, "output_length": 6}\n'


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink", "hardlink"])
def test_refuses_to_write_over_its_input(tmp_path: Path, capsys: pytest.CaptureFixture,
                                         spelling: str) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text(MOONCAKE)
    dst = {"same": src, "dotted": tmp_path / "." / "x.jsonl", "symlink": tmp_path / "link.jsonl",
           "hardlink": tmp_path / "hard.jsonl"}[spelling]
    if spelling == "symlink":
        dst.symlink_to(src)
    elif spelling == "hardlink":
        dst.hardlink_to(src)
    assert main(["--format", "mooncake", str(src), str(dst)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"output {dst} is the input file {src}" in err
    assert src.read_text() == MOONCAKE
    with pytest.raises(ValueError, match="is the input"):
        convert("mooncake", src, dst)
    assert src.read_text() == MOONCAKE


def test_report_into_a_missing_folder_fails_before_writing(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    src, dst, rep = tmp_path / "m.jsonl", tmp_path / "out.jsonl", tmp_path / "no" / "such" / "r.json"
    src.write_text(MOONCAKE)
    assert main(["--format", "mooncake", str(src), str(dst), "--report", str(rep)]) == 2
    assert capsys.readouterr().err == (f"python -m traces.convert: error: --report {rep}: folder "
                                       f"{rep.parent} does not exist\n")
    assert not dst.exists()
    assert main(["--format", "mooncake", str(src), str(tmp_path / "gone" / "o.jsonl")]) == 2
    assert "folder" in capsys.readouterr().err and not (tmp_path / "gone").exists()
    assert main(["--format", "mooncake", str(src), str(dst), "--report", str(dst)]) == 2
    assert "is the output file" in capsys.readouterr().err and not dst.exists()


def test_bad_flag_and_missing_input_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--format", "nope", str(tmp_path / "a"), str(tmp_path / "b")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --format: invalid choice: 'nope'" in err
    missing = tmp_path / "missing.jsonl"
    assert main(["--format", "mooncake", str(missing), str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err and "No such file" in err


@pytest.mark.parametrize("module", ["traces.convert", "traces.info"])
def test_help_explains_every_flag(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    ).stdout
    flags = (
        ["--format", "--sort", "--report"]
        if module == "traces.convert"
        else ["--start", "--duration", "--speedup", "--out", "--json"]
    )
    for flag in flags:
        assert flag in out
