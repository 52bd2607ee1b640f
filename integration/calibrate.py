"""Calibrate the kit for the GPU it finds and a model shape, in one command: validation, the isolated
benchmark, the in-vLLM step timing, the in-graph policy table and the planted control's cost.

    python -m integration.calibrate [--model integration/models/llama-3.1-8b] [--dtype bfloat16] [--out DIR]

Each step is one of the kit's own commands, run in its own process (the same command a user could
run by hand; docs/DESIGN.md, "A new GPU"):

1. `kernels.suite` at the model's norm widths: reduced validation with both negative controls and the
   sanitizers, the benchmark against every stock arm, the isolated table;
2. `integration.proof.prove --all-fused`: stock and all-fused engines of the model, decode steps timed
   by CUDA-graph replay at the decode sizes and a few prefill sizes;
3. `integration.proof.ingraph`: the in-graph policy table from those timings;
4. `integration.proof.plantedcost`: what the planted control's delay adds per norm call.

What the kit reads at run time goes to the runtime_tables package (runtime_tables/README.md): the
isolated and the in-graph policy tables, the benchmark's per-call figures, the planted cost, the
prove step's CUDA-graph step times (`graph-steps-<gpu>-<model>.json`) and the record
`runtime_tables/calibration-<gpu>.json`, which holds the key (GPU name and memory, driver, torch,
vLLM, CuPy, the kernel source's hash, the model shape), each step's command, wall time and outputs.
The evidence (the benchmark, the in-vLLM timings) goes to `--out` (default:
`<gpu>-<model>-calibration/` in the current folder).
A second call with the same key and every output present reuses it; a changed key recalibrates and
says which part changed. `--dry-run` prints the steps and the estimate and runs nothing. A GPU's files
hold one model shape at a time: calibrating another shape rewrites them (the key says which).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import runtime_tables
from common.cliargs import OneLineParser, command_line, fail
from common.jsonfile import ResultFileError, read_json, stored, write_json
from integration.launcher import MODELS_DIR
from integration.proof.normcalls import norm_shape
from kernels.shapes import CONFIG_DTYPES

PROG = "python -m integration.calibrate"
SCHEMA_VERSION = 1
ROOT = Path(__file__).resolve().parents[1]
KERNEL_SOURCES = ("rmsnorm.cu", "rmsnorm_common.cuh", "rmsnorm_staged.cu")
DECODE_SIZES = "1,4,16,32,64,128,256"
PREFILL_SIZES = "512,2048,8192"
PLANTED_NS = "1000,3000"


@dataclass(frozen=True)
class Step:
    """One calibration step: its name, the command's arguments after `python -m`, what it writes and
    a first guess of its seconds, used until a calibration of this GPU has measured it (`estimates`)."""

    name: str
    args: tuple[str, ...]
    outputs: tuple[Path, ...]
    estimate_s: float


def record_path(gpu: str) -> Path:
    """Where a GPU's calibration record is kept (the runtime_tables package)."""
    return runtime_tables.path(f"calibration-{gpu}.json")


def graph_steps_table(gpu: str, model: str) -> Path:
    """Where the calibration keeps the GPU's CUDA-graph step times for `model` (the runtime_tables
    package), a copy of its prove step's graph-steps file."""
    return runtime_tables.path(f"graph-steps-{gpu}-{model}.json")


def graph_steps_file(gpu: str, model: str) -> Path | None:
    """The graph-steps file (the stock and all-fused engines' CUDA-graph decode steps) of the GPU's
    committed calibration where it was made for `model` (the model directory's name), kept in the
    runtime_tables package; None where there is none."""
    try:
        rec = read_json(record_path(gpu), SCHEMA_VERSION, "calibration record")
    except ResultFileError:
        return None
    if ((rec.get("key") or {}).get("model") or {}).get("name") != model:
        return None
    kept = graph_steps_table(gpu, model)
    return kept if stored(kept).is_file() else None


def kernel_source_hash() -> str:
    """sha256 over the kernel's source files, in a fixed order."""
    h = hashlib.sha256()
    for name in KERNEL_SOURCES:
        h.update(name.encode() + b"\0" + (ROOT / "kernels" / name).read_bytes())
    return h.hexdigest()


