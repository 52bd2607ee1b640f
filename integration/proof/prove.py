"""Prove the fused RMSNorm runs inside vLLM and changes nothing but the kernel; profile decode steps.

    python -m integration.proof.prove --out OUT [--model integration/models/llama-3.1-8b]
    python -m integration.proof.prove --out OUT --model integration/models/qwen3-0.6b --dry-run

Starts four offline vLLM engines at once, one process each (integration/prove_arm.py): stock and
patched, compiled (torch.compile + CUDA graphs) and eager. Each greedy-decodes the same seeded
prompts with the same seeded dummy weights and kernel-traces a few decode steps. When all four are
ready, the two compiled ones take turns, alone on the GPU, profiling decode steps per batch size
and prefill size (two rounds each, in the order stock, patched, patched, stock). `--replicas 2`
gives each compiled arm a second engine (stock-b, patched-b) in the same turns, so that one run
averages over two engines per arm and measures how far two stock engines differ.

Writes OUT/<gpu>.json (e.g. h200.json; evidence: providers, priorities, plugin log lines, kernels seen
in CUDA-graph replays, greedy agreement, the command), OUT/<gpu>-profile.json (per batch size: step
time, norm time and calls, stock vs patched, with raw samples), OUT/raw-steps.json.xz (the compiled
engines' raw step data, from which `python -m integration.proof.evidence --raw ... --out ...` rebuilds
the profile) and OUT/logs.tar.gz. Both count norm calls per step by kind (hidden-size and head_dim
rows, from the model's config.json) against what its layers make (integration.proof.normcalls): 2L+1
hidden-size norms per forward, and 2L head norms for Qwen3's q/k norms. `--dry-run` checks the model
config and the policy, prints what would run (norms per forward, tables, compile ranges, worker
commands) and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from common.cliargs import command_line, fail
from common.jsonfile import write_json
from integration import arms, choice, compilecache
from integration.launcher import MODELS_DIR
from integration.names import IR_OPS, POLICY_ENV
from integration.proof import evidence, graphtime, normcalls
from kernels import environment as kernel_env

PROG = "python -m integration.proof.prove"
ARMS = [("stock", "compiled"), ("patched", "compiled"), ("stock", "eager"), ("patched", "eager")]
LOG_MARKERS = ("rmsnorm_fused", "cupy_fused", "Final IR op priority")
ENGINE_GPU_SHARE = 0.2  # each engine's --gpu-memory-utilization (its KV cache is set apart: 4 GiB)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True,
                   help="directory for <gpu>.json, <gpu>-profile.json, logs.tar.gz (<gpu>: e.g. h200)")
    p.add_argument("--model", default=str(MODELS_DIR / "llama-3.1-8b"),
                   help="model dir (dummy weights; default integration/models/llama-3.1-8b)")
    p.add_argument("--dtype", default="bfloat16", help="model dtype (default bfloat16)")
    p.add_argument("--prompts", type=int, default=4, help="greedy prompts per arm (default 4)")
    p.add_argument("--steps", type=int, default=256, help="greedy tokens per prompt (default 256)")
    p.add_argument("--batch-sizes", default="1,8,32,128,256",
                   help="decode batch sizes to profile (default 1,8,32,128,256)")
    p.add_argument("--prefill-sizes", default="",
                   help="prompt lengths (comma list, each <= 16384) whose one-request prefill is "
                        "profiled too; default none")
    p.add_argument("--timed-steps", type=int, default=20,
                   help="steps timed per batch or prefill size (default 20)")
    p.add_argument("--traced-steps", type=int, default=4,
                   help="decode steps kernel-traced per batch size (default 4)")
    p.add_argument("--modes", default="compiled,eager",
                   help="which modes to run: compiled, eager or both (comma list; default compiled,eager)")
    p.add_argument("--profile-modes", default="compiled",
                   help="modes (comma list) whose engines profile the batch and prefill sizes (default "
                        "compiled)")
    p.add_argument("--weights", choices=("scaled", "dummy"), default="scaled",
                   help="scaled: seeded std-0.02 redraw of the dummy weights (default); dummy: vLLM's own")
    p.add_argument("--max-rows", type=int, default=16384,
                   help="scan the policy up to this many rows for compile-range ends (default 16384)")
    p.add_argument("--rounds", type=int, default=2,
                   help="profiling rounds, the arms' order reversed every round (default 2; later ones "
                        "replay graphs only)")
    p.add_argument("--graph-replays", type=int, default=0,
                   help="CUDA-graph replays timed per decode size, round and arm "
                        "(OUT/<gpu>-graph-steps.json); default 0")
    p.add_argument("--shared-ranges", action="store_true",
                   help="give every compiled engine the patched policy's compile ranges (default: "
                        "patched only)")
    p.add_argument("--planted", default=None, metavar="planted:<N>ns",
                   help="also profile this positive-control arm, compiled, in the same turns")
    p.add_argument("--replicas", type=int, default=1,
                   help="engines per compiled arm (default 1); with 2, stock-b and patched-b join the "
                        "turns (enginepairs)")
    p.add_argument("--timeout", type=float, default=500.0, help="overall deadline in seconds (default 500)")
    p.add_argument("--policy", default=None,
                   help="policy table for both modes (default: this GPU's in-vLLM tables in "
                        "runtime_tables/)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the model config and policy, print the plan, start no engine")
    p.add_argument("--all-fused", nargs="?", const="all", choices=("all", "hidden"), default=None,
                   help="fuse every call of the model's shape (`hidden`: leave a Qwen3's q/k head norms "
                        "to stock)")
    return p.parse_args(argv)


def select_policy(a: argparse.Namespace, scratch: Path) -> dict:
    """Point $RMSNORM_FUSED_POLICY (inherited by the workers) at the table given, if any; returns
    the table each mode uses."""
    path = a.policy
    if a.all_fused:
        dtype, hidden = arms.model_shape(a.model, a.dtype)
        shape = normcalls.norm_shape(a.model)
        heads = shape.qk_norm and a.all_fused == "all"
        widths = {hidden, shape.head_dim} if heads else {hidden}  # Qwen3: the head norms too, unless "hidden"
        table = {f"{op}/{dtype}/{w}": [[1 << 30, "fused:auto"]]
                 for op in IR_OPS for w in sorted(widths)}
        path = str(scratch / "policy-all-fused.json")
        write_json(path, {"schema_version": 1, "source": f"--all-fused {a.all_fused}", "table": table})
    if path:
        os.environ[POLICY_ENV] = str(Path(path).resolve())
    choice.policy.cache_clear()
    return {mode: str(choice.policy(mode).source) for mode in choice.MODES}


def compile_ranges(a: argparse.Namespace) -> list[int]:
    """Row counts where the policy switches fused/stock for this model (empty if it never does)."""
    return arms.compilation_config(Path(a.model), a.dtype, a.max_rows).get("compile_ranges_endpoints", [])


def worker_cmd(a: argparse.Namespace, arm: str, mode: str, scratch: Path, ranges: list[int],
               label: str | None = None) -> list[str]:
    """The prove_arm command of one engine (`label`: its name in the run, default the arm)."""
    label = label or arm
    own = ranges if a.shared_ranges or arms.uses_policy(arms.get(arm)) else []  # stock: vLLM's one range
    cmd = [sys.executable, "-m", "integration.proof.prove_arm", "--arm", arm, "--label", label,
           "--mode", mode, "--model", a.model, "--out", str(scratch), "--dtype", a.dtype,
           "--prompts", str(a.prompts),
           "--steps", str(a.steps), "--batch-sizes", a.batch_sizes, "--prefill-sizes", a.prefill_sizes,
           "--timed-steps", str(a.timed_steps), "--traced-steps", str(a.traced_steps),
           "--compile-ranges", ",".join(map(str, own)), "--weights", a.weights,
           "--gpu-memory-utilization", str(ENGINE_GPU_SHARE)]
    if mode in a.profile_modes.split(","):
        cmd += ["--turn-file", str(scratch / f"{label}-{mode}.go"), "--rounds", str(a.rounds),
                "--graph-replays", str(a.graph_replays)]
    return cmd


class Engine(NamedTuple):
    """One engine process of a run: its name in the run (`label`), the arm it runs, and its mode."""

    label: str
    arm: str
    mode: str

    @property
    def name(self) -> str:
        return f"{self.label}-{self.mode}"


def arm_runs(a: argparse.Namespace) -> list[Engine]:
    """Every engine: ARMS in --modes and --planted compiled; with --replicas N, each compiled arm's
    further engines after them, replica by replica (stock, patched, stock-b, patched-b, ...)."""
    modes = set(a.modes.split(","))
    compiled = [arm for arm, mode in ARMS if mode == "compiled" and mode in modes]
    compiled += [a.planted] if a.planted else []
    runs = [Engine(arms.replica_label(arm, k), arm, "compiled")
            for k in range(a.replicas) for arm in compiled]
    return runs + [Engine(arm, arm, mode) for arm, mode in ARMS if mode != "compiled" and mode in modes]


def check_replicas(a: argparse.Namespace) -> None:
    """ValueError unless the engines --replicas asks for fit the GPU's memory shares."""
    if a.replicas < 1:
        raise ValueError(f"--replicas {a.replicas}: at least 1")
    engines = len(arm_runs(a))
    if engines * ENGINE_GPU_SHARE > 1.0:
        raise ValueError(f"--replicas {a.replicas}: {engines} engines of {ENGINE_GPU_SHARE:.0%} of the GPU's "
                         f"memory each do not fit; use --modes compiled or fewer replicas")


