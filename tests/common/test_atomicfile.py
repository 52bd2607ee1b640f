"""The kit's one whole-file writer: all or nothing, no temporary file left, readable by everyone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from common.atomicfile import write_atomic
from traces.trace import TraceRequest, load_trace, write_trace


def test_text_and_bytes_are_written_as_given(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a.txt", "one\ntwo\r\n")
    write_atomic(tmp_path / "b.bin", b"\x00\xff")
    assert (tmp_path / "a.txt").read_bytes() == b"one\ntwo\r\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old\n")

    def crash(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C between the write and the rename

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_trace_that_fails_midway_leaves_the_old_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    old = [TraceRequest(0.0, 10, 5), TraceRequest(1.0, 20, 6)]
    write_trace(old, path)
    before = path.read_bytes()

    unwritable = [TraceRequest(0.0, 1, 1), TraceRequest(1.0, 2, 2, (object(),))]  # stops at the second
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_trace(unwritable, path)
    assert path.read_bytes() == before and load_trace(path) == old
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]
