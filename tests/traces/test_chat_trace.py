"""The committed traces/chat.jsonl: loads, has the documented size and hash, and matches its source."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from traces.convert import convert
from traces.trace import file_sha256, load_trace, trace_summary

REPO = Path(__file__).resolve().parents[2]
CHAT = REPO / "traces" / "chat.jsonl"
# CI clones the repository beside ../shared, as the working copy is here.
SOURCE = REPO.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
needs_source = pytest.mark.skipif(not SOURCE.exists(), reason=f"source CSV not present at {SOURCE}")


def _readme_sha(label: str) -> str:
    text = (REPO / "traces" / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"{label}.*?sha256 `([0-9a-f]{{64}})`", text, re.S)
    assert m, f"no {label} sha256 in traces/README.md"
    return m[1]


def test_chat_trace_loads() -> None:
    reqs = load_trace(CHAT)
    assert len(reqs) == 19_366
    assert reqs[0].timestamp == 0.0
    assert all(r.hash_ids is None for r in reqs)
    s = trace_summary(reqs)
    assert s["duration_s"] == 3501.721937
    # the shared README's figures: input mean 1,155, median 1,020, max 14,050; output 211, 129, 1,000
    assert round(s["input_tokens"]["mean"]) == 1155 and s["input_tokens"]["p50"] == 1020
    assert s["input_tokens"]["max"] == 14_050
    assert round(s["output_tokens"]["mean"]) == 211 and s["output_tokens"]["p50"] == 129
    assert s["output_tokens"]["max"] == 1000


def test_chat_trace_hash_is_documented() -> None:
    assert file_sha256(CHAT) == _readme_sha("result:")


@needs_source
def test_source_hash_is_documented() -> None:
    assert file_sha256(SOURCE) == _readme_sha("source:")


@needs_source
def test_reconversion_is_byte_identical(tmp_path: Path) -> None:
    report = convert("azure", SOURCE, tmp_path / "chat.jsonl")
    assert report.written == 19_366 and report.dropped == {}
    assert report.sha256 == file_sha256(CHAT)


@needs_source
def test_matches_independent_pandas_reading() -> None:
    df = pd.read_csv(SOURCE)
    t = pd.to_datetime(df["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f")
    rel = (t - t.iloc[0]).dt.total_seconds().to_numpy()
    reqs = load_trace(CHAT)
    ours = pd.DataFrame(
        [(r.timestamp, r.input_tokens, r.output_tokens) for r in reqs], columns=["t", "i", "o"]
    )
    assert len(df) == len(ours)
    assert (ours["i"].to_numpy() == df["ContextTokens"].to_numpy()).all()
    assert (ours["o"].to_numpy() == df["GeneratedTokens"].to_numpy()).all()
    # rounding to the microsecond moves a time by at most half a microsecond
    assert abs(ours["t"].to_numpy() - rel).max() <= 0.5e-6 + 1e-9


def test_readme_shows_what_traces_info_prints(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    from traces import info

    monkeypatch.chdir(REPO)
    assert info.main(["traces/chat.jsonl"]) == 0
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    text = (REPO / "traces" / "README.md").read_text(encoding="utf-8")
    block = text.split("`python -m traces.info traces/chat.jsonl`:\n\n", 1)[1].split("\n\n", 1)[0]
    assert [line.removeprefix("    ") for line in block.splitlines()] == printed
