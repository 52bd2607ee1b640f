"""Results files: atomic JSON (plain, xz or gzip by name) read back with one error naming what is wrong;
a file committed compressed is read by its plain name too."""

from __future__ import annotations

import gzip
import lzma
import math
from pathlib import Path

import pytest

from common.jsonfile import ResultFileError, compress_file, open_text, read_json, stored, write_json

DOC = {"schema_version": 2, "samples": [1.5, 2.5], "name": "x"}


MAGIC = {".gz": b"\x1f\x8b", ".xz": b"\xfd7zXZ\x00"}


@pytest.mark.parametrize("name", ["r.json", "r.json.gz", "r.json.xz"])
def test_round_trip_plain_gzip_and_xz(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write_json(path, DOC)
    assert read_json(path, 2, "result") == DOC
    assert read_json(path, (1, 2), "result") == DOC
    for suffix, magic in MAGIC.items():
        assert path.read_bytes().startswith(magic) == name.endswith(suffix)
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left behind


def test_a_file_committed_compressed_is_read_by_its_plain_name(tmp_path: Path) -> None:
    write_json(tmp_path / "report.json.xz", DOC)
    assert stored(tmp_path / "report.json") == tmp_path / "report.json.xz"
    assert read_json(tmp_path / "report.json", 2, "report") == DOC
    # a name that a command once gave as .gz finds the file recompressed as .xz
    assert read_json(tmp_path / "report.json.gz", 2, "report") == DOC
    write_json(tmp_path / "report.json", {**DOC, "name": "plain"})  # the plain file, where both exist
    assert read_json(tmp_path / "report.json", 2, "report")["name"] == "plain"
    with pytest.raises(ResultFileError, match=r"other\.json: no such report file"):
        read_json(tmp_path / "other.json", 2, "report")


def test_compress_file_keeps_every_byte(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    text = "".join(f"line {i}: \u00e9\n" for i in range(500))
    log.write_text(text, encoding="utf-8")
    packed = compress_file(log)
    assert packed == tmp_path / "server.log.xz" and not log.exists()
    assert lzma.decompress(packed.read_bytes()).decode("utf-8") == text
    with open_text(stored(log)) as f:
        assert f.read() == text
    assert compress_file(log) is None  # nothing left to compress


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
    cut_xz = tmp_path / "cut.json.xz"
    cut_xz.write_bytes(lzma.compress(b'{"schema_version": 2, "samples": [1, 2]}')[:-12])
    with pytest.raises(ResultFileError, match=r"cut\.json\.xz: cannot read raw-steps"):
        read_json(cut_xz, None, "raw-steps")
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
