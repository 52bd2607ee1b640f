from experiments.report import aa_reason, verdict


def entry(**kw):
    e = {"name": "chat", "bounds": "TTFT<=2000 ms, TPOT<=100 ms", "baseline": "stock", "treatment": "patched",
         "n_paired": 6, "delta_goodput_pct": 0.4, "ci95_pct": [-1.2, 2.0], "significant": False,
         "mde_pct": 2.1, "sd_diff_pct": 1.5, "reason": None,
         "stock": {"attainment": 0.9}, "patched": {"attainment": 0.91}}
    e.update(kw)
    return e


def test_verdict_no_detectable_difference():
    assert verdict(entry()) == ("chat (TTFT<=2000 ms, TPOT<=100 ms): patched goodput +0.4% vs stock, "
                                "95% CI [-1.2, +2.0]% over 6 paired windows — no detectable difference (MDE 2.1%)")


def test_verdict_significant_direction():
    v = verdict(entry(delta_goodput_pct=-3.0, ci95_pct=[-4.5, -1.5], significant=True))
    assert v.endswith("— patched lower, interval excludes 0 (MDE 2.1%)")


def test_verdict_without_interval_or_pairs():
    one = verdict(entry(n_paired=1, ci95_pct=None, reason="one paired window: no interval or verdict"))
    assert "over 1 paired window — no interval or verdict" in one
    none = verdict(entry(n_paired=0, delta_goodput_pct=None, ci95_pct=None, reason="no paired windows"))
    assert none.endswith("no goodput comparison of patched vs stock — no paired windows")


def test_verdict_saturated_slo_is_not_an_mde_claim():
    v = verdict(entry(delta_goodput_pct=0.0, ci95_pct=[0.0, 0.0], sd_diff_pct=0.0, mde_pct=0.0,
                      stock={"attainment": 1.0}, patched={"attainment": 1.0}))
    assert "every request met this SLO in both arms" in v and "MDE" not in v


def test_aa_reason():
    assert aa_reason({"arms": ["stock", "patched"], "mode_note": None}) is None
    assert aa_reason({"arms": ["stock", "stock"], "mode_note": None}) == "both arms are 'stock'"
    assert aa_reason({"arms": ["stock", "patched"], "mode_note": "cpu fallback"}) == "cpu fallback"


def test_clipping_is_stated_beside_the_design():
    from experiments.report_md import _clipping_line

    assert _clipping_line(None) == [] and _clipping_line({"max_input_tokens": None, "max_output_tokens": None}) == []
    line = _clipping_line({"max_input_tokens": None, "max_output_tokens": 256, "clipped_requests": 7})
    assert line == ["- token counts clipped: input <= no cap, output <= 256 (7 replayed requests changed)"]


def test_latency_lines_give_change_intervals_and_sign_count():
    from experiments.report_md import latency_lines

    r = {"arm_labels": ["stock", "patched"], "secondary": {"tpot_p50_ms": {
        "comparison": {"mean": 12.16, "t_ci95": [-0.04, 24.35], "bootstrap_ci95": [3.7, 22.6]},
        "per_window": [{"diff_pct": d} for d in (2.6, 7.4, 10.4, -0.3)]}}}
    assert latency_lines(r) == ["- median TPOT per window: patched +12.2% vs stock, 95% t CI [-0.0, +24.4]%, "
                                "bootstrap [+3.7, +22.6]%; higher in 3 of 4 paired windows"]


def test_attribution_says_what_part_of_the_measured_change_it_explains():
    from experiments.report_md import _explained

    a = {"predicted_step_change_pct": 0.1}
    assert _explained(a, {"mean": 12.0, "t_ci95": [7.0, 17.0]}) == [
        "- the prediction accounts for 1% of the measured change and lies outside its 95% interval: "
        "the difference is not explained by the norm kernels' GPU time"]
    assert _explained(a, {"mean": 0.2, "t_ci95": [-0.5, 0.9]}) == [
        "- the prediction accounts for 50% of the measured change and lies inside its 95% interval"]
    assert _explained({"predicted_step_change_pct": None}, {"mean": 1.0, "t_ci95": [0, 2]}) == []
