from pathlib import Path

import pytest

from common.jsonfile import read_json
from experiments.core.runfile import Run
from experiments.reporting.report import aa_reason, verdict
from experiments.reporting.schema import Report

BASE = read_json(Path(__file__).resolve().parents[2] / "experiments" / "results" / "h200-llama1b-ab" /
                 "report.json", None, "report")


def typed(**entries) -> Report:
    """A committed A/B report without an A/A arm, floor or planted control, `entries` replaced."""
    return Report.from_json({**BASE, "aa_in_run": None, "noise_floor": None, "planted": [],
                             "aa": {"is_aa": False, "why": None, "controls": []}, **entries})


def entry(**kw):
    e = {"name": "chat", "bounds": "TTFT<=2000 ms, TPOT<=100 ms", "baseline": "stock", "treatment": "patched",
         "n_paired": 6, "delta_goodput_pct": 0.4, "ci95_pct": [-1.2, 2.0], "significant": False,
         "mde_pct": 2.1, "sd_diff_pct": 1.5, "reason": None,
         "stock": {"attainment": 0.9}, "patched": {"attainment": 0.91}}
    e.update(kw)
    return e


def test_verdict_no_detectable_difference():
    assert verdict(entry()) == ("chat (TTFT<=2000 ms, TPOT<=100 ms): patched goodput +0.4% vs stock, "
                                "95% t CI [-1.2, +2.0]% over 6 paired windows — no detectable difference "
                                "(MDE 2.1%)")


def test_verdict_significant_direction():
    v = verdict(entry(delta_goodput_pct=-3.0, ci95_pct=[-4.5, -1.5], significant=True))
    assert v.endswith("— patched lower, interval excludes 0 (MDE 2.1%)")


def test_verdict_without_interval_or_pairs():
    one = verdict(entry(n_paired=1, ci95_pct=None, reason="one paired window: no interval or verdict"))
    assert "over 1 paired window — no interval or verdict" in one
    none = verdict(entry(n_paired=0, delta_goodput_pct=None, ci95_pct=None, reason="no paired windows"))
    assert none.endswith("no goodput comparison of patched vs stock — no paired windows")


def test_verdict_saturated_slo_is_not_an_mde_claim():
    v = verdict(entry(delta_goodput_pct=0.0, ci95_pct=None, sd_diff_pct=0.0, mde_pct=None, stressed=False,
                      n_near_bound=0, n_requests=480, stock={"attainment": 1.0}, patched={"attainment": 1.0}))
    assert v.endswith("never stressed at these loads (0 of 480 requests within 10% of a bound and every "
                      "request met it): no interval and no window count")
    assert "MDE" not in v


def test_aa_reason():
    assert aa_reason(Run(arms=["stock", "patched"])) is None
    assert aa_reason(Run(arms=["stock", "stock"])) == "every arm is 'stock'"
    assert aa_reason(Run(arms=["stock", "patched", "stock"])) is None
    assert aa_reason(Run(arms=["stock", "patched"], mode_note="cpu fallback")) == "cpu fallback"


def test_clipping_is_stated_beside_the_design():
    from experiments.reporting.report_md import _clipping_line

    assert (_clipping_line(None) == []
            and _clipping_line({"max_input_tokens": None, "max_output_tokens": None}) == [])
    line = _clipping_line({"max_input_tokens": None, "max_output_tokens": 256, "clipped_requests": 7})
    assert line == ["- token counts clipped: input <= no cap, output <= 256 (7 replayed requests changed)"]


def test_latency_lines_give_change_intervals_and_sign_count():
    from experiments.reporting.report_latency import latency_lines

    r = typed(comparison=["stock", "patched"], secondary={"tpot_p50_ms": {
        "comparison": {"mean": 12.16, "t_ci95": [-0.04, 24.35], "bootstrap_ci95": [3.7, 22.6]},
        "per_window": [{"diff_pct": d} for d in (2.6, 7.4, 10.4, -0.3)]}})
    assert latency_lines(r) == ["- median TPOT per window (secondary): patched +12.2% vs stock, 95% t CI "
                                "[-0.0, +24.4]%; percentile bootstrap [+3.7, +22.6]%, optimistic over few "
                                "windows; higher in 3 of 4 paired windows"]


