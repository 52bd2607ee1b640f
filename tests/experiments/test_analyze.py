import json
import math
from pathlib import Path

import pytest

from common.jsonfile import read_json
from experiments.analyze import analyze_run, main
from experiments.core.slo import SLO
from experiments.stats import intervals as stats
from tests.experiments.synthetic_run import write_run

CHAT = SLO("chat", 2000.0, 100.0)


def misses(arm, win):
    """Requests missing the chat SLO per (arm, window): stock 4-6, the treatment 2 fewer."""
    return 4 + win % 3 - (2 if arm == "patched" else 0)


def ab_cell(arm, win, load, rng):
    m = misses(arm, win)
    return [(100.0 * load, 20.0, None)] * (40 - m) + [(3000.0, 20.0, None)] * m


def aa_cell(arm, win, load, rng):
    m = 4 + int(rng.integers(0, 3))
    return ([(100.0 * load, 20.0, None)] * (40 - m) + [(3000.0, 20.0, None)] * (m - 1)
            + [(10.0, 1.0, "HTTP 500")])


def test_ab_report_json_and_markdown(tmp_path):
    run_dir = write_run(tmp_path / "run", ab_cell)
    r = analyze_run(run_dir, [CHAT])
    on_disk = json.loads((run_dir / "report.json").read_text())
    for key in ("trace", "model", "gpu", "arms", "design", "slos", "attribution", "schema_version", "status",
                "missing", "latency", "mde_pct"):
        assert key in on_disk, key
    assert on_disk["trace"]["sha256"] == "ab" * 32 and on_disk["status"] == "complete"
    s = on_disk["slos"][0]
    assert (s["name"], s["ttft_ms"], s["tpot_ms"]) == ("chat", 2000.0, 100.0)
    stock_met = sum(40 - misses("stock", w) for w in range(6)) * 2  # two loads
    patched_met = sum(40 - misses("patched", w) for w in range(6)) * 2
    assert s["stock"]["attainment"] == pytest.approx(stock_met / 480)
    assert s["patched"]["attainment"] == pytest.approx(patched_met / 480)
    # goodput: met over wall time; windows 20 s at loads 1 and 2 -> 6*20 + 6*10 s per arm
    assert s["stock"]["goodput_rps"] == pytest.approx(stock_met / 180.0)
    assert s["n_paired"] == 12 and s["significant"] is True and s["ci95_pct"][0] > 0
    assert s["delta_goodput_pct"] == pytest.approx(100 * 2 / (stock_met / 12))
    assert r["records"]["warmup_excluded"] == 6 and on_disk["aa"]["is_aa"] is False
    lines = (run_dir / "report.md").read_text().splitlines()
    assert lines[0] == "# RMSNorm A/B goodput report (complete)"
    assert next(x for x in lines if x.startswith("- TPOT")).startswith(
        "- TPOT, paired per request: patched +0.00% vs stock over 12 cells")
    first = next(x for x in lines if x.startswith("- chat"))
    assert first.startswith("- chat (TTFT<=2000 ms, TPOT<=100 ms): patched goodput +")
    assert "over 12 paired windows" in first and "MDE" in first
    assert len(r["plots"]) == 4
    for png in r["plots"]:
        assert (run_dir / png).stat().st_size > 1000


def test_aa_run_says_so_first(tmp_path):
    note = "no CUDA GPU: the patched arm falls back to the stock norm everywhere"
    run_dir = write_run(tmp_path / "aa", aa_cell, labels=("stock-a", "stock-b"), arms=("stock", "stock"),
                        device="cpu", mode_note=note, seed=4)
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    lines = (run_dir / "report.md").read_text().splitlines()
    first = lines.index(next(x for x in lines if x.startswith("**")))  # the first notice, under the table
    assert lines[0].endswith("; A/A run)") and lines[first].startswith("**A/A run**") and note in lines[first]
    cpu = lines[first + 1]
    assert cpu.startswith("**CPU run** — it checks the pipeline") and "not the kernel" in cpu
    assert next(x for x in lines if x.startswith("- chat")).startswith(
        "- chat (TTFT<=2000 ms, TPOT<=100 ms): stock-b goodput")
    assert r["aa"] == {"is_aa": True, "why": note, "controls": []}
    assert r["attribution"]["predicted_step_change_pct"] == 0.0
    assert r["slos"][0]["significant"] is False
    assert r["latency"][0]["failed"] == 6  # one HTTP 500 per window counted, not dropped


