"""The ncu counters kit on the CPU: CSV parsing, the bytes model, the tables, and the committed file."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from common.jsonfile import read_json
from kernels import counters, counters_worker, ncu
from kernels.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
METRICS = ncu.REQUIRED + ncu.OPTIONAL
HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", *METRICS]
UNITS = ["", "", "", "", "", "", "", "", "", "", "", "nsecond", "", "", "sector", "sector", "Kbyte", "byte",
         "%", "sector", "sector"]


def _row(i: int, name: str, grid: int, ld: int, st: int, rd: float, wr: int, hit: float = 50.0,
         ns: int = 2000) -> str:
    vals = [str(i), "42", "python3", "127.0.0.1", name, "1", "7", "(256, 1, 1)", f"({grid}, 1, 1)", "0",
            "9.0",
            f"{ns:,}", str(grid), "256", f"{ld:,}", f"{st:,}", str(rd), str(wr), str(hit), "1000", "900"]
    return ",".join(f'"{v}"' for v in vals)


def fixture_lines() -> list[str]:
    """Two measurements: the fused kernel (one pass) and a two-kernel call; ncu's own lines between."""
    quote = lambda fields: ",".join(f'"{v}"' for v in fields)  # noqa: E731
    return ["==PROF== Connected to process 42 (/usr/bin/python3.12)",
            quote(HEADER), quote(UNITS),
            _row(0, "counters_marker", 1, 0, 0, 0, 0),
            # rms_norm 1 x 4096 bf16: x and the weight once = 2 x 8192 bytes = 512 sectors; out 256 sectors
            _row(1, "rmsnorm_kernel", 1, 512, 256, 16.384, 8192, hit=40.0),
            _row(2, "counters_marker", 2, 0, 0, 0, 0),
            _row(3, "triton_red_fused_0", 1, 512, 0, 16.384, 0, hit=20.0, ns=1000),
            _row(4, "triton_poi_fused_1", 1, 256, 256, 0, 8192, hit=80.0, ns=1500),
            "==PROF== Disconnected from process 42"]


def _doc(lines: list[str]) -> dict:
    meas = [{"id": 0, "arm": "fused", "op": "rms_norm", "dtype": "bf16", "itemsize": 2, "rows": 1,
             "hidden": 4096, "variant": "t256r1p", "variant_source": "policy"},
            {"id": 1, "arm": "inductor", "op": "rms_norm", "dtype": "bf16", "itemsize": 2, "rows": 1,
             "hidden": 4096, "variant": None, "variant_source": None}]
    env = {"driver": "580.0", "torch": "2.11", "cupy": "14.2", "gpu": "NVIDIA H200"}
    csv = ncu.csv_lines("\n".join(lines))
    return {"schema_version": counters.SCHEMA_VERSION, "gpu": "NVIDIA H200", "ncu_version": "ncu 2025",
            "command": "python -m kernels.counters --out-dir $OUT", "created_utc": "2026-12-07T06:00:00Z",
            "bytes_model": "one pass", "environment": {"cold": env, "warm": env}, "vllm_c": {"error": "none"},
            "measurements": meas,
            "runs": {m: {"ncu_command": f"ncu --cache-control {c}", "csv": csv}
                     for m, c in counters.MODES.items()}}


def test_parse_skips_tool_lines_and_converts_units() -> None:
    kernels = ncu.parse_raw(ncu.csv_lines("\n".join(fixture_lines())))
    assert [k["id"] for k in kernels] == [0, 1, 2, 3, 4]
    k = kernels[1]["metrics"]
    assert k[ncu.LD] == 512 and k[ncu.DURATION] == 2000  # "2,000" read as 2000
    assert k[ncu.DRAM_RD] == pytest.approx(16384)  # Kbyte -> bytes


def test_parse_refuses_output_without_header() -> None:
    with pytest.raises(ncu.CounterError, match="header"):
        ncu.parse_raw(['"1","2"'])
    with pytest.raises(ncu.CounterError, match="unit"):
        bad = fixture_lines()
        bad[2] = bad[2].replace('"Kbyte"', '"furlong"')
        ncu.parse_raw(ncu.csv_lines("\n".join(bad)))


