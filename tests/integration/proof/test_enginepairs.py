"""One interval over engine pairs (graph-steps files), known answers on synthetic files, and the
committed H200 pooling re-derived from the files it names."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from common.jsonfile import read_json
from integration.proof import enginepairs

RESULTS = Path(__file__).resolve().parents[3] / "integration" / "results"


def _doc(per_size: dict[int, list[float]], arm: str = "patched") -> dict:
    return {"command": "prove ...", "model": "m",
            "sizes": [{"batch_tokens": s, "arms": {arm: {"per_round_log_ratio": d}}}
                      for s, d in per_size.items()]}


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_each_file_is_one_pair_and_the_interval_is_over_pairs(tmp_path: Path) -> None:
    # pair means: -0.01 and -0.03 at size 1 (rounds average within a pair); size 4 only in the first
    a = _write(tmp_path, "a.json", _doc({1: [-0.012, -0.008], 4: [0.002, 0.004]}))
    b = _write(tmp_path, "b.json", _doc({1: [-0.03, -0.03, -0.03]}))
    doc = enginepairs.build([a, b], "patched")
    one, four = doc["sizes"]
    assert one["pairs"] == 2 and one["per_pair_pct"] == pytest.approx([100 * math.expm1(-0.01),
                                                                       100 * math.expm1(-0.03)])
    half = stats.t.ppf(0.975, 1) * statistics.stdev([-0.01, -0.03]) / math.sqrt(2)
    assert one["change_pct"] == pytest.approx(100 * math.expm1(-0.02))
    assert one["ci95_pct"] == pytest.approx([100 * math.expm1(-0.02 - half), 100 * math.expm1(-0.02 + half)])
    assert one["excludes_zero"] is False  # two pairs, t with one degree of freedom: a wide interval
    # mean -0.02, sd 0.0141: t(n-1) * sd / sqrt(n) < 0.02 first at n = 5 (t(3) = 3.18 gives 0.0225)
    assert one["pairs_needed"] == 5 and enginepairs.pairs_needed(0.0, 0.01) is None
    assert four["pairs"] == 1 and four["ci95_pct"] is None and four["excludes_zero"] is None
    assert [f["path"] for f in doc["files"]] == [str(a), str(b)]


def test_agreeing_pairs_exclude_zero(tmp_path: Path) -> None:
    paths = [_write(tmp_path, f"{i}.json", _doc({16: [v, v]}))
             for i, v in enumerate([-0.010, -0.011, -0.012])]
    (row,) = enginepairs.build(paths, "patched")["sizes"]
    assert row["excludes_zero"] is True and row["ci95_pct"][1] < 0


def test_a_file_without_the_arm_and_a_damaged_file_are_named(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    other = _write(tmp_path, "other.json", _doc({1: [0.01, 0.02]}, arm="planted:1us"))
    with pytest.raises(ValueError, match="other.json: no decode size .* 'patched'"):
        enginepairs.build([other], "patched")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert enginepairs.main([str(bad)]) == 2
    assert "bad.json:1: graph-steps is not valid JSON" in capsys.readouterr().err
    assert enginepairs.main([str(tmp_path / "gone.json")]) == 2
    assert "gone.json: no such graph-steps file\n" in capsys.readouterr().err


def test_cli_writes_the_document_with_its_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = _write(tmp_path, "a.json", _doc({1: [-0.01, -0.01]}))
    b = _write(tmp_path, "b.json", _doc({1: [-0.02, -0.02]}))
    out = tmp_path / "pairs.json"
    assert enginepairs.main([str(a), str(b), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"][:3] == ["python", "-m", "integration.proof.enginepairs"]
    assert "| 1 | 2 |" in capsys.readouterr().out


def test_committed_h200_pooling_rederives_from_its_files() -> None:
    path = RESULTS / "h200-llama8b-engine-pairs.json"
    committed = read_json(path, None, "engine pairs")
    root = RESULTS.parents[1]
    again = enginepairs.build([root / f["path"] for f in committed["files"]], committed["arm"])
    assert again["sizes"] == committed["sizes"]
    assert len(committed["files"]) >= 4


def test_a_run_with_replicas_averages_its_engines_per_round(tmp_path: Path) -> None:
    # per round: patched, patched-b and stock-b against stock (whose own ratio is 0)
    arms = {"patched": [-0.02, -0.01], "patched-b": [-0.04, -0.03], "stock-b": [0.01, 0.03]}
    doc = {"command": "prove --replicas 2", "model": "m",
           "sizes": [{"batch_tokens": 1, "arms": {k: {"per_round_log_ratio": v} for k, v in arms.items()}}]}
    est = enginepairs.pair_estimates(doc, "patched")[1]
    # round 1: (-0.02 - 0.04) / 2 - (0 + 0.01) / 2 = -0.035; round 2: -0.02 - 0.015 = -0.035
    assert est["log_ratio"] == pytest.approx(-0.035) and est["engines"] == {"patched": 2, "stock": 2}
    assert est["within_ci95_pct"] == pytest.approx([100 * math.expm1(-0.035)] * 2)  # no spread over rounds
    twin = enginepairs.pair_estimates(doc, "stock-b")[1]  # the engines' own difference, as measured
    assert twin["log_ratio"] == pytest.approx(0.02) and twin["engines"] == {"stock-b": 1, "stock": 1}
    one = enginepairs.pair_estimates(_doc({1: [-0.01, -0.03]}), "patched")[1]  # no replicas: as before
    assert one["log_ratio"] == pytest.approx(-0.02) and one["engines"] == {"patched": 1, "stock": 1}


def test_replicas_timed_in_different_rounds_are_refused(tmp_path: Path) -> None:
    doc = {"sizes": [{"batch_tokens": 4, "arms": {"patched": {"per_round_log_ratio": [0.0, 0.01]},
                                                  "stock-b": {"per_round_log_ratio": [0.01]}}}]}
    with pytest.raises(ValueError, match="different numbers of rounds"):
        enginepairs.pair_estimates(doc, "patched")