def start(cmd: list[str], arm: str, log: Path, mode: str = "compiled",
          label: str | None = None) -> subprocess.Popen:
    """Start one engine process; a replica (label other than its arm) compiles into caches of its own
    beside its log, so that engines starting at once never write one cache directory together."""
    import torch

    definition = arms.get(arm)
    own = {var: str(log.parent / f"cache-{label}" / var.lower()) for var in compilecache.CACHE_VARS}
    env = {**os.environ, **definition.env(), "PYTHONUNBUFFERED": "1",
           **compilecache.cache_env(definition, mode == "eager", torch.cuda.is_available()),
           **(own if label not in (None, arm) else {})}
    with open(log, "wb") as f:
        f.write(f"$ VLLM_PLUGINS={env['VLLM_PLUGINS']!r} {shlex.join(cmd)}\n".encode())
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_all(procs: dict, scratch: Path, suffix: str, deadline: float) -> None:
    """Until every process has written <name><suffix> or exited, or the deadline passes."""
    while time.monotonic() < deadline:
        if all((scratch / f"{n}{suffix}").exists() or p.poll() is not None for n, p in procs.items()):
            return
        time.sleep(0.5)


def round_order(runs: list[Engine], modes: list[str], rounds: int = 2) -> list[tuple[str, int]]:
    """(engine, round) turns: per mode, its engines in order in odd rounds and reversed in even ones
    (stock, patched, patched, stock, ...: drift and position cancel over each pair of rounds)."""
    turns = []
    for m in modes:
        names = [e.name for e in runs if e.mode == m]
        for r in range(1, rounds + 1):
            turns += [(n, r) for n in (names if r % 2 else names[::-1])]
    return turns