def test_markers_attribute_kernels() -> None:
    groups, stray = ncu.by_marker(ncu.parse_raw(ncu.csv_lines("\n".join(fixture_lines()))))
    assert stray == 0 and sorted(groups) == [0, 1]
    assert [k["name"] for k in groups[1]] == ["triton_red_fused_0", "triton_poi_fused_1"]


def test_bytes_model() -> None:
    m = ncu.model("fused_add_rms_norm", 32, 4096, 2)
    unit = 32 * 4096 * 2
    assert m["load"] == 3 * unit and m["store"] == 2 * unit
    assert m["dram_read"] == 2 * unit + 4096 * 2 and m["dram_write"] == 2 * unit


def test_one_pass_and_two_passes() -> None:
    rows = ncu.derive(_doc(fixture_lines()))
    fused, ind = rows[0]["cold"], rows[1]["cold"]
    assert fused["ld_ratio"] == pytest.approx(1.0) and fused["row_passes"] == pytest.approx(1.0)
    assert fused["st_ratio"] == pytest.approx(1.0) and fused["dram_write_ratio"] == pytest.approx(1.0)
    # the two-kernel call reads x twice and the weight once: 768 sectors, two passes
    assert ind["row_passes"] == pytest.approx(2.0) and ind["duration_us"] == pytest.approx(2.5)
    assert ind["l2_hit_pct"] == pytest.approx((20 * 1000 + 80 * 1000) / 2000)
    assert len(ind["kernels"]) == 2


def test_a_call_without_kernels_is_an_error() -> None:
    lines = fixture_lines()
    del lines[4]  # the fused kernel's row: measurement 0 has its marker only
    with pytest.raises(ncu.CounterError, match="measurement 0"):
        ncu.derive(_doc(lines))


def test_tables_name_every_measurement() -> None:
    doc = _doc(fixture_lines())
    full = counters.document_table(doc, "counters-h200.json")
    assert "ncu --cache-control all" in full
    assert "| fused (this kit) | rms_norm | 4096 | 1 | t256r1p | 1 | 512 |" in full
    short = counters.readme_section(doc, "kernels/results/counters-h200.json")
    assert "| rms_norm | 4096 | 1 | 1.00 (1.00 / 1.00) | 2.00 (1.00 / 1.00) |" in short