def test_partial_run_lists_what_is_missing(tmp_path):
    reason = "server patched died in window 4 at load 2.0: CUDA error"
    skip = {("patched", 4, 2.0), ("stock", 5, 1.0), ("patched", 5, 1.0), ("stock", 5, 2.0),
            ("patched", 5, 2.0)}
    run_dir = write_run(tmp_path / "partial", ab_cell, skip=skip, status="partial", stopped_reason=reason)
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    assert r["status"] == "partial"
    assert {(m["arm"], m["window"], m["load"]) for m in r["missing"]} == skip
    assert r["slos"][0]["unpaired"] == [{"window": 4, "load": 2.0, "arm": "stock"}]
    assert r["slos"][0]["n_paired"] == 9
    # per-load attainment pools only the cells both arms completed: stock's window 4 at 2x is left out
    per_load = {(p["arm"], p["load"]): p["n"] for p in r["slos"][0]["per_load"]}
    assert per_load[("stock", 2.0)] == per_load[("patched", 2.0)] == 4 * 40
    md = (run_dir / "report.md").read_text().splitlines()
    notice = next(x for x in md if x.startswith("**PARTIAL RUN**"))
    assert md[0].endswith("(partial)") and reason in notice and "5 arm-window cells missing" in notice


def test_empty_run_reports_no_comparison(tmp_path):
    run_dir = write_run(tmp_path / "empty", ab_cell, windows=2,
                        skip={(a, w, ld) for a in ("stock", "patched") for w in range(2)
                              for ld in (1.0, 2.0)},
                        status="running")
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    assert r["status"] == "partial" and r["slos"][0]["delta_goodput_pct"] is None
    assert "no goodput comparison" in r["slos"][0]["verdict"]


def test_run_stopped_before_its_first_request_still_gets_a_report(tmp_path):
    # a server that failed to start: not one record, not even a warm-up one (this raised KeyError)
    run_dir = write_run(tmp_path / "none", ab_cell, windows=2, warmup=0,
                        skip={(a, w, ld) for a in ("stock", "patched") for w in range(2)
                              for ld in (1.0, 2.0)},
                        status="partial", stopped_reason="server stock failed to start: boom")
    r = analyze_run(run_dir, [CHAT], draw_plots=False)
    assert r["status"] == "partial" and r["paired_latency"]["patched"]["tpot_ms"]["ci95_pct"] is None
    md = (run_dir / "report.md").read_text()
    assert "server stock failed to start: boom" in md and "no goodput comparison" in md


def test_cli(tmp_path, capsys):
    run_dir = write_run(tmp_path / "cli", ab_cell, windows=2)
    assert main([str(run_dir), "--slo", "tight:150:30", "--slo", "loose:5000:100", "--no-plots"]) == 0
    names = [s["name"] for s in json.loads((run_dir / "report.json").read_text())["slos"]]
    assert names == ["tight", "loose"]
    assert main([str(run_dir), "--slo", "tight:150"]) == 2
    assert "3 or 4 fields" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere")]) == 2


def test_noise_floor_from_an_aa_report(tmp_path):
    aa_dir = write_run(tmp_path / "aa", aa_cell, labels=("stock-a", "stock-b"), arms=("stock", "stock"),
                       seed=4)
    aa = analyze_run(aa_dir, [CHAT], draw_plots=False)
    assert aa["noise_floor"]["source"] == "this run (A/A)"
    sd = aa["slos"][0]["sd_diff_pct"]
    assert aa["noise_floor"]["sd_pct"]["goodput:chat"] == sd
    # windows for +-0.25%: ceil(1.96^2 sd^2 / 0.25^2), and the range from the sd's chi-square interval
    need = aa["noise_floor"]["windows_needed"]["goodput:chat"]
    assert need["windows"] == math.ceil((1.959963985 * sd) ** 2 / 0.0625)
    lo, hi = stats.sd_interval(sd, 12)
    assert need["range"] == [stats.windows_needed(lo, 0.25), stats.windows_needed(hi, 0.25)]
    assert need["range"][0] < need["windows"] < need["range"][1]
    ab_dir = write_run(tmp_path / "ab", ab_cell)
    ab = analyze_run(ab_dir, [CHAT], aa_report=aa_dir / "report.json", draw_plots=False)
    assert ab["noise_floor"]["source"] == str(aa_dir / "report.json") and ab["noise_floor"]["applied"]
    assert "A/A noise floor (" in (ab_dir / "report.md").read_text()
    with pytest.raises(ValueError, match="not the report of an A/A run"):
        analyze_run(write_run(tmp_path / "ab2", ab_cell), [CHAT], aa_report=ab_dir / "report.json",
                    draw_plots=False)
    assert analyze_run(ab_dir, [CHAT], draw_plots=False)["noise_floor"]["source"] is None
    with pytest.raises(ValueError, match="its own A/A noise floor .the run itself, an A/A run."):
        analyze_run(aa_dir, [CHAT], aa_report=aa_dir / "report.json", draw_plots=False)