def take_turns(procs: dict, scratch: Path, deadline: float, turns: list[tuple[str, int]]) -> None:
    """Let the profiling engines run alone on the GPU in turn (see round_order)."""
    for name, r in turns:
        if name not in procs or procs[name].poll() is not None:
            continue
        (scratch / f"{name}.go{r}").touch()
        wait_all({name: procs[name]}, scratch, f".done{r}", deadline)


def finish(procs: dict, deadline: float) -> dict[str, int | None]:
    codes = {}
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            codes[name] = None
    return codes


def log_lines(log: Path) -> list[str]:
    """The plugin's and vLLM's kernel-selection lines of an engine log."""
    if not log.exists():
        return []
    return [ln.rstrip()[:400] for ln in log.read_text(errors="replace").splitlines()
            if any(m in ln for m in LOG_MARKERS)][:40]


def machine_record() -> dict:
    """Host, Python and nvidia-smi's view of the GPU, for the evidence file."""
    env = {"host": platform.node(), "python": platform.python_version()}
    smi = kernel_env.smi("name,driver_version,clocks.sm,clocks.mem,memory.total")
    env["nvidia_smi"] = ", ".join(smi) if isinstance(smi, list) else smi  # values, or the error text
    return env


def check_model(a: argparse.Namespace) -> tuple[str, int, normcalls.NormShape]:
    """(dtype, hidden, norm shape) of --model; ValueError with a one-line reason where it is unusable."""
    if not (Path(a.model) / "config.json").is_file():
        known = sorted(d.name for d in MODELS_DIR.iterdir() if (d / "config.json").is_file())
        raise ValueError(f"--model {a.model}: no config.json there (the kit's models: {', '.join(known)})")
    dtype, hidden = arms.model_shape(a.model, a.dtype)
    return dtype, hidden, normcalls.norm_shape(a.model)


