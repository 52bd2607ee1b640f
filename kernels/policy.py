"""Shape policy: which (op, dtype, hidden, rows) run the fused kernel, everything else stock.

The table is derived from a benchmark results file: a shape goes to the fused kernel only where its
median beats the best stock arm's median by more than the run-to-run spread (gap between the two
rounds' medians of each arm, added) and at least MIN_MARGIN. Lookups are a dict access and a
bisect: cheap, deterministic, and free of CUDA calls (usable while a CUDA graph is captured).

    python -m kernels.policy --from OUT/<gpu>.json [--out FILE]

writes runtime_tables/policy-<gpu>.json by default (named by the results file it was built from), the table
integration.proof.ingraph and kernels.counters read.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import runtime_tables
from common.cliargs import fail, output_problem
from common.jsonfile import ResultFileError, read_json, write_json
from kernels.checks import DTYPE_NAMES
from kernels.checks import unsupported_reason as _input_reason

SCHEMA_VERSION = 1
MIN_MARGIN = 0.03  # below 3% a win is within what clocks and buffer placement move between runs
STOCK = "stock"


def round_medians(samples: list[float], per_round: int) -> list[float]:
    """Median of each consecutive block of `per_round` samples (one block per timing round)."""
    return [statistics.median(samples[i:i + per_round]) for i in range(0, len(samples), per_round)]


def spread(samples: list[float], per_round: int) -> float:
    """Run-to-run spread: (max - min) of the round medians over the overall median."""
    meds = round_medians(samples, per_round)
    return (max(meds) - min(meds)) / statistics.median(samples)


def decide(row: dict, arms: tuple[str, ...] | None = None) -> tuple[str, dict]:
    """('fused:<variant>' or 'stock', evidence) for one bench row, from its raw samples.

    arms: the stock arms to beat (default: every arm measured, i.e. the best stock arm).
    """
    per = int(row["samples_per_round"])
    stock_samples = {k: v for k, v in row.get("stock_samples_us", {}).items()
                     if v and (arms is None or k in arms)}
    if not stock_samples:
        return STOCK, {"reason": "no stock arm measured"}
    meds = {k: statistics.median(v) for k, v in stock_samples.items()}
    best = min(meds, key=lambda k: meds[k])
    fused_med = statistics.median(row["samples_us"])
    margin = max(MIN_MARGIN, spread(row["samples_us"], per) + spread(stock_samples[best], per))
    gain = meds[best] / fused_med - 1.0
    choice = f"fused:{row['variant']}" if gain > margin else STOCK
    return choice, {"best_stock": best, "best_stock_us": meds[best], "fused_us": fused_med,
                    "gain": gain, "margin": margin}


def build_table(bench_rows: list[dict], arms: tuple[str, ...] | None = None) -> dict:
    """Policy table {"op/dtype/hidden": [[rows, choice], ...]} (rows ascending) from bench rows."""
    table: dict[str, list[list]] = {}
    for row in bench_rows:
        choice, _ = decide(row, arms)
        table.setdefault(f"{row['op']}/{row['dtype']}/{row['hidden']}", []).append([row["rows"], choice])
    for entries in table.values():
        entries.sort(key=lambda e: e[0])
    return table


@dataclass
class Policy:
    """Lookup of (op, dtype, hidden, rows bucket) -> 'fused:<variant>' | 'stock'.

    A rows value uses the first benchmarked row count >= it (rows beyond the largest use the
    largest); an (op, dtype, hidden) not in the table is stock.
    """

    table: dict[str, list[list]]
    source: str = ""
    _index: dict[tuple[str, str, int], tuple[list[int], list[str]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for key, entries in self.table.items():
            op, dtype, hidden = _parse_key(key, self.source)
            rows = [int(e[0]) for e in entries]
            if rows != sorted(rows) or len(set(rows)) != len(rows):
                raise ValueError(f"{self.source}: rows of {key} must be strictly ascending, got {rows}")
            for e in entries:
                if e[1] != STOCK and not str(e[1]).startswith("fused:"):
                    raise ValueError(f"{self.source}: {key} rows {e[0]}: choice {e[1]!r} is not "
                                     "'stock' or 'fused:<variant>'")
            self._index[(op, dtype, hidden)] = (rows, [str(e[1]) for e in entries])

    def choose(self, op: str, dtype: object, rows: int, hidden: int) -> str:
        """'fused:<variant>' or 'stock' for this shape; dtype as 'bf16' or a torch.dtype."""
        name = DTYPE_NAMES.get(dtype, dtype) if not isinstance(dtype, str) else dtype
        entry = self._index.get((op, name, int(hidden)))
        if entry is None or rows < 1:
            return STOCK
        grid, choices = entry
        i = bisect.bisect_left(grid, rows)
        return choices[min(i, len(choices) - 1)]


class EveryCallFused(Policy):
    """Every call of every shape to the fused kernel at its own launch shape ('fused:auto'): the
    planted control's policy, and what `integration.proof.prove --all-fused` measures."""

    def __init__(self, source: str = "every call fused (fused:auto)") -> None:
        super().__init__({}, source=source)

    def choose(self, op: str, dtype: object, rows: int, hidden: int) -> str:
        return "fused:auto" if rows >= 1 else STOCK