def model_key(model: Path, dtype: str) -> dict:
    """The model shape a calibration holds for: dtype and every width its norms use."""
    shape = norm_shape(model)
    widths = sorted({shape.hidden} | ({shape.head_dim} if shape.qk_norm else set()))
    return {"name": model.name, "dtype": CONFIG_DTYPES[dtype], "norm_widths": widths,
            "architecture": shape.architecture}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_key() -> dict:
    """GPU name and memory, driver, torch, vLLM and CuPy versions of this machine (needs CUDA)."""
    import torch

    from kernels.environment import smi

    props = torch.cuda.get_device_properties(0)
    driver = smi("driver_version")
    return {"gpu": props.name, "memory_bytes": int(props.total_memory),
            "driver": driver[0] if isinstance(driver, list) else driver, "torch": torch.__version__,
            "vllm": _version("vllm"), "cupy": _version("cupy-cuda13x") or _version("cupy-cuda12x")}


def changed(old: Mapping, new: Mapping) -> list[str]:
    """The key fields that differ between two calibration keys (nested fields as a.b)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += [f"{k}.{sub}" for sub in changed(a, b)]
        elif a != b:
            out.append(k)
    return out


def _relative(path: Path) -> str:
    full = (ROOT / path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(path)


def reusable(record_file: Path, key: Mapping) -> tuple[bool, str]:
    """(True, why) when the committed record has this key and every output it names exists; else
    (False, what differs or is missing)."""
    try:
        old = read_json(record_file, SCHEMA_VERSION, "calibration record")
    except ResultFileError as exc:
        return False, f"no usable record ({exc})"
    diff = changed(old.get("key") or {}, key)
    if diff:
        return False, f"the key changed: {', '.join(diff)}"
    missing = [out for step in old.get("steps") or [] for out in step.get("outputs") or []
               if not stored(ROOT / out).is_file()]  # an output committed .xz is there
    if missing:
        return False, f"outputs missing: {', '.join(missing)}"
    return True, f"{_relative(record_file)} has this key and all its outputs"


def steps(gpu: str, model: Path, dtype: str, widths: Sequence[int], out_dir: Path) -> list[Step]:
    """The calibration's commands for this GPU and model shape, the evidence written to `out_dir`
    (project-relative where it lies in the project: the steps run there) and the tables to the
    tables package."""
    out_dir = Path(_relative(out_dir))
    suite = out_dir / f"{gpu}.json"
    table, planted = (Path(_relative(runtime_tables.path(n))) for n in (f"policy-{gpu}-in-graph.json",
                                                                 f"{gpu}-planted-cost.json"))
    w = ",".join(map(str, widths))
    hidden = str(max(widths))
    return [
        Step("validate and benchmark", ("kernels.suite", "--out", str(suite), "--policy-out",
                                        _relative(runtime_tables.path(f"policy-{gpu}.json")), "--hidden", w,
                                        "--reduced-validation"), (suite,), 150.0),
        Step("time steps inside vLLM", ("integration.proof.prove", "--out", str(out_dir), "--model",
                                        str(model), "--dtype", dtype, "--all-fused", "--modes",
                                        "compiled", "--batch-sizes", DECODE_SIZES, "--prefill-sizes",
                                        PREFILL_SIZES, "--rounds", "4", "--graph-replays", "100"),
             (out_dir / f"{gpu}-profile.json", out_dir / f"{gpu}-graph-steps.json"), 240.0),
        Step("in-graph policy table", ("integration.proof.ingraph", "--profile",
                                       str(out_dir / f"{gpu}-profile.json"), "--graph-steps",
                                       str(out_dir / f"{gpu}-graph-steps.json"), "--model", str(model),
                                       "--dtype", dtype, "--out", str(table)), (table,), 5.0),
        Step("planted control's cost", ("integration.proof.plantedcost", "--ns", PLANTED_NS, "--hidden",
                                        hidden, "--out", str(planted)), (planted,), 30.0),
    ]


def estimates(todo: Sequence[Step], record_file: Path) -> list[float]:
    """Seconds each step is expected to take: what the last calibration of this GPU measured for it,
    else the step's first guess."""
    try:
        old = read_json(record_file, SCHEMA_VERSION, "calibration record")
        measured = {s["name"]: s["seconds"] for s in old.get("steps") or []}
    except ResultFileError:
        measured = {}
    return [float(measured.get(s.name, s.estimate_s)) for s in todo]


