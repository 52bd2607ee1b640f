"""integration.arms: the one definition of an arm, as server flags, engine kwargs and environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration import arms, names
from integration.launcher import MODELS_DIR


def test_patched_arm_falls_back_to_what_stock_runs() -> None:
    patched = arms.get("patched")
    assert patched.server_args(eager=False) == [
        "--ir-op-priority.rms_norm=cupy_fused,native",
        "--ir-op-priority.fused_add_rms_norm=cupy_fused,native"]
    assert patched.server_args(eager=True) == [
        "--ir-op-priority.rms_norm=cupy_fused,vllm_c,native",
        "--ir-op-priority.fused_add_rms_norm=cupy_fused,vllm_c,native"]
    assert patched.engine_kwargs(eager=True) == {
        "ir_op_priority": {op: ["cupy_fused", "vllm_c", "native"] for op in names.IR_OPS}}


def test_stock_arm_keeps_vllm_defaults_and_the_plugin_out() -> None:
    stock = arms.get("stock")
    assert stock.server_args(eager=True) == [] and stock.engine_kwargs(eager=False) == {}
    assert stock.env() == {"VLLM_PLUGINS": ""}
    assert arms.get("patched").env() == {"VLLM_PLUGINS": names.PLUGIN_NAME}


def test_a_provider_named_in_the_fallback_is_not_repeated() -> None:
    assert arms.Arm("cuda", provider="vllm_c").ir_op_priority(eager=True)["rms_norm"] == ["vllm_c", "native"]


def test_unknown_arm_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown arm 'fast'.*stock.*patched"):
        arms.get("fast")


def test_compilation_config_has_range_ends_only_where_the_policy_switches() -> None:
    cc = arms.compilation_config(MODELS_DIR / "llama-3.1-8b", "bfloat16")
    assert cc["cudagraph_num_of_warmups"] == 1
    assert arms.compilation_config_for([]) == {"cudagraph_num_of_warmups": 1}
    assert arms.compilation_config_for([1024, 2048])["compile_ranges_endpoints"] == [1024, 2048]
    assert cc == arms.compilation_config_for(cc.get("compile_ranges_endpoints", []))


def test_only_the_policy_arms_get_its_compile_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    from integration import choice
    from kernels.policy import load_policy

    pol = load_policy(MODELS_DIR.parents[1] / "runtime_tables" / "policy-h200-in-graph.json")
    monkeypatch.setattr(choice, "policy", lambda mode="compiled": pol)
    choice.choose.cache_clear()
    try:
        model = MODELS_DIR / "llama-3.1-8b"
        patched = arms.compilation_config(model, "bfloat16", arm=arms.get("patched"))
        assert patched["compile_ranges_endpoints"] == [32]  # the shipped H200 table: fused at <= 32 rows
        planted = arms.compilation_config(model, "bfloat16", arm=arms.get("planted:500ns"))
        assert planted == patched  # the control is patched plus the delay: the same compiled ranges
        for name in ("stock", "vllm_c"):  # vLLM's own single range, as users run it
            cc = arms.compilation_config(model, "bfloat16", arm=arms.get(name))
            assert cc == {"cudagraph_num_of_warmups": 1}
    finally:
        choice.choose.cache_clear()


def test_plugin_entry_point_check(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("stock", "patched", "planted"):
        arms.check_plugin_installed(arms.get(name))  # installed editable in this venv
    monkeypatch.setattr(arms.importlib.metadata, "entry_points", lambda group: [])
    arms.check_plugin_installed(arms.get("stock"))  # loads none
    with pytest.raises(RuntimeError, match=r"\['rmsnorm_fused'\].*pip install -e"):
        arms.check_plugin_installed(arms.get("patched"))


@pytest.mark.parametrize(("spec", "ns", "name"), [("planted", 2000, "planted:2us"),
                                                  ("planted:0.5us", 500, "planted:0.5us"),
                                                  ("planted:750ns", 750, "planted:750ns")])
def test_planted_arm_is_a_known_delay_in_every_fused_call(spec: str, ns: int, name: str) -> None:
    arm = arms.get(spec)
    patched = arms.get("patched")
    assert arm.name == name and arms.is_planted(arm) and not arms.is_planted(patched)
    # the patched arm plus the delay: same plugin, provider and flags, so the same compiled graphs
    assert arm.env() == {**patched.env(), names.PLANTED_NS_ENV: str(ns)}
    assert (arm.plugins, arm.provider, arm.server_args(False)) == (patched.plugins, patched.provider,
                                                                    patched.server_args(False))
    assert arms.uses_policy(arm) and arm.description.startswith(arms.PLANTED_TWIN)


@pytest.mark.parametrize("spec", ["planted:0us", "planted:2ms", "planted:5000us", "plant"])
def test_bad_planted_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="planted"):
        arms.get(spec)


def test_builtin_arms_come_from_the_shipped_file() -> None:
    builtin = {"stock", "patched", "plugin-idle", "vllm_c"}
    assert set(arms.load_arm_file(arms.BUILTIN_FILE)) == builtin == set(arms.ARMS)
    assert arms.get("vllm_c").server_args(eager=False) == [
        "--ir-op-priority.rms_norm=vllm_c,native", "--ir-op-priority.fused_add_rms_norm=vllm_c,native"]
    assert arms.get("vllm_c").env() == {"VLLM_PLUGINS": ""}
    assert all(arm.description for arm in arms.ARMS.values())


def test_a_user_arm_file_adds_arms_with_their_own_flags_and_env(tmp_path) -> None:
    path = tmp_path / "arms.toml"
    path.write_text('[[arm]]\nname = "no-custom-ar"\nserver_args = ["--disable-custom-all-reduce"]\n'
                    'env = { VLLM_FOO = "1" }\n\n[[arm]]\nname = "bigger-kv"\n'
                    'server_args = ["--kv-cache-memory-bytes=1000"]\n')
    found = arms.load_arm_file(path)
    mine = arms.get("no-custom-ar", found)
    assert mine.server_args(eager=True) == ["--disable-custom-all-reduce"]
    assert mine.env() == {"VLLM_PLUGINS": "", "VLLM_FOO": "1"}
    assert mine.difference() == ["--disable-custom-all-reduce", "VLLM_FOO=1"]
    assert mine.shared_flags_set() == []
    assert found["bigger-kv"].shared_flags_set() == ["--kv-cache-memory-bytes=1000"]
    assert arms.get("stock", found) is arms.ARMS["stock"]


@pytest.mark.parametrize(("text", "message"), [
    ("[[arm]]\nname = 'x'\nflags = []\n", r"#1: needs a name and only the keys.*unknown \['flags'\]"),
    ("[[arm]]\nname = 'x'\nserver_args = '--a'\n", "server_args must be a list of strings"),
    ("[[arm]]\nname = 'x'\nenv = { A = 1 }\n", "env must be a table of strings"),
    ("[[arm]]\nname = 'x'\n\n[[arm]]\nname = 'x'\n", "#2: name 'x' is taken"),
    ("[[arm]]\nname = 'stock'\n", "#1: name 'stock' is taken by a built-in arm"),
    ("[[arm]]\nname = 'planted:1us'\n", "is taken"),
    ("[arm]\nname = 'x'\n", r"expected one or more \[\[arm\]\] tables"),
    ("[[arm]\n", "not valid TOML"),
])
def test_bad_arm_files_name_the_file_and_the_table(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as exc:
        arms.load_arm_file(path)
    assert "bad.toml" in str(exc.value)


def test_a_missing_arm_file_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="nope.toml: cannot read the arm file"):
        arms.load_arm_file(tmp_path / "nope.toml")


def test_policy_record_names_a_table_of_the_project_relative_to_it(tmp_path: Path) -> None:
    from integration import choice

    inside = Path(__file__).resolve().parents[2] / "runtime_tables" / "policy-h200-in-graph.json"
    rec = choice.policy_record("bf16", 4096, table=inside)
    assert rec["table"] == "runtime_tables/policy-h200-in-graph.json"
    assert rec["segments"]["rms_norm"][0][:2] == [1, 32]
    outside = tmp_path / "table.json"
    outside.write_bytes(inside.read_bytes())
    assert choice.policy_record("bf16", 4096, table=outside)["table"] == str(outside)


def test_replica_labels_name_an_arms_further_engines_and_map_back_only_within_their_run() -> None:
    assert [arms.replica_label("stock", k) for k in range(3)] == ["stock", "stock-b", "stock-c"]
    assert arms.replica_label("planted:3us", 1) == "planted:3us-b"
    run = {"stock", "stock-b", "plugin-idle", "planted:3us-b", "planted:3us"}
    assert arms.replica_base("stock-b", run) == "stock"
    assert arms.replica_base("planted:3us-b", run) == "planted:3us"
    assert arms.replica_base("plugin-idle", run) == "plugin-idle"  # not a replica: no "plugin" arm
    assert arms.replica_base("x-b", run) == "x-b"  # "x" is not in the run
    with pytest.raises(ValueError, match="out of range"):
        arms.replica_label("stock", 25)


def test_an_arm_may_name_every_provider_vllm_registers_for_its_norm_ops() -> None:
    import vllm.ir as ir
    import vllm.kernels  # noqa: F401  (registers vLLM's providers)

    for op in names.IR_OPS:
        assert set(getattr(ir.ops, op).impls) - {names.PROVIDER} <= set(arms.VLLM_PROVIDERS)
