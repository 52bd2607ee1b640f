"""Hardware counters of one norm call (Nsight Compute) beside the bytes model, for every arm.

On the GPU machine (ncu on PATH), two ncu runs of the same worker (kernels.counters_worker), L2
flushed before every profiled kernel (`--cache-control all`, "cold") and not flushed after a warm-up
call ("warm"), both `--clock-control none`:

    python -m kernels.counters --out-dir OUT [--rows 1,32,2048,16384] [--hidden 4096,8193]

writes counters-<gpu>.json (the exact ncu commands, their CSV lines as ncu printed them, the plan)
and counters-<gpu>.md (every measurement), and the two ncu logs. Anywhere, from a results file:

    python -m kernels.counters --from OUT/counters-h200.json [--readme kernels/README.md]

prints the table (kernels.ncu says what the bytes model and the columns are) and rewrites the README's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.cliargs import OneLineParser, command_line, fail, positive_float
from common.jsonfile import ResultFileError, read_json, write_json, write_text
from kernels import ncu
from kernels.environment import gpu_slug, width_list

SCHEMA_VERSION = 1
PROG = "python -m kernels.counters"
ROWS, HIDDEN = "1,32,2048,16384", "4096,8193"
MODES = {"cold": "all", "warm": "none"}  # --cache-control
BEGIN = "<!-- counters:begin (python -m kernels.counters --from FILE --readme kernels/README.md) -->"
END = "<!-- counters:end -->"
TIMEOUT_S = 280  # per ncu run (--timeout); two runs fit the GPU machine's 10 minutes a command


def ncu_command(mode: str, metrics: tuple[str, ...], worker: list[str]) -> list[str]:
    """The ncu command line of one run (`worker`: the profiled program and its arguments)."""
    return ["ncu", "--clock-control", "none", "--cache-control", MODES[mode], "--profile-from-start", "off",
            "--target-processes", "application-only", "--csv", "--page", "raw", "--print-units", "base",
            "--metrics", ",".join(metrics), *worker]


def _run_ncu(mode: str, worker: list[str], log_path: Path, timeout_s: float) -> tuple[dict, tuple[str, ...]]:
    """One ncu run; retried with the required metrics alone if this ncu refuses an optional one."""
    metrics = ncu.REQUIRED + ncu.OPTIONAL
    for attempt in (0, 1):
        cmd = ncu_command(mode, metrics, worker)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = None, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {timeout_s} s"
        write_text(log_path, f"$ {shlex.join(cmd)}\n== exit {rc} ==\n== stdout ==\n{out}\n"
                             f"== stderr ==\n{err}\n")
        lines = ncu.csv_lines(out)
        if (rc != 0 or not lines) and attempt == 0 and "metric" in (out + err).lower():
            metrics = ncu.REQUIRED
            continue
        return {"ncu_command": shlex.join(cmd), "exit_code": rc,
                "seconds": round(time.perf_counter() - t0, 1), "csv": lines}, metrics
    raise AssertionError("unreachable")


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def measure(out_dir: Path, rows: str, hidden: str, arms: str, argv: list[str] | None,
            timeout_s: float = TIMEOUT_S) -> int:
    """Both ncu runs, then the results file, its table and the logs in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip()
    runs, manifests = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            manifest = Path(tmp) / f"{mode}.json"
            worker = [sys.executable, "-m", "kernels.counters", "--worker", str(manifest), "--rows", rows,
                      "--hidden", hidden, "--arms", arms]
            runs[mode], metrics = _run_ncu(mode, worker, out_dir / f"counters-{mode}.log", timeout_s)
            runs[mode]["metrics"] = list(metrics)
            manifests[mode] = json.loads(manifest.read_text()) if manifest.exists() else None
            print(f"{mode}: ncu exit {runs[mode]['exit_code']}, {len(runs[mode]['csv'])} CSV lines, "
                  f"{runs[mode]['seconds']} s", file=sys.stderr)
    first = manifests["cold"] or manifests["warm"]
    if first is None:
        return fail(PROG, f"the worker wrote no manifest; see {out_dir}/counters-*.log")
    if manifests["warm"] and manifests["cold"] and _plan(manifests["warm"]) != _plan(manifests["cold"]):
        return fail(PROG, "the cold and warm runs measured different plans")
    slug = gpu_slug(first["environment"]["gpu"])
    doc = {"schema_version": SCHEMA_VERSION, "gpu": first["environment"]["gpu"], "ncu_version": version,
           "command": command_line(PROG, argv),
           "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "bytes_model": ncu.__doc__.split("Bytes model", 1)[1].strip(),
           "environment": {m: v["environment"] for m, v in manifests.items() if v},
           "vllm_c": first["vllm_c"], "policy_file": first["policy_file"], "bench_file": first["bench_file"],
           "measurements": first["measurements"], "runs": runs}
    path = out_dir / f"counters-{slug}.json"
    write_json(path, doc)
    for mode in MODES:
        os.replace(out_dir / f"counters-{mode}.log", out_dir / f"counters-{slug}-{mode}.log")
    try:
        text = document_table(doc, path.name)
    except ncu.CounterError as exc:
        return fail(PROG, f"{path} written, but its table cannot be derived: {exc}", 1)
    write_text(out_dir / f"counters-{slug}.md", text + "\n")
    print(text)
    return 0


