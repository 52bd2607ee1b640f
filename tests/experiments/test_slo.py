import pytest

from experiments.analyze import main as analyze
from experiments.core.slo import DEFAULT_SLO_FILE, SLO, load_slo_file, meets, parse_slo
from tests.experiments.synthetic_run import record, write_run

CHAT = SLO("chat", 2000.0, 100.0)


def test_parse_good_strings():
    assert parse_slo("chat:2000:100") == SLO("chat", 2000.0, 100.0)
    assert parse_slo(" tight:250.5:12.5:4000 ") == SLO("tight", 250.5, 12.5, 4000.0)


@pytest.mark.parametrize("text, msg", [
    ("chat:2000", r"\(3 or 4 fields\), got 2"),
    ("chat:2000:100:5:6", r"\(3 or 4 fields\), got 5"),
    ("chat:fast:100", "ttft_ms 'fast' is not a number"),
    ("chat:2000:x", "tpot_ms 'x' is not a number"),
    ("chat:2000:100:soon", "e2e_ms 'soon' is not a number"),
    (":2000:100", "name must be non-empty"),
    ("chat:-5:100", "ttft_ms must be a positive finite number"),
    ("chat:2000:0", "tpot_ms must be a positive finite number"),
    ("chat:inf:100", "ttft_ms must be a positive finite number"),
])
def test_parse_bad_strings_say_what_is_wrong(text, msg):
    with pytest.raises(ValueError, match=msg) as info:
        parse_slo(text)
    assert repr(text) in str(info.value)


def test_default_file_has_the_three_tiers():
    assert load_slo_file(DEFAULT_SLO_FILE) == [
        SLO("interactive", 500.0, 30.0), SLO("chat", 2000.0, 100.0), SLO("relaxed", 6000.0, 175.0)]


def test_slo_file_errors(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[[slo]]\nname = "a"\nttft_ms = 1\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"s.toml: \[\[slo\]\] #1: missing \['tpot_ms'\]"):
        load_slo_file(p)
    p.write_text('[[slo]]\nname = "a"\nttft_ms = 1\ntpot_ms = 2\n'
                 '[[slo]]\nname = "a"\nttft_ms = 1\ntpot_ms = 2\n')
    with pytest.raises(ValueError, match="duplicate SLO names"):
        load_slo_file(p)
    p.write_text("slo = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_slo_file(p)
    p.write_text('[[slo]]\nname = "a"\nttft_ms = "x"\ntpot_ms = 2\n')
    with pytest.raises(ValueError, match="ttft_ms must be a number"):
        load_slo_file(p)


TIER = '[[slo]]\nname = "chat"\nttft_ms = 2000\ntpot_ms = 100\n'


@pytest.mark.parametrize("text, msg", [
    (TIER + '[[sol]]\nname = "tight"\nttft_ms = 500\ntpot_ms = 30\n', r"unknown top-level key\(s\) sol"),
    ('tiers = 2\n' + TIER, r"unknown top-level key\(s\) tiers"),
    ('slo = [1, 2]\n', r"\[\[slo\]\] #1 is not a table"),
])
def test_an_slo_file_with_a_stray_key_or_table_is_refused(tmp_path, capsys, text, msg):
    p = tmp_path / "s.toml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=msg):
        load_slo_file(p)
    run_dir = write_run(tmp_path / "run", lambda *a: [(100.0, 20.0, None)] * 4, windows=1, loads=(1.0,),
                        requests=4, warmup=0)
    assert analyze([str(run_dir), "--slo-file", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(p) in err and not (run_dir / "report.json").exists()


def test_meets_bounds_inclusive_and_exceeded():
    assert meets(record(2000.0, 100.0), CHAT)
    assert not meets(record(2000.001, 50.0), CHAT)
    assert not meets(record(100.0, 100.01), CHAT)


def test_meets_failures_are_misses():
    assert not meets(record(10.0, 1.0, error="timeout"), CHAT)
    assert not meets(record(10.0, 1.0, status=500), CHAT)
    assert not meets(record(10.0, 1.0, out=10, completion=9), CHAT)  # short reply
    assert not meets(record(None, 1.0), CHAT)  # no first token


def test_meets_one_token_reply_tpot_undefined_counts_as_holding():
    assert meets(record(10.0, 0.0, out=1), CHAT)
    assert not meets(record(2500.0, 0.0, out=1), CHAT)


def test_meets_e2e_bound():
    slo = SLO("e2e", 2000.0, 100.0, e2e_ms=1000.0)
    assert meets(record(100.0, 50.0, out=10), slo)  # e2e = 100 + 9*50 = 550
    assert meets(record(100.0, 100.0, out=10), slo)  # e2e = 100 + 9*100 = 1000, bound inclusive
    assert not meets(record(100.0, 99.0, out=10), SLO("e2e", 2000.0, 100.0, e2e_ms=900.0))  # 991 > 900
