"""Nsight Compute counters of one norm call against the bytes model: parsing, derivation, tables.

No GPU here: kernels.counters runs `ncu --csv --page raw` on the GPU machine and stores its CSV lines
verbatim in the results file; everything below re-derives the figures from those lines, so a test
can check the committed table against the committed raw counters.

The worker launches `counters_marker` with a grid of (measurement id + 1) blocks before each
measured call, so every profiled kernel after a marker (and before the next) belongs to that call.

Bytes model of one pass (bf16 rows of `hidden`, `unit` = rows x hidden x itemsize bytes):
- load  = (inputs + 1) x unit: x (and the residual) read once, and the weight once per row, as
  every arm measured here reads it (the fused kernel and vLLM's per row, Inductor's per program)
- store = outputs x unit: the output (the fused add: x and the residual, in place)
- DRAM read = inputs x unit + the weight once; DRAM write = store
`row passes` = (loaded bytes - the weight's per-row bytes) / (inputs x unit): 1.0 reads each row
tensor once; vLLM's kernel, whose source reads the row (or the residual it wrote) again after its
block reduce, predicts 2.0 for rms_norm and 1.5 for the fused add (x once, the residual twice).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Collection

SECTOR_BYTES = 32
MARKER = "counters_marker"
LD, ST = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
DRAM_RD, DRAM_WR = "dram__bytes_read.sum", "dram__bytes_write.sum"
L2_HIT, L2_SECTORS = "lts__t_sector_hit_rate.pct", "lts__t_sectors.sum"
DURATION, GRID = "gpu__time_duration.sum", "launch__grid_size"
REQUIRED = (DURATION, GRID, "launch__block_size", LD, ST, DRAM_RD, DRAM_WR, L2_HIT)
OPTIONAL = (L2_SECTORS, "lts__t_sectors_srcunit_tex_op_read.sum")  # dropped if this ncu refuses them
TENSORS = {"rms_norm": (1, 1), "fused_add_rms_norm": (2, 2)}  # (row tensors read, row tensors written)
ARMS = ("fused", "vllm_c", "inductor", "torch")
ARM_TITLES = {"fused": "fused (this kit)", "vllm_c": "vLLM CUDA", "inductor": "Inductor", "torch": "torch"}
_SCALE = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "nsecond": 1, "ns": 1, "usecond": 1e3,
          "us": 1e3, "msecond": 1e6, "second": 1e9, "%": 1, "sector": 1, "": 1}


class CounterError(ValueError):
    """The ncu output or a results file does not say what the derivation needs."""


def _number(text: str, unit: str) -> float | None:
    t = text.strip().replace(",", "")
    if t in ("", "n/a", "N/A"):
        return None
    scale = _SCALE.get(unit.strip().lower())
    if scale is None:
        raise CounterError(f"unit {unit!r} is not one this reader converts (value {text!r})")
    return float(t) * scale


def csv_lines(text: str) -> list[str]:
    """The CSV lines of ncu's output (quoted fields), without ==PROF== and program lines."""
    return [line for line in text.splitlines() if line.startswith('"')]


def parse_raw(lines: list[str], metrics: Collection[str] | None = None) -> list[dict]:
    """Kernels of `ncu --csv --page raw --print-units base` lines, in profiling order:
    {"id", "name", "metrics": {metric: value in bytes, ns, sectors or %}}. `metrics`: the columns to
    read (the ones asked for with --metrics; the raw page adds device attributes such as
    c2clink__present, whose values are words); default every column named like a metric."""
    rows = list(csv.reader(lines))
    if not rows or not rows[0] or rows[0][0] != "ID":
        raise CounterError("no ncu raw-page header (a first line starting with \"ID\") in the output")
    header = rows[0]
    name_col = next((i for i, h in enumerate(header) if h in ("Kernel Name", "Function Name")), None)
    if name_col is None:
        raise CounterError(f"no kernel-name column in the ncu header {header[:12]}")
    metric_cols = [i for i, h in enumerate(header) if (h in metrics if metrics is not None else "__" in h)]
    units = [""] * len(header)
    kernels = []
    for row in rows[1:]:
        if row == header:
            continue
        if len(row) != len(header):
            raise CounterError(f"ncu row of {len(row)} fields under a header of {len(header)}: {row[:3]}")
        if row[0] == "":  # the units line
            units = row
            continue
        kernels.append({"id": int(row[0]), "name": row[name_col],
                        "metrics": {header[i]: _number(row[i], units[i]) for i in metric_cols}})
    kernels.sort(key=lambda k: k["id"])
    return kernels


def by_marker(kernels: list[dict]) -> tuple[dict[int, list[dict]], int]:
    """({measurement id: its kernels}, kernels before the first marker) from profiling order."""
    groups: dict[int, list[dict]] = defaultdict(list)
    current, stray = None, 0
    for k in kernels:
        if MARKER in k["name"]:
            current = int(k["metrics"][GRID]) - 1
            groups.setdefault(current, [])
        elif current is None:
            stray += 1
        else:
            groups[current].append(k)
    return dict(groups), stray


def model(op: str, rows: int, hidden: int, itemsize: int) -> dict:
    """Bytes of one pass (module docstring): load, store, dram_read, dram_write, and the parts."""
    n_in, n_out = TENSORS[op]
    unit = rows * hidden * itemsize
    return {"unit": unit, "inputs": n_in, "outputs": n_out, "weight_per_row": unit,
            "load": (n_in + 1) * unit, "store": n_out * unit,
            "dram_read": n_in * unit + hidden * itemsize, "dram_write": n_out * unit}