def document_table(doc: dict, name: str) -> str:
    """The whole table with the header that names the GPU, the commands and the model."""
    rows = ncu.derive(doc)
    env = doc["environment"].get("cold") or doc["environment"]["warm"]
    head = [f"# Hardware counters per call: {name}", "",
            f"{doc['gpu']}, driver {env['driver']}, torch {env['torch']}, CuPy {env['cupy']}, "
            f"{doc['ncu_version'].splitlines()[-1] if doc['ncu_version'] else 'ncu'}; vLLM's CUDA kernels: "
            f"{doc['vllm_c'].get('source') or doc['vllm_c'].get('error')}; {doc['created_utc']}.", "",
            f"Made by `{doc['command']}`; the ncu runs:", ""]
    head += [f"- {mode}: `{run['ncu_command']}`" for mode, run in doc["runs"].items()]
    head += ["", "Bytes model: " + " ".join(doc["bytes_model"].split()), ""]
    return "\n".join(head) + "\n" + ncu.full_table(rows)


def readme_section(doc: dict, source: str) -> str:
    """The README's table: row passes by load sectors, (DRAM read / model cold / warm), from the
    results file `source` (as the command named it)."""
    env = doc["environment"].get("cold") or doc["environment"]["warm"]
    return (f"Generated from {source} ({doc['gpu']}, driver {env['driver']}, "
            f"{doc['created_utc'][:10]}): per arm, row passes by global load sectors "
            f"(DRAM bytes read over the one-pass model, L2 cold / warm).\n\n"
            + ncu.short_table(ncu.derive(doc)))


def update_readme(readme: Path, section: str) -> None:
    """Replace the text between the counters markers of `readme` with `section`."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: markers {BEGIN!r} and {END!r} not found")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    write_text(readme, f"{head}{BEGIN}\n{section}\n{END}{tail}")


def _plan(manifest: dict) -> list[dict]:
    """What was measured, without what each run observed (a first call's error differs between runs)."""
    return [{k: v for k, v in m.items() if k != "max_abs_err"} for m in manifest["measurements"]]


def main(argv: list[str] | None = None) -> int:
    """CLI (module docstring)."""
    prog = PROG
    ap = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", help="on the GPU machine: where the results file, table and ncu logs go")
    ap.add_argument("--from", dest="source", help="a counters results file: print its table again")
    ap.add_argument("--readme", help="with --from: README whose counters section is replaced")
    ap.add_argument("--rows", default=ROWS, help=f"comma list of row counts (default {ROWS})")
    ap.add_argument("--hidden", default=HIDDEN, help=f"comma list of hidden sizes (default {HIDDEN})")
    ap.add_argument("--arms", default=",".join(ncu.ARMS), help="comma list of arms (default: all)")
    ap.add_argument("--timeout", type=positive_float, default=TIMEOUT_S,
                    help=f"seconds each ncu run may take (default {TIMEOUT_S})")
    ap.add_argument("--worker", metavar="MANIFEST", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        rows, hidden = sorted(width_list(args.rows)), sorted(width_list(args.hidden))
    except Exception as exc:  # argparse.ArgumentTypeError from width_list
        return fail(prog, f"--rows/--hidden: {exc}")
    arms = [a for a in args.arms.split(",") if a]
    if any(a not in ncu.ARMS for a in arms) or not arms:
        return fail(prog, f"--arms {args.arms!r}: choose from {','.join(ncu.ARMS)}")
    if args.worker:
        from kernels import counters_worker

        return counters_worker.main(args.worker, rows, hidden, arms)
    if args.source:
        try:
            doc = read_json(args.source, SCHEMA_VERSION, "counters results")
            print(document_table(doc, Path(args.source).name))
            if args.readme:
                update_readme(Path(args.readme), readme_section(doc, args.source))
        except (ResultFileError, ncu.CounterError, ValueError) as exc:
            return fail(prog, str(exc))
        return 0
    if not args.out_dir:
        return fail(prog, "give --out-dir (measure on the GPU machine) or --from FILE (print a table)")
    if shutil.which("ncu") is None:
        return fail(prog, "ncu (Nsight Compute) is not on PATH; run this on the GPU machine")
    import torch

    if not torch.cuda.is_available():
        return fail(prog, "no CUDA GPU visible (torch.cuda.is_available() is False)")
    return measure(Path(args.out_dir), ",".join(map(str, rows)), ",".join(map(str, hidden)), ",".join(arms),
                   argv, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