def _parse_key(key: str, source: str) -> tuple[str, str, int]:
    parts = key.split("/")
    if len(parts) != 3 or not parts[2].isdigit() or parts[1] not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"{source}: table key {key!r} is not 'op/dtype/hidden' (dtype bf16|fp16|fp32)")
    if parts[0] not in ("rms_norm", "fused_add_rms_norm"):
        raise ValueError(f"{source}: table key {key!r}: unknown op {parts[0]!r}")
    return parts[0], parts[1], int(parts[2])


def default_out(source: str | Path) -> Path:
    """The table built from results file `<gpu>.json` (or .json.xz): runtime_tables/policy-<gpu>.json."""
    name = Path(source).name.removesuffix(".xz").removesuffix(".gz")
    return runtime_tables.path(f"policy-{name.removesuffix('.json')}.json")


CALL_FIELDS = ("op", "dtype", "rows", "hidden", "variant", "median_us", "stock", "policy")


def calls_out(policy_path: str | Path) -> Path:
    """Where the per-call figures go beside the isolated table policy-<gpu>.json: kernel-calls-<gpu>.json."""
    path = Path(policy_path)
    return path.with_name(path.name.replace("policy-", "kernel-calls-", 1))


def calls_document(results: dict, source: str) -> dict:
    """The benchmark's per-call figures the attribution reads (per benchmarked shape: the fused median,
    the stock arms' medians, what the table dispatches), with the results file and command behind them."""
    return {"schema_version": results["schema_version"], "source": source, "command": results.get("command"),
            "bench": [{k: row[k] for k in CALL_FIELDS if k in row} for row in results["bench"]]}


def load_policy(path: str | Path) -> Policy:
    """Read a policy table file (integration.choice finds the one for the GPU it runs on)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"policy table {path} does not exist; "
                                "make it with python -m kernels.policy --from <bench results>") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {doc.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    if not isinstance(doc.get("table"), dict):
        raise ValueError(f"{path}: missing 'table' object")
    return Policy(doc["table"], source=str(path))


def unsupported_reason(x, weight, residual=None) -> str | None:  # noqa: ANN001 (torch tensors)
    """None when the fused kernel takes these inputs at full speed; else why they go to stock."""
    reason = _input_reason(x, weight, residual=residual)
    if reason is not None:
        return reason
    for name, t in (("x", x), ("weight", weight), ("residual", residual)):
        if t is not None and t.data_ptr() % 16:
            return f"{name} is not 16-byte aligned (the table was measured with 128-bit accesses)"
    return None


def table_document(results: dict, source: str, arms: tuple[str, ...] | None = None) -> dict:
    """The policy file's content for a results document; ValueError when that document's validation
    failed (a kernel that computed a wrong answer anywhere gets no table, however fast it ran)."""
    val = results.get("validation")
    if val is not None and val.get("passed") is not True:
        first = (val.get("failures") or ["(none listed)"])[0]
        raise ValueError(f"{source}: validation did not pass ({val.get('failures_total', '?')} of "
                         f"{val.get('cases_run', '?')} cases failed, first: {first}); no policy table "
                         "from a kernel that failed validation")
    return {"schema_version": SCHEMA_VERSION, "source": source, "min_margin": MIN_MARGIN,
            "stock_arms": list(arms) if arms else "all measured",
            "rule": "fused where best_stock/fused - 1 > max(min_margin, spread_fused + spread_stock)",
            "table": build_table(results["bench"], arms)}


def main(argv: list[str] | None = None) -> int:
    """CLI: write the policy table derived from a benchmark results file."""
    ap = argparse.ArgumentParser(
        prog="python -m kernels.policy", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", required=True,
                    help="benchmark results JSON of kernels.suite (e.g. OUT/h200.json)")
    ap.add_argument("--out", help="policy table to write (default: runtime_tables/policy-<name>.json)")
    ap.add_argument("--stock-arms", help="comma-separated stock arms to beat, e.g. inductor (default: "
                                         "the best arm measured)")
    args = ap.parse_args(argv)
    try:
        results = read_json(args.source, None, "kernel results")
    except ResultFileError as exc:
        return fail(ap.prog, str(exc))
    out = Path(args.out) if args.out else default_out(args.source)
    problem = output_problem("--out", out, [Path(args.source)])
    if problem:
        return fail(ap.prog, problem)
    arms = tuple(a.strip() for a in args.stock_arms.split(",")) if args.stock_arms else None
    try:
        doc = table_document(results, args.source, arms)
    except ValueError as exc:
        return fail(ap.prog, str(exc))
    write_json(out, doc)
    fused = sum(1 for v in doc["table"].values() for e in v if e[1] != STOCK)
    total = sum(len(v) for v in doc["table"].values())
    print(f"{out}: {fused} of {total} shapes fused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