def test_attribution_says_what_part_of_the_measured_change_it_explains():
    from experiments.reporting.report_md import _explained

    a = {"predicted_step_change_pct": 0.1}
    assert _explained(a, {"mean": 12.0, "t_ci95": [7.0, 17.0]}) == [
        "- the prediction accounts for 1% of the measured change and lies outside its 95% interval: "
        "the difference is not explained by the norm kernels' GPU time"]
    assert _explained(a, {"mean": 0.2, "t_ci95": [-0.5, 0.9]}) == [
        "- the prediction accounts for 50% of the measured change and lies inside its 95% interval"]
    assert _explained({"predicted_step_change_pct": None}, {"mean": 1.0, "t_ci95": [0, 2]}) == []


def test_paired_lines_lead_with_the_change_its_intervals_and_the_floor_of_the_same_run():
    from experiments.reporting.report_latency import paired_lines

    c = {"estimate_pct": 0.41, "ci95_pct": [0.12, 0.70], "bootstrap_ci95_pct": [0.2, 0.6], "mde_pct": 0.3,
         "n_cells": 48, "position_pct": -1.1, "position_ci95_pct": [-1.4, -0.8], "estimator": "huber",
         "downweighted_cells": 7, "least_squares_pct": 0.5, "least_squares_ci95_pct": [0.1, 0.9]}
    f = {"estimate_pct": 0.02, "ci95_pct": [-0.2, 0.24]}
    r = typed(comparison=["stock", "patched"], paired_latency={"patched": {"tpot_ms": c}},
              aa_in_run={"pair": ["stock", "stock-b"], "paired_latency": {"tpot_ms": f}, "goodput": {},
                         "secondary": {}})
    assert paired_lines(r) == [
        "- TPOT, paired per request: patched +0.41% vs stock, 95% CI [+0.12, +0.70]% (Huber M-estimate with "
        "load effects, order-adjusted t over 48 cells (7 downweighted), primary; least squares +0.50% "
        "[+0.10, +0.90]%; window-block bootstrap [+0.20, +0.60]%); MDE 0.30%; A/A floor (stock-b vs stock, "
        "this run) +0.02% [-0.20, +0.24]%",
        "- position effect on TPOT (each later place in a cell's order vs an earlier one): -1.10% "
        "[-1.40, -0.80]%, removed from the estimate"]
    c.update(estimator="least squares", n_cells=16)  # too few cells for the M-estimate
    assert paired_lines(r)[0].startswith(
        "- TPOT, paired per request: patched +0.41% vs stock, 95% CI [+0.12, +0.70]% (order-adjusted "
        "least-squares t over 16 cells, primary; window-block bootstrap [+0.20, +0.60]%)")


def test_goodput_at_the_knee_joins_the_verdict_of_the_tier_the_search_measured():
    from experiments.reporting.report import _at_knee

    e = {**entry(), "verdict": "chat: ...", "per_window": [
        {"load": 1.0, "diff_pct": 9.0}, {"load": 4.8, "diff_pct": 1.0}, {"load": 4.8, "diff_pct": 2.0},
        {"load": 7.5, "diff_pct": 3.0}, {"load": 7.5, "diff_pct": 2.0}]}
    _at_knee(e, {"loads": [1.0, 4.8, 7.5], "knee": 6.0, "tier": "chat"})
    assert e["at_knee"]["loads"] == [4.8, 7.5] and e["at_knee"]["mean"] == 2.0 and e["at_knee"]["n"] == 4
    assert e["verdict"].startswith("chat: ...; at the knee (6x, measured at 4.8x, 7.5x): +2.0%, 95% t CI [")


def test_further_arms_get_their_own_paired_lines_without_the_floor():
    from experiments.reporting.report_latency import paired_lines

    c = {"estimate_pct": 0.5, "ci95_pct": [0.2, 0.8], "bootstrap_ci95_pct": [0.3, 0.7], "mde_pct": 0.3,
         "n_cells": 16}
    r = typed(comparison=["stock", "patched"], aa={"is_aa": False, "why": None, "controls": ["stock-b"]},
              paired_latency={lab: {"tpot_ms": c} for lab in ("patched", "stock-b", "planted")})
    lines = paired_lines(r)
    assert [x.split(":")[1].split()[0] for x in lines] == ["patched", "planted"]


