"""Shape policies from timings inside vLLM: fused only where it beat the stock norm in the real model.

    python -m integration.proof.ingraph --profile OUT/h200-profile.json \
        --out kernels/results/policy-h200-in-graph.json
    python -m integration.proof.ingraph --profile OUT/h200-profile-eager.json \
        --out kernels/results/policy-h200-in-vllm-eager.json

The input is a step profile of `python -m integration.proof.prove` (decode and prefill steps, stock and
patched engines of one mode; `--all-fused` makes the patched engine run the fused kernel at every
size). Compiled mode compares against Inductor's norm inside vLLM's graph, eager mode against
vLLM's CUDA kernel with vLLM's eager dispatch around both. A measured size goes to the fused
kernel only when the patched engine ran it for every norm call there and both hold:

* every traced patched step's norm GPU time (plus the kernels Inductor had fused into its norm
  that now run alone) is below every traced stock step's (`patched_faster_every_step`; with 8
  steps per arm an exact Mann-Whitney test at p = 1/12870 one-sided);
* the patched step's median wall time is not above the stock step's (`patched_step_not_slower`):
  outside CUDA graphs every norm call is a Python call plus a CuPy launch, a CPU cost the GPU time
  does not show (integration/launchcost.py), and a CPU-bound step also lets the GPU run at other
  clocks.

Row counts between two measured sizes
are fused only when both neighbours are: a policy answer must hold for a whole compile range, and
nothing was measured in between. The table answers both ops alike, because the profile measures
the norm time of a whole step (1 rms_norm and 64 fused_add_rms_norm calls on the 8B shape).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from integration import arms, choice
from integration.launcher import MODELS_DIR

FUSED = "fused:auto"  # the launch shape the --all-fused measurement ran (the kernel's own choice)
RULE = ("fused at a measured size when every traced patched step's norm time + patched_extra_kernels_us "
        "< every traced stock step's and the median patched step wall time <= the stock one; between "
        "measured sizes fused only when both neighbours are")


class ProfileError(ValueError):
    """The profile cannot ground an in-graph table; the message says why."""


def verdicts(profile: dict) -> dict[int, bool]:
    """{rows: fused?} per measured size; a size measured as decode and as prefill must win in both,
    and a size where the patched arm did not run the fused kernel for every norm call (its policy
    declined some) proves nothing for the kernel and stays stock."""
    out: dict[int, bool] = {}
    measured = 0
    for i, row in enumerate(profile.get("steps", [])):
        where = f"steps[{i}] ({row.get('kind', 'decode')} {row.get('batch_tokens')})"
        if "patched_faster_every_step" not in row or "patched_step_not_slower" not in row:
            raise ProfileError(f"{where}: no patched_faster_every_step (rebuild the profile with "
                               "python -m integration.proof.evidence --raw RAW --out PROFILE)")
        all_fused = bool(row.get("norm_calls")) and row.get("fused_calls_patched") == row["norm_calls"]
        measured += all_fused
        n = int(row["batch_tokens"])
        won = all_fused and bool(row["patched_faster_every_step"]) and bool(row["patched_step_not_slower"])
        out[n] = out.get(n, True) and won
    if not out:
        raise ProfileError("the profile has no steps")
    if not measured:
        raise ProfileError("the patched arm ran the fused kernel for every norm call at no size: "
                           "measure with `integration.proof.prove --all-fused`")
    return dict(sorted(out.items()))


def table_entries(sizes: dict[int, bool]) -> list[list]:
    """Policy entries [[rows, answer], ...]: entry i covers (rows_{i-1}, rows_i]."""
    entries, prev = [], True
    for n, fused in sizes.items():
        entries.append([n, FUSED if fused and prev else "stock"])
        prev = fused
    return entries


def document(profile: dict, dtype: str, hidden: int, source: str) -> dict:
    """The policy file for the profile's mode: the table (both ops of one model shape) and the
    per-size evidence behind it."""
    sizes = verdicts(profile)
    entries = table_entries(sizes)
    evidence = [{k: row.get(k) for k in ("kind", "batch_tokens", "norm_calls", "fused_calls_patched",
                                         "norm_us_stock", "norm_us_patched",
                                         "patched_extra_kernels_us", "norm_speedup",
                                         "patched_faster_every_step",
                                         "step_us_stock", "step_us_patched", "patched_step_not_slower")}
                for row in profile["steps"]]
    mode = profile.get("mode", "compiled")
    stock = "inductor (in vLLM's graph)" if mode == "compiled" else "vllm_c (vLLM's CUDA kernel, eager)"
    return {"schema_version": 1, "source": source, "mode": mode, "stock_arm": stock,
            "rule": RULE, "model_shape": {"dtype": dtype, "hidden": hidden},
            "table": {f"{op}/{dtype}/{hidden}": entries for op in choice.OPS}, "evidence": evidence}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="h200-profile.json of an --all-fused prove run")
    p.add_argument("--out", required=True,
                   help="policy table to write (e.g. kernels/results/policy-h200-in-graph.json)")
    p.add_argument("--model", default=str(MODELS_DIR / "llama-3.1-8b"),
                   help="model directory the profile ran (its hidden size keys the table)")
    p.add_argument("--dtype", default="bfloat16", help="model dtype the profile ran (default bfloat16)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    profile = json.loads(Path(a.profile).read_text())
    dtype, hidden = arms.model_shape(a.model, a.dtype)
    try:
        doc = document(profile, dtype, hidden, source=a.profile)
    except ProfileError as exc:
        print(f"{a.profile}: {exc}", file=sys.stderr)
        return 2
    Path(a.out).write_text(json.dumps(doc, indent=1))
    key = next(iter(doc["table"]))
    print(f"{a.out}: {key}: " + ", ".join(f"<={n}:{c}" for n, c in doc["table"][key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