def test_an_aa_floor_of_another_design_is_flagged_and_not_applied(tmp_path):
    aa_dir = write_run(tmp_path / "aa", aa_cell, labels=("stock-a", "stock-b"), arms=("stock", "stock"),
                       loads=(1.0, 4.0), seed=4)
    analyze_run(aa_dir, [CHAT], draw_plots=False)
    ab = analyze_run(write_run(tmp_path / "ab", ab_cell), [CHAT], aa_report=aa_dir / "report.json",
                     draw_plots=False)
    nf = ab["noise_floor"]
    assert nf["applied"] is False and nf["band_pct"] == {}
    assert [d["key"] for d in nf["design_differences"]] == ["loads"]
    assert "**Not comparable, not applied**" in (tmp_path / "ab" / "report.md").read_text()


def test_an_slo_never_stressed_gets_no_interval_and_no_window_count(tmp_path):
    run_dir = write_run(tmp_path / "run", ab_cell)
    loose = SLO("loose", 60_000.0, 10_000.0)  # every request meets it, none comes near
    r = analyze_run(run_dir, [CHAT, loose], draw_plots=False)
    s = r["slos"][1]
    assert s["stressed"] is False and s["n_near_bound"] == 0 and s["sd_diff_pct"] == 0.0
    assert s["ci95_pct"] is None and s["significant"] is None and s["mde_pct"] is None
    assert ("never stressed at these loads (0 of 960 requests within 10% of a bound and every request "
            "met it)") in s["verdict"]
    assert r["slos"][0]["stressed"] is True


def test_interleaved_aa_arm_is_the_noise_floor_of_the_same_run(tmp_path):
    def cell(arm, win, load, rng):  # patched TPOT +2%, the second stock server the same as the first
        tpot = 20.0 * (1.02 if arm == "patched" else 1.0) * (1 + 0.001 * ((win * 7 + int(load)) % 5))
        return [(100.0 + i, tpot * (1 + 0.01 * (i % 7)), None) for i in range(40)]

    run_dir = write_run(tmp_path / "run", cell, labels=("stock", "patched", "stock-b"),
                        arms=("stock", "patched", "stock"))
    r = analyze_run(run_dir, [CHAT])
    assert r["comparison"] == ["stock", "patched"] and r["aa"]["controls"] == ["stock-b"]
    tpot = r["paired_latency"]["patched"]["tpot_ms"]
    assert tpot["estimate_pct"] == pytest.approx(2.0, abs=0.01)
    assert r["noise_floor"]["source"] == "this run: stock-b vs stock (interleaved)"
    assert r["aa_in_run"]["paired_latency"]["tpot_ms"]["estimate_pct"] == pytest.approx(0.0, abs=1e-6)
    assert r["noise_floor"]["tpot_by_load"] == {}  # identical servers: no spread, no interval per load
    first = next(x for x in (run_dir / "report.md").read_text().splitlines() if x.startswith("- TPOT"))
    assert first.startswith("- TPOT, paired per request: patched +2.00% vs stock")
    assert "forest.png" in r["plots"]
    with pytest.raises(ValueError, match=r"--aa-report .*: this run has its own A/A noise floor \(stock-b\)"):
        # was ignored, and recorded
        analyze_run(run_dir, [CHAT], aa_report=run_dir / "report.json", draw_plots=False)


def test_the_floor_says_which_load_its_noise_comes_from():
    run_dir = Path(__file__).resolve().parents[2] / "experiments" / "results" / "h200-llama8b-twin-aa"
    r = read_json(run_dir / "report.json", None, "report")
    per_load = r["noise_floor"]["tpot_by_load"]
    by_load = r["aa_in_run"]["paired_latency"]["tpot_ms"]["by_load"]
    assert set(per_load) == set(by_load) == {"5", "8", "12"}
    for load, v in per_load.items():
        lo, hi = by_load[load]["ci95_pct"]
        assert v["half_width_pct"] == pytest.approx((hi - lo) / 2)
        assert v["n"] == 24 == by_load[load]["n_cells"]
        assert v["estimator"] == "huber"  # 24 cells, 2 parameters: 22 degrees of freedom
    assert max(per_load, key=lambda k: per_load[k]["half_width_pct"]) == "5"  # the latency-sensitive load
    assert "A/A paired TPOT per load (95% half-width): 5x +-" in (run_dir / "report.md").read_text()