def run_steps(todo: Sequence[Step], expected_s: Sequence[float], log_dir: Path) -> list[dict]:
    """Run each step with a progress bar; stop at the first that fails (its log named)."""
    from tqdm import tqdm

    done = []
    total = sum(expected_s)
    print(f"{PROG}: {len(todo)} steps, about {total / 60:.0f} min of GPU time", file=sys.stderr)
    bar = tqdm(todo, desc="calibration", unit="step", file=sys.stderr)
    for step in bar:
        bar.set_postfix_str(step.name)
        log = log_dir / f"calibrate-{step.args[0].rsplit('.', 1)[-1]}.log"
        start = time.monotonic()
        with log.open("w") as fh:
            rc = subprocess.call([sys.executable, "-m", *step.args], stdout=fh, stderr=subprocess.STDOUT,
                                 cwd=ROOT)
        seconds = time.monotonic() - start
        if rc != 0:
            raise RuntimeError(f"step '{step.name}' failed (exit {rc}); its log: {log}")
        done.append({"name": step.name, "command": command_line(f"python -m {step.args[0]}", step.args[1:]),
                     "seconds": round(seconds, 1), "outputs": [_relative(p) for p in step.outputs]})
    return done


def main(argv: Sequence[str] | None = None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=MODELS_DIR / "llama-3.1-8b",
                    help="model directory with config.json (default integration/models/llama-3.1-8b)")
    ap.add_argument("--dtype", default="bfloat16", help="model dtype (default bfloat16)")
    ap.add_argument("--force", action="store_true", help="recalibrate even when the record's key matches")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the key, the steps and the estimate; run nothing")
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="folder for the steps' logs (default: a temp folder)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the evidence (default: <gpu>-<model>-calibration/ here); the tables "
                         "go to runtime_tables")
    a = ap.parse_args(argv)
    if a.dtype not in CONFIG_DTYPES:
        return fail(PROG, f"--dtype {a.dtype!r} is not one of {sorted(CONFIG_DTYPES)}")
    try:
        model = model_key(a.model, a.dtype)
    except ValueError as exc:
        return fail(PROG, f"--model: {exc}")
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        return fail(PROG, "no CUDA GPU visible: calibration times the kernel on the GPU it is for")
    from kernels.environment import gpu_slug

    key = {**machine_key(), "kernel_source_sha256": kernel_source_hash(), "model": model}
    gpu = gpu_slug(key["gpu"])
    out_dir = (a.out or Path(f"{gpu}-{model['name']}-calibration")).resolve()
    todo = steps(gpu, a.model, a.dtype, model["norm_widths"], out_dir)
    ok, why = reusable(record_path(gpu), key)
    if ok and not a.force:
        print(f"{PROG}: reusing the calibration for {gpu}: {why}", file=sys.stderr)
        return 0
    print(f"{PROG}: calibrating {gpu} for {model['name']} ({model['dtype']}, widths {model['norm_widths']}): "
          f"{'--force' if ok else why}", file=sys.stderr)
    expected = estimates(todo, record_path(gpu))
    if a.dry_run:
        for s, secs in zip(todo, expected):
            print(f"  {s.name}: python -m {' '.join(s.args)}  (~{secs:.0f} s)")
        return 0
    import tempfile

    log_dir = a.log_dir or Path(tempfile.mkdtemp(prefix="calibrate-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        done = run_steps(todo, expected, log_dir)
    except RuntimeError as exc:
        return fail(PROG, str(exc))
    shutil.copyfile(out_dir / f"{gpu}-graph-steps.json", graph_steps_table(gpu, model["name"]))
    write_json(record_path(gpu), {"schema_version": SCHEMA_VERSION, "key": key, "steps": done,
                                  "command": command_line(PROG, argv)})
    print(f"{PROG}: wrote {_relative(record_path(gpu))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