def test_update_readme_replaces_only_the_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{counters.BEGIN}\nold\n{counters.END}\nb\n")
    counters.update_readme(readme, "new")
    assert readme.read_text() == f"a\n{counters.BEGIN}\nnew\n{counters.END}\nb\n"


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert counters.main(["--from", str(tmp_path / "none.json")]) == 2
    assert counters.main([]) == 2
    assert counters.main(["--arms", "fused,cublas", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("python -m kernels.counters: error:") for line in err)


def test_plan_uses_the_policy_then_the_fastest_candidate() -> None:
    pol = load_policy(counters_worker.POLICY_FILE)
    bench = [{"op": "fused_add_rms_norm", "dtype": "bf16", "rows": 2048, "hidden": 4096, "variant": "t128r1"}]
    plan = counters_worker.planned_measurements([1, 2048], [4096, 8193], list(ncu.ARMS), pol, bench)
    fused = {(m["op"], m["rows"], m["hidden"]): m for m in plan if m["arm"] == "fused"}
    assert fused[("rms_norm", 1, 4096)]["variant_source"] == "policy"
    assert fused[("fused_add_rms_norm", 2048, 4096)]["variant"] == "t128r1"
    assert fused[("rms_norm", 1, 8193)]["variant"] is None
    assert not any(m["arm"] == "torch" and m["op"] != "rms_norm" for m in plan)
    assert [m["id"] for m in plan] == list(range(len(plan)))


def test_vllm_launch_follows_its_host_code() -> None:
    # csrc/libtorch_stable/layernorm_kernels.cu: one block per row, 1024 threads at most below 256 rows,
    # 256 from there; rms_norm vectors of gcd(8, hidden) bf16; the fused add's 8-wide build on aligned rows
    name, grid, block = counters_worker.vllm_launch("rms_norm", 32, 4096, 4096, True)
    assert "ELi8ELi2ELb1" in name and (grid, block) == (32, 512)
    name, grid, block = counters_worker.vllm_launch("rms_norm", 16384, 8193, 8193, True)
    assert "ELi1ELi2ELb1" in name and (grid, block) == (16384, 256)
    assert counters_worker.vllm_launch("fused_add_rms_norm", 1, 4096, 4096, True)[1:] == (1, 1024)
    generic = counters_worker.ADD_KERNEL[0]
    assert counters_worker.vllm_launch("fused_add_rms_norm", 1, 4096, 4096, False)[0] == generic
    assert counters_worker.vllm_launch("fused_add_rms_norm", 2, 8193, 8193, True)[0] == generic


def test_error_check_compares_each_arm_with_the_native_formula() -> None:
    torch = pytest.importorskip("torch")
    from kernels import stock

    x0, r0 = torch.randn(3, 64), torch.randn(3, 64)
    w = torch.ones(64)
    m = {"op": "rms_norm", "arm": "torch"}
    assert counters_worker._error(m, stock.rms_native(x0, w, 1e-6), None, None, x0, r0, w) == 0.0
    m = {"op": "fused_add_rms_norm", "arm": "fused"}
    out = stock.add_rms_native(x0, r0, w, 1e-6)[0]
    assert counters_worker._error(m, None, out + 1, None, x0, r0, w) == pytest.approx(1.0)


# by their plain names, as the README names them; read_json reads one committed .xz
COMMITTED = sorted({p.with_name(p.name.removesuffix(".xz"))
                    for p in (ROOT / "kernels" / "results").glob("counters-*.json*")})


def test_readme_table_names_a_committed_file() -> None:
    block = (ROOT / "kernels" / "README.md").read_text().split(counters.BEGIN, 1)[1].split(counters.END, 1)[0]
    if COMMITTED:
        assert any(p.name in block for p in COMMITTED), "the README table is not from a committed file"
    else:
        assert "Not measured yet" in block


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
@pytest.mark.evidence
def test_committed_file_rederives_the_readme_table(path: Path) -> None:
    doc = read_json(path, None, "counters")
    readme = (ROOT / "kernels" / "README.md").read_text()
    block = readme.split(counters.BEGIN, 1)[1].split(counters.END, 1)[0].strip()
    if path.name not in block:
        pytest.skip(f"the README's table is made from another file than {path.name}")
    assert counters.readme_section(doc, f"kernels/results/{path.name}").strip() == block
    md = path.with_suffix(".md")
    assert md.read_text().strip() == counters.document_table(doc, path.name).strip()
    for mode, run in doc["runs"].items():
        assert "--clock-control none" in run["ncu_command"] and run["exit_code"] == 0, mode
    assert ("--cache-control all" in doc["runs"]["cold"]["ncu_command"]
            and "--cache-control none" in doc["runs"]["warm"]["ncu_command"])
    # negative control: one raw counter changed in the stored CSV changes the derived table
    tampered = copy.deepcopy(doc)
    lines = tampered["runs"]["cold"]["csv"]
    kernels = ncu.parse_raw(lines, tampered["runs"]["cold"]["metrics"])
    victim = next(k for k in kernels if ncu.MARKER not in k["name"] and k["metrics"][ncu.LD])
    header = next(iter(__import__("csv").reader(lines[:1])))
    col = header.index(ncu.LD)
    for i, line in enumerate(lines):
        fields = next(iter(__import__("csv").reader([line])))
        if fields[0] == str(victim["id"]):
            fields[col] = str(int(victim["metrics"][ncu.LD] * 2))
            lines[i] = ",".join(f'"{f}"' for f in fields)
    assert counters.readme_section(tampered, f"kernels/results/{path.name}").strip() != block