def dry_run(a: argparse.Namespace, shape: normcalls.NormShape) -> dict:
    """What a run would do, without starting an engine."""
    with tempfile.TemporaryDirectory() as tmp:
        policy_source = select_policy(a, Path(tmp))
        ranges = compile_ranges(a)
        cmds = {e.name: shlex.join(worker_cmd(a, e.arm, e.mode, Path("SCRATCH"), ranges, e.label))
                for e in arm_runs(a)}
    return {"model": a.model, "norm_shape": shape.__dict__, "norms_per_forward": shape.expected(),
            "norms_per_forward_by_op": shape.expected_by_op(), "policy": policy_source,
            "compile_ranges_endpoints": ranges, "worker_commands": cmds}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        _, _, shape = check_model(a)
        check_replicas(a)
    except ValueError as exc:
        return fail(PROG, str(exc))
    if a.dry_run:
        print(json.dumps(dry_run(a, shape), indent=1))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + a.timeout
    modes = set(a.modes.split(","))
    runs = arm_runs(a)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        policy_source = select_policy(a, scratch)
        ranges = compile_ranges(a)
        procs, cmds = {}, {}
        for e in runs:
            cmds[e.name] = worker_cmd(a, e.arm, e.mode, scratch, ranges, e.label)
            procs[e.name] = start(cmds[e.name], e.arm, scratch / f"{e.name}.log", e.mode, e.label)
        wait_all(procs, scratch, ".ready", deadline)
        profiled = [m for m in ("compiled", "eager") if m in modes and m in a.profile_modes.split(",")]
        take_turns(procs, scratch, deadline, round_order(runs, profiled, a.rounds))
        codes = finish(procs, deadline)
        results = {n: json.loads((scratch / f"{n}.json").read_text()) if (scratch / f"{n}.json").exists()
                   else None for n in procs}
        logs = {n: log_lines(scratch / f"{n}.log") for n in procs}
        for n, code in codes.items():
            if code != 0:  # show why on the console too
                tail = (scratch / f"{n}.log").read_text(errors="replace").splitlines()[-25:]
                print(f"--- {n} exited with {code}; last lines of its log:", *tail, sep="\n")
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            for n in procs:
                tar.add(scratch / f"{n}.log", arcname=f"{n}.log")
    command = command_line(PROG, argv)
    doc = evidence.build(results, codes, logs, cmds, ranges, machine_record(), command, a)
    doc["policy"] = policy_source
    gpu = choice.current_gpu() or "no-gpu"  # results are named by the GPU they were measured on
    write_json(out / f"{gpu}.json", doc, allow_nan=True)  # NaN written as before
    if profiled:
        raw = {"model": a.model, "ranges": ranges, "command": command, "environment": doc["environment"],
               "policy": policy_source,
               "results": {e.name: results.get(e.name) for e in runs if e.mode in profiled}}
        write_json(out / "raw-steps.json.xz", raw, allow_nan=True)  # a profiler sample may be NaN
        if a.graph_replays:
            write_json(out / f"{gpu}-graph-steps.json", graphtime.document(raw), allow_nan=True)
        for m in profiled:
            name = f"{gpu}-profile.json" if m == "compiled" else f"{gpu}-profile-{m}.json"
            write_json(out / name, evidence.profile_from_raw(raw, m), allow_nan=True)
    print(json.dumps(doc["summary"], indent=1))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
