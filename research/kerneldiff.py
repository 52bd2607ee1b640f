"""Which kernels make two engines' decode steps differ: the per-step kernel time of one step size in
two raw-steps files (integration.proof.prove's profiler traces), kernel by kernel.

Engine pairs spread more than their rounds (integration.proof.enginepairs); this says where. Each
side is FILE:ARM (an arm of that file's results, e.g. stock-compiled), the figures the mean over the
traced steps of that size:

    python -m research.kerneldiff \\
        integration/results/h200-llama8b-pairs-2026-12-05/pair5/raw-steps.json.xz:stock-compiled \\
        integration/results/h200-llama8b-pairs-2026-12-05/pair6/raw-steps.json.xz:stock-compiled \\
        --batch-tokens 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.cliargs import fail
from common.jsonfile import ResultFileError, read_json
from integration.proof.evidence import mean_kernel_hist


def step_kernels(path: Path, arm: str, batch_tokens: int) -> dict[str, tuple[float, float]]:
    """Mean (calls, us) per step of each kernel in ``arm``'s traced steps of ``batch_tokens``."""
    raw = read_json(path, None, "raw-steps")
    results = raw.get("results", {})
    if arm not in results:
        raise ValueError(f"{path}: no arm {arm!r} (has {', '.join(results) or 'none'})")
    rows = [s for s in results[arm].get("steps", []) if s.get("batch_tokens") == batch_tokens]
    if not rows or not rows[0].get("traced_steps"):
        raise ValueError(f"{path}: {arm} has no traced step of {batch_tokens} tokens")
    return mean_kernel_hist(rows[0]["traced_steps"])


def diff(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]]) -> list[dict]:
    """One row per kernel: calls and us per step on each side, b - a, largest differences first."""
    rows = []
    for k in set(a) | set(b):
        (calls_a, us_a), (calls_b, us_b) = a.get(k, (0.0, 0.0)), b.get(k, (0.0, 0.0))
        rows.append({"kernel": k, "calls_a": calls_a, "calls_b": calls_b, "us_a": us_a, "us_b": us_b,
                     "diff_us": us_b - us_a})
    return sorted(rows, key=lambda r: -abs(r["diff_us"]))


def _side(text: str) -> tuple[Path, str]:
    path, sep, arm = text.rpartition(":")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FILE:ARM, "
                                         "e.g. raw-steps.json.xz:stock-compiled")
    return Path(path), arm


def main(argv: list[str] | None = None) -> int:
    """CLI: the table to stdout; exit 2 with one line naming a bad file, arm or size."""
    ap = argparse.ArgumentParser(
        prog="python -m research.kerneldiff", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=_side, help="FILE:ARM, the first engine")
    ap.add_argument("b", type=_side, help="FILE:ARM, the second engine (differences are b - a)")
    ap.add_argument("--batch-tokens", type=int, default=1, help="the decode step size (default 1)")
    ap.add_argument("--top", type=int, default=8,
                    help="kernels listed, largest differences first (default 8)")
    args = ap.parse_args(argv)
    try:
        ka, kb = (step_kernels(p, arm, args.batch_tokens) for p, arm in (args.a, args.b))
    except (OSError, ValueError, ResultFileError) as exc:
        return fail(ap.prog, str(exc))
    rows = diff(ka, kb)
    total_a, total_b = sum(u for _, u in ka.values()), sum(u for _, u in kb.values())
    print(f"{args.batch_tokens} tokens: kernel time per step {total_a:.1f} us (a), {total_b:.1f} us (b), "
          f"b - a {total_b - total_a:+.1f} us")
    for r in rows[:args.top]:
        print(f"{r['diff_us']:+8.1f} us  {r['us_a']:8.1f} -> {r['us_b']:8.1f}  calls {r['calls_a']:.0f}/"
              f"{r['calls_b']:.0f}  {r['kernel'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