def test_an_aa_floor_off_zero_says_the_servers_differ():
    from experiments.reporting.report_latency import paired_lines

    c = {"estimate_pct": 0.3, "ci95_pct": [-0.1, 0.7], "bootstrap_ci95_pct": [0.0, 0.6], "mde_pct": 0.6,
         "n_cells": 21}
    off = {"estimate_pct": 0.55, "ci95_pct": [0.20, 0.90]}
    r = typed(comparison=["stock", "patched"], paired_latency={"patched": {"tpot_ms": c}},
              aa_in_run={"pair": ["stock", "stock-b"], "paired_latency": {"tpot_ms": off}, "goodput": {},
                         "secondary": {}})
    assert paired_lines(r)[0].endswith("A/A floor (stock-b vs stock, this run) +0.55% [+0.20, +0.90]% — the "
                                       "A/A interval excludes 0: the two servers of one arm differ, so a "
                                       "change of that size is not the arms'")
    r.aa_in_run.paired_latency["tpot_ms"] = {"estimate_pct": 0.1, "ci95_pct": [-0.2, 0.4]}
    assert "excludes 0" not in paired_lines(r)[0]


def test_a_client_that_fell_behind_is_flagged_at_the_top():
    from experiments.reporting.report_md import LATENESS_BOUND_MS, notices

    rows = [{"arm": "stock", "load": 4.0, "lateness_p99_ms": 0.7},
            {"arm": "patched", "load": 16.0, "lateness_p99_ms": 118.6}]
    r = typed(status="complete", latency=rows)
    lines = notices(r)
    assert LATENESS_BOUND_MS < 118.6
    assert any(x.startswith("**The load generator fell behind**") and "patched 16x (119 ms)" in x
               and "stock 4x" not in x for x in lines)
    rows[1]["lateness_p99_ms"] = 0.8
    assert not any("fell behind" in x for x in notices(r))


def test_a_knee_search_the_client_stopped_is_flagged_at_the_top():
    from experiments.reporting.report_md import notices

    r = typed(status="complete", knee={"stopped": {"reason": "client", "factor": 27.0}})
    (line,) = [x for x in notices(r) if x.startswith("**The client limited the knee search**")]
    assert "at 27x were sent late" in line
    r = typed(status="complete", knee={"stopped": {"reason": "maximum", "factor": 64.0}})
    assert not any("client limited" in x for x in notices(r))


@pytest.mark.parametrize("key, counts, n, notice, shown", [
    ("tpot_unobserved", (0, 40), 73, "**Token timing not observed**", "stock 2x (40 of 73)"),  # read at once
    ("batched", (94, 1121), 1380, "**Tokens streamed in batches**", "stock 2x (81%)"),  # 7% is not flagged
])
def test_replies_without_the_engines_token_timing_are_flagged_at_the_top(key, counts, n, notice, shown):
    from experiments.reporting.report_md import notices

    rows = [{"arm": "stock", "load": 1.0, "n": n, key: counts[0]},
            {"arm": "stock", "load": 2.0, "n": n, key: counts[1]}]
    r = typed(status="complete", latency=rows)
    (line,) = [x for x in notices(r) if x.startswith(notice)]
    assert shown in line and "1x" not in line
    rows[1][key] = 0
    assert not any(x.startswith(notice) for x in notices(r))



def test_goodput_verdicts_carry_the_same_tiers_aa_change_of_the_run():
    from experiments.reporting.report import _with_floor

    pair = ["stock", "stock-b"]
    chat = {"verdict": "chat: patched +6.5%", "ci95_pct": [2.6, 10.5]}
    _with_floor(chat, {"mean": 4.5, "t_ci95": [-4.4, 13.3], "sd": 13.9}, pair)
    assert chat["verdict"] == ("chat: patched +6.5%; A/A floor (stock-b vs stock, this run) +4.5% "
                               "[-4.4, +13.3]%")
    assert chat["aa_floor"]["pair"] == pair and chat["aa_floor"]["mean"] == 4.5
    inter = {"verdict": "interactive: patched +1.0%", "ci95_pct": [-1.0, 3.0]}
    _with_floor(inter, {"mean": 5.0, "t_ci95": [1.0, 9.0], "sd": 6.0}, pair)
    assert inter["verdict"].endswith("+5.0% [+1.0, +9.0]% — the A/A interval excludes 0: the two servers of "
                                     "one arm differ, so a change of that size is not the arms'")
    for entry, floor in (({"verdict": "relaxed: never stressed", "ci95_pct": None},  # no interval of its own
                          {"mean": 1.0, "t_ci95": [0.0, 2.0], "sd": 1.0}),
                         ({"verdict": "chat: +1%", "ci95_pct": [0.5, 1.5]},  # the A/A pair never differed
                          {"mean": 0.0, "t_ci95": [0.0, 0.0], "sd": 0.0}),
                         ({"verdict": "chat: +1%", "ci95_pct": [0.5, 1.5]}, None)):  # no A/A arm
        before = dict(entry)
        _with_floor(entry, floor, pair)
        assert entry == before
