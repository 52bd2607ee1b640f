"""Results files: atomic JSON (plain or gzip by name) read back with one error naming what is wrong."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from common.jsonfile import ResultFileError, read_json, write_json

DOC = {"schema_version": 2, "samples": [1.5, 2.5], "name": "x"}


@pytest.mark.parametrize("name", ["r.json", "r.json.gz"])
def test_round_trip_plain_and_gzip(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write_json(path, DOC)
    assert read_json(path, 2, "result") == DOC
    assert read_json(path, (1, 2), "result") == DOC
    assert path.read_bytes().startswith(b"\x1f\x8b") == name.endswith(".gz")
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left behind


def test_gzip_bytes_do_not_depend_on_when_they_were_written(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json.gz", DOC)
    write_json(tmp_path / "b.json.gz", DOC)
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()


def test_bad_files_get_one_error_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match=r"nope\.json\.gz: no such raw-steps file"):
        read_json(tmp_path / "nope.json.gz", None, "raw-steps")
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(b'{"schema_version": 2, "samples": [1, 2]}')[:-12])
    with pytest.raises(ResultFileError, match=r"cut\.json\.gz: cannot read raw-steps"):
        read_json(cut, None, "raw-steps")
    plain_named_gz = tmp_path / "plain.json.gz"
    plain_named_gz.write_text('{"a": 1}')
    with pytest.raises(ResultFileError, match=r"plain\.json\.gz: cannot read"):
        read_json(plain_named_gz, None, "raw-steps")
    half = tmp_path / "half.json"
    half.write_text('{"a": [1,\n 2')
    with pytest.raises(ResultFileError, match=r"half\.json:2: profile is not valid JSON"):
        read_json(half, None, "profile")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ResultFileError, match="must be a JSON object, got list"):
        read_json(listed, None, "profile")
    write_json(tmp_path / "v2.json", DOC)
    with pytest.raises(ResultFileError, match=r"schema_version 2; this reader knows 1, 3"):
        read_json(tmp_path / "v2.json", (1, 3), "profile")


def test_nan_is_refused_and_the_old_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "r.json.gz"
    write_json(path, DOC)
    with pytest.raises(ValueError):
        write_json(path, {"x": math.nan})
    assert read_json(path, 2, "result") == DOC


def test_a_raw_file_may_keep_nan_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "raw.json.gz"
    write_json(path, {"x": math.nan}, allow_nan=True)
    assert math.isnan(read_json(path, None, "raw-steps")["x"])


def test_one_line_layout_for_the_large_raw_files(tmp_path: Path) -> None:
    """indent=None keeps the layout the kernel benchmark's files had before they were written atomically."""
    path = tmp_path / "bench.json"
    write_json(path, DOC, indent=None)
    assert path.read_text() == '{"schema_version": 2, "samples": [1.5, 2.5], "name": "x"}\n'
    assert read_json(path, 2, "result") == DOC