def _sum(kernels: list[dict], metric: str) -> float | None:
    vals = [k["metrics"].get(metric) for k in kernels]
    return None if not vals or any(v is None for v in vals) else float(sum(vals))


def l2_hit_pct(kernels: list[dict]) -> float | None:
    """L2 sector hit rate of the call: one kernel's as ncu gives it; several weighted by L2 sectors."""
    if len(kernels) == 1:
        return kernels[0]["metrics"].get(L2_HIT)
    w = [(k["metrics"].get(L2_HIT), k["metrics"].get(L2_SECTORS)) for k in kernels]
    if not w or any(h is None or s is None for h, s in w) or sum(s for _, s in w) == 0:
        return None
    return sum(h * s for h, s in w) / sum(s for _, s in w)


def measure(kernels: list[dict], m: dict) -> dict:
    """One call's counters (summed over its kernels) and their ratios to the bytes model."""
    mod = model(m["op"], m["rows"], m["hidden"], m["itemsize"])
    ld, st = _sum(kernels, LD), _sum(kernels, ST)
    rd, wr, ns = _sum(kernels, DRAM_RD), _sum(kernels, DRAM_WR), _sum(kernels, DURATION)

    def ratio(v: float | None, base: float) -> float | None:
        return None if v is None else v / base

    ld_bytes = None if ld is None else ld * SECTOR_BYTES
    return {"kernels": [k["name"][:80] for k in kernels], "ld_sectors": ld, "st_sectors": st,
            "dram_read_bytes": rd, "dram_write_bytes": wr, "l2_hit_pct": l2_hit_pct(kernels),
            "duration_us": None if ns is None else ns / 1e3,
            "ld_ratio": ratio(ld_bytes, mod["load"]),
            "row_passes": None if ld_bytes is None else
            (ld_bytes - mod["weight_per_row"]) / (mod["inputs"] * mod["unit"]),
            "st_ratio": ratio(None if st is None else st * SECTOR_BYTES, mod["store"]),
            "dram_read_ratio": ratio(rd, mod["dram_read"]), "dram_write_ratio": ratio(wr, mod["dram_write"])}


def derive(doc: dict) -> list[dict]:
    """Per measurement of the results file: its plan entry plus {"cold": ..., "warm": ...} counters,
    re-derived from the stored ncu CSV lines; CounterError when a call has no kernels."""
    per_mode = {}
    for mode, run in doc["runs"].items():
        groups, _ = by_marker(parse_raw(run["csv"], run.get("metrics")))
        per_mode[mode] = groups
    out = []
    for m in doc["measurements"]:
        row = dict(m)
        for mode, groups in per_mode.items():
            kernels = groups.get(m["id"])
            if not kernels:
                raise CounterError(f"{mode} run: no kernel profiled for measurement {m['id']} "
                                   f"({m['arm']} {m['op']} {m['rows']}x{m['hidden']})")
            row[mode] = measure(kernels, m)
        out.append(row)
    return out


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _i(v: float | None) -> str:
    return "-" if v is None else f"{int(round(v)):,}"


FULL_HEADER = ("| arm | op | hidden | rows | variant | kernels | load sectors | load / model | row passes "
               "| store / model | DRAM read / model cold, warm | DRAM write / model cold, warm "
               "| L2 hit % cold, warm | us cold, warm |")


def full_table(rows: list[dict]) -> str:
    """Every measurement: the cold run's sectors (requests do not depend on the cache) and both runs'
    DRAM bytes, L2 hit rate and duration."""
    lines = [FULL_HEADER, "|" + "---|" * FULL_HEADER.count(" | ") + "---|"]
    for r in rows:
        c, w = r["cold"], r.get("warm") or {}
        lines.append(
            f"| {ARM_TITLES[r['arm']]} | {r['op']} | {r['hidden']} | {r['rows']} | {r.get('variant') or '-'} "
            f"| {len(c['kernels'])} | {_i(c['ld_sectors'])} | {_f(c['ld_ratio'])} | {_f(c['row_passes'])} "
            f"| {_f(c['st_ratio'])} | {_f(c['dram_read_ratio'])}, {_f(w.get('dram_read_ratio'))} "
            f"| {_f(c['dram_write_ratio'])}, {_f(w.get('dram_write_ratio'))} "
            f"| {_f(c['l2_hit_pct'], 1)}, {_f(w.get('l2_hit_pct'), 1)} "
            f"| {_f(c['duration_us'])}, {_f(w.get('duration_us'))} |")
    return "\n".join(lines)


def short_table(rows: list[dict]) -> str:
    """README table: row passes by load sectors (cold run) per arm, and the DRAM read over the model
    cold / warm, per (op, hidden, rows)."""
    arms = [a for a in ARMS if any(r["arm"] == a for r in rows)]
    head = "| op | hidden | rows | " + " | ".join(ARM_TITLES[a] for a in arms) + " |"
    lines = [head, "|---|---|---|" + "---|" * len(arms)]
    shapes = sorted({(r["op"], r["hidden"], r["rows"]) for r in rows},
                    key=lambda s: (s[0] != "rms_norm", s[1], s[2]))
    for op, hidden, n in shapes:
        cells = []
        for a in arms:
            key = (a, op, hidden, n)
            r = next((x for x in rows if (x["arm"], x["op"], x["hidden"], x["rows"]) == key), None)
            if r is None:
                cells.append("n/a")
                continue
            cells.append(f"{_f(r['cold']['row_passes'])} ({_f(r['cold']['dram_read_ratio'])} / "
                         f"{_f((r.get('warm') or {}).get('dram_read_ratio'))})")
        lines.append(f"| {op} | {hidden} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
