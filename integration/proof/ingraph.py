"""Shape policies from timings inside vLLM: fused only where it beat the stock norm in the real model.

    python -m integration.proof.ingraph --profile OUT/h200-profile.json \\
        --out runtime_tables/policy-h200-in-graph.json
    python -m integration.proof.ingraph --profile OUT/h200-profile-eager.json \\
        --out runtime_tables/policy-h200-in-vllm-eager.json

    python -m integration.proof.ingraph --profile OUT/h200-profile.json \\
        --graph-steps OUT/h200-graph-steps.json --launch-policy runtime_tables/policy-h200.json \\
        --out runtime_tables/policy-h200-in-graph.json

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

With `--graph-steps` (a prove run with --graph-replays), a decode size timed by CUDA-graph replays
is judged by that instead: fused when the patched step's 95% interval lies below zero (faster), and
the fused answer is what `--launch-policy` (the table the patched arm ran) gave there.

Row counts between two measured sizes
are fused only when both neighbours are: a policy answer must hold for a whole compile range, and
nothing was measured in between. The table answers both ops alike, because the profile measures
the norm time of a whole step (1 rms_norm and 64 fused_add_rms_norm calls on the 8B shape).
"""

from __future__ import annotations

import argparse
import sys

from common.cliargs import fail, refuse_output
from common.jsonfile import ResultFileError, read_json, write_json
from integration import arms
from integration.launcher import MODELS_DIR
from integration.names import IR_OPS
from kernels import policy as kernel_policy

PROG = "python -m integration.proof.ingraph"
FUSED = "fused:auto"  # the launch shape the --all-fused measurement ran (the kernel's own choice)
RULE = ("fused at a measured size when every traced patched step's norm time + patched_extra_kernels_us "
        "< every traced stock step's and the median patched step wall time <= the stock one; between "
        "measured sizes fused only when both neighbours are")
GRAPH_RULE = ("a decode size timed by CUDA-graph replays is fused when the patched step's 95% interval "
              "over rounds lies below zero, whatever the profile says")


class ProfileError(ValueError):
    """The profile cannot ground an in-graph table; the message says why."""


def graph_verdicts(graph: dict) -> dict[int, bool]:
    """{decode rows: patched step faster with a 95% interval} from a graph-steps file."""
    out = {}
    for row in graph.get("sizes", []):
        ci = (row.get("arms", {}).get("patched") or {}).get("ci95_pct")
        if ci:
            out[int(row["batch_tokens"])] = ci[1] < 0
    return out


def verdicts(profile: dict, graph: dict | None = None) -> dict[int, bool]:
    """{rows: fused?} per measured size; a size measured as decode and as prefill must win in both,
    and a size where the patched arm did not run the fused kernel for every norm call (its policy
    declined some) proves nothing for the kernel and stays stock. Decode sizes in `graph` (a
    graph-steps file) are judged by graph_verdicts."""
    timed = graph_verdicts(graph) if graph else {}
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
        if row.get("kind", "decode") == "decode" and n in timed:
            won = all_fused and timed[n]
        else:
            won = (all_fused and bool(row["patched_faster_every_step"])
                   and bool(row["patched_step_not_slower"]))
        out[n] = out.get(n, True) and won
    if not out:
        raise ProfileError("the profile has no steps")
    if not measured:
        raise ProfileError("the patched arm ran the fused kernel for every norm call at no size: "
                           "measure with `integration.proof.prove --all-fused`")
    return dict(sorted(out.items()))


def table_entries(sizes: dict[int, bool], answer=lambda rows: FUSED) -> list[list]:  # noqa: ANN001
    """Policy entries [[rows, answer], ...]: entry i covers (rows_{i-1}, rows_i]; a fused entry
    gets `answer(rows)` (the launch shape)."""
    entries, prev = [], True
    for n, fused in sizes.items():
        entries.append([n, answer(n) if fused and prev else "stock"])
        prev = fused
    return entries


def document(profile: dict, dtype: str, hidden: int, source: str, graph: dict | None = None,
             launch: kernel_policy.Policy | None = None) -> dict:
    """The policy file for the profile's mode: the table (both ops of one model shape) and the
    per-size evidence behind it; `launch` (the table the patched arm ran) gives each fused
    entry's launch shape, per op."""
    sizes = verdicts(profile, graph)
    tables = {}
    for op in IR_OPS:
        def answer(rows: int, op: str = op) -> str:
            return launch.choose(op, dtype, rows, hidden) if launch else FUSED
        tables[f"{op}/{dtype}/{hidden}"] = table_entries(sizes, answer)
    evidence = [{k: row.get(k) for k in ("kind", "batch_tokens", "norm_calls", "fused_calls_patched",
                                         "norm_us_stock", "norm_us_patched",
                                         "patched_extra_kernels_us", "norm_speedup",
                                         "patched_faster_every_step",
                                         "step_us_stock", "step_us_patched", "patched_step_not_slower")}
                for row in profile["steps"]]
    mode = profile.get("mode", "compiled")
    stock = "inductor (in vLLM's graph)" if mode == "compiled" else "vllm_c (vLLM's CUDA kernel, eager)"
    doc = {"schema_version": 1, "source": source, "mode": mode, "stock_arm": stock,
           "rule": RULE, "model_shape": {"dtype": dtype, "hidden": hidden}, "table": tables,
           "evidence": evidence}
    if graph:
        doc["graph_rule"] = GRAPH_RULE
        doc["graph_evidence"] = [{"batch_tokens": r["batch_tokens"], **(r["arms"].get("patched") or {})}
                                 for r in graph.get("sizes", [])]
    return doc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="h200-profile.json of an --all-fused prove run")
    p.add_argument("--out", required=True,
                   help="policy table to write (e.g. runtime_tables/policy-h200-in-graph.json)")
    p.add_argument("--model", default=str(MODELS_DIR / "llama-3.1-8b"),
                   help="model directory the profile ran (its hidden size keys the table)")
    p.add_argument("--dtype", default="bfloat16", help="model dtype the profile ran (default bfloat16)")
    p.add_argument("--graph-steps", default=None,
                   help="h200-graph-steps.json of the same run: decode sizes judged by graph-replay timing")
    p.add_argument("--launch-policy", default=None,
                   help="the policy table the patched arm ran, whose launch shapes fused entries keep "
                        "(default: fused:auto)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    refuse_output(PROG, "--out", a.out, [a.profile, a.graph_steps, a.launch_policy])
    try:
        profile = read_json(a.profile, None, "step profile")
        graph = read_json(a.graph_steps, None, "graph-steps") if a.graph_steps else None
    except ResultFileError as exc:
        return fail(PROG, str(exc))
    launch = kernel_policy.load_policy(a.launch_policy) if a.launch_policy else None
    dtype, hidden = arms.model_shape(a.model, a.dtype)
    source = a.profile + (f" + {a.graph_steps}" if a.graph_steps else "")
    try:
        doc = document(profile, dtype, hidden, source=source, graph=graph, launch=launch)
    except ProfileError as exc:
        return fail(PROG, f"{a.profile}: {exc}")
    write_json(a.out, doc, allow_nan=True)
    key = next(iter(doc["table"]))
    print(f"{a.out}: {key}: " + ", ".join(f"<={n}:{c}" for n, c in doc["table"][key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
