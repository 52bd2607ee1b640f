"""The one definition of an experiment arm: what makes a vLLM server or engine "stock" or "patched".

An arm is the plugin on or off (through `VLLM_PLUGINS`, which every vLLM process reads) and the
IR-op provider put first for vLLM's two norm ops. Everything else (model, flags, KV-cache size,
compile config) is shared by the arms of a run. The launcher (server flags), the proof tools
(offline engine keyword arguments) and experiments/ (run records) all read this module.

Where a provider declines a shape, vLLM takes the next name of the priority list, which must be what
the stock arm runs there: Inductor's code (`native`) under torch.compile, vLLM's CUDA kernel
(`vllm_c`, skipped where unsupported) in eager mode. vLLM appends its platform defaults after the
user's list, so in eager mode `vllm_c` is named explicitly before `native`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from integration import choice, serverflags
from integration.names import (
    ALL_FUSED,
    IR_OPS,
    PLANTED_NS_ENV,
    PLUGIN_NAME,
    POLICY_ENV,
    POLICY_ENV_COMPILED,
    PROVIDER,
)
from kernels.shapes import CONFIG_DTYPES

# how a planted arm that is the patched arm plus the delay describes itself (run records keep it;
# the earlier designs' descriptions begin otherwise)
PLANTED_TWIN = "positive control: the patched arm with"
# the providers vLLM itself registers for its two norm IR ops (vllm/kernels/, 0.26 and 0.32)
VLLM_PROVIDERS = ("native", "vllm_c", "aiter", "oink")
QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM",)  # vLLM's qwen3.py: q_norm and k_norm per layer
MAX_COMPILE_ROWS = 16384  # compile-range ends are looked for up to this many rows per step


# vLLM flags every arm of a run shares (the run sets them); an arm that sets one differs in more
# than its kernel, which a run refuses unless told to allow it
# (in any spelling vLLM's parser takes: integration.serverflags)
SHARED_FLAGS = ("--model", "--served-model-name", "--dtype", "--kv-cache-memory-bytes",
                "--gpu-memory-utilization", "--enforce-eager", "-O", "--optimization-level",
                "--compilation-config", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
                "--seed", "--host", "--port", "--load-format", "--tensor-parallel-size", "--quantization",
                "--tokenizer")
ARM_FIELDS = ("name", "description", "plugins", "provider", "server_args", "env")


@dataclass(frozen=True)
class Arm:
    """One arm: the kit's vLLM plugins it loads (none: vLLM as shipped), which IR-op provider goes
    first (None: vLLM's own choice), its own server flags and environment for every vLLM process."""

    name: str
    plugins: tuple[str, ...] = ()
    provider: str | None = None
    extra_env: tuple[tuple[str, str], ...] = ()
    extra_args: tuple[str, ...] = ()
    description: str = ""

    def env(self) -> dict[str, str]:
        """Environment that keeps every other plugin out of each vLLM process (VLLM_PLUGINS) and
        sets the arm's own variables."""
        return {"VLLM_PLUGINS": ",".join(self.plugins), **dict(self.extra_env)}

    def shared_flags_set(self) -> list[str]:
        """The SHARED_FLAGS this arm's own server flags set (empty: it differs only in its kernel)."""
        return [a for a in self.extra_args if is_shared_flag(a)]

    def difference(self) -> list[str]:
        """What this arm sets beyond vLLM as shipped, one item each (for the report)."""
        items = [f"VLLM_PLUGINS={','.join(self.plugins)}"] if self.plugins else []
        items += [f"--ir-op-priority.{op}={self.provider},..." for op in IR_OPS] if self.provider else []
        return items + list(self.extra_args) + [f"{k}={v}" for k, v in self.extra_env]

    def differences_from(self, base: "Arm") -> list[str]:
        """What this arm sets that `base` does not ("+ item") and what `base` sets that it does not
        ("- item"); empty when they run the same server."""
        mine, theirs = self.difference(), base.difference()
        return [f"+ {x}" for x in mine if x not in theirs] + [f"- {x}" for x in theirs if x not in mine]

    def to_json(self) -> dict:
        """The arm's whole definition in the arm-file keys, so a run record needs no arm file."""
        return {"name": self.name, "description": self.description, "plugins": list(self.plugins),
                "provider": self.provider, "server_args": list(self.extra_args), "env": dict(self.extra_env)}

    @classmethod
    def from_json(cls, data: dict, where: str = "arm record") -> "Arm":
        """The arm `to_json` wrote (ValueError naming `where` otherwise)."""
        return _arm_from_table(data, where)

    def ir_op_priority(self, eager: bool) -> dict[str, list[str]]:
        """{op: [provider, fallbacks...]} for each IR op ({} when the arm keeps vLLM's defaults)."""
        if self.provider is None:
            return {}
        order = [self.provider] + [p for p in fallback(eager) if p != self.provider]
        return {op: order for op in IR_OPS}

    def server_args(self, eager: bool) -> list[str]:
        """vLLM server flags that select the arm's kernels, then its own flags (empty for stock)."""
        priority = self.ir_op_priority(eager)
        return [f"--ir-op-priority.{op}={','.join(order)}" for op, order in priority.items()] + list(
            self.extra_args)

    def engine_kwargs(self, eager: bool) -> dict:
        """The same choice as keyword arguments of vLLM's offline `LLM(...)`."""
        priority = self.ir_op_priority(eager)
        return {"ir_op_priority": priority} if priority else {}


def is_shared_flag(arg: str) -> bool:
    """Whether vLLM could read a server argument as one of SHARED_FLAGS (`--flag`, `--flag=v`,
    `--flag.key=v`, `--under_scored`, `-O3`, a prefix such as `--max-model`, an alias such as `-tp`)."""
    return bool(serverflags.setting([arg], SHARED_FLAGS))


BUILTIN_FILE = Path(__file__).with_name("arms.toml")


def _text_list(value: object, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: {key} must be a list of strings, got {value!r}")
    return tuple(value)


def _arm_from_table(table: dict, where: str) -> Arm:
    unknown = sorted(set(table) - set(ARM_FIELDS))
    if unknown or not isinstance(table.get("name"), str) or not table["name"]:
        raise ValueError(f"{where}: needs a name and only the keys {ARM_FIELDS}; unknown {unknown}")
    where = f"{where} ({table['name']})"
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"{where}: env must be a table of strings, got {env!r}")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"{where}: env key {key!r} cannot name an environment variable (empty, or "
                             "holding '=' or a NUL byte)")
        if "\0" in value:
            raise ValueError(f"{where}: env {key} holds a NUL byte, which no environment variable can")
    provider = table.get("provider")
    if provider is not None and not isinstance(provider, str):
        raise ValueError(f"{where}: provider must be a string, got {provider!r}")
    return Arm(table["name"], plugins=_text_list(table.get("plugins", []), where, "plugins"),
               provider=provider, extra_env=tuple(sorted(env.items())),
               extra_args=_text_list(table.get("server_args", []), where, "server_args"),
               description=str(table.get("description", "")))


def load_arm_file(path: str | Path) -> dict[str, Arm]:
    """The [[arm]] tables of a TOML arm file (format: integration/arms.toml), by name; ValueError
    naming the file and the table otherwise (a name used twice, or by a built-in or planted arm)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the arm file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    tables = data.get("arm")
    if not isinstance(tables, list) or not tables or set(data) != {"arm"}:
        raise ValueError(f"{path}: expected one or more [[arm]] tables and nothing else")
    found: dict[str, Arm] = {}
    builtin = {} if path.resolve() == BUILTIN_FILE.resolve() else ARMS
    for i, table in enumerate(tables, start=1):
        arm = _arm_from_table(table, f"{path}: [[arm]] #{i}")
        if builtin:  # a user's file: what vLLM would find only once the arm's server starts
            _check_startable(arm, f"{path}: [[arm]] #{i} ({arm.name})")
        if arm.name in found or arm.name in builtin or _PLANTED.match(arm.name):
            whose = " by a built-in arm; choose another name" if arm.name in builtin else ""
            raise ValueError(f"{path}: [[arm]] #{i}: name {arm.name!r} is taken{whose}")
        found[arm.name] = arm
    return found


def _check_startable(arm: Arm, where: str) -> None:
    """ValueError naming `where` for what a server of `arm` would fail on only once it starts: a flag
    that moves where it listens, a provider no loaded plugin or vLLM registers, a plugin not
    installed."""
    serverflags.check_listen_address(arm.extra_args, f"{where}: server_args")
    if arm.provider == PROVIDER and PLUGIN_NAME not in arm.plugins:
        raise ValueError(f"{where}: provider {PROVIDER!r} needs plugins = [{PLUGIN_NAME!r}], the plugin that "
                         "registers it")
    if arm.provider not in (None, PROVIDER, *VLLM_PROVIDERS) and set(arm.plugins) <= {PLUGIN_NAME}:
        raise ValueError(f"{where}: provider {arm.provider!r} is none of vLLM's "
                         f"({', '.join(VLLM_PROVIDERS)}) or the kit's ({PROVIDER}), and the arm loads no "
                         "other plugin that could register it")
    try:
        check_plugin_installed(arm)
    except RuntimeError as exc:
        raise ValueError(f"{where}: {exc}") from None


ARMS: dict[str, Arm] = {}  # the built-in arms (BUILTIN_FILE), filled below
PLANTED_DEFAULT_NS = 2000  # `planted` alone: 2 us per norm call
_PLANTED = re.compile(r"^planted(?::(\d+(?:\.\d+)?)(ns|us))?$")


def planted(ns: int) -> Arm:
    """The positive control: the patched arm with $RMSNORM_PLANTED_NS=`ns` (integration/plugin.py:
    on CUDA its fused kernel built to spin `ns` in each call, where the policy picks it; on CPU stock
    plus a host delay at every call, integration/plantedprovider.py). The same plugin, provider, policy table
    and compile ranges as patched, so the same compiled graphs: it differs from patched by the delay
    alone, which is the control's known effect."""
    from kernels.plantedbounds import check_ns

    check_ns(ns)
    name = f"planted:{ns / 1000:g}us" if ns % 100 == 0 else f"planted:{ns}ns"
    return Arm(name, plugins=(PLUGIN_NAME,), provider=PROVIDER, extra_env=((PLANTED_NS_ENV, str(ns)),),
               description=f"{PLANTED_TWIN} {ns} ns of GPU delay inside every "
                           "fused norm call (the planted build of its fused kernel; on CPU stock plus a "
                           "host delay at every call)")


def is_planted(arm: Arm) -> bool:
    """Whether the arm carries a planted delay ($RMSNORM_PLANTED_NS in its environment)."""
    return PLANTED_NS_ENV in dict(arm.extra_env)


ARMS.update(load_arm_file(BUILTIN_FILE))


def fallback(eager: bool) -> list[str]:
    """What stock runs where the provider declines: vLLM's CUDA kernel in eager mode, Inductor's code
    (`native`) under torch.compile."""
    return ["vllm_c", "native"] if eager else ["native"]


def get(name: str, extra: dict[str, Arm] | None = None) -> Arm:
    """The arm called `name`: built in, in `extra` (an arm file's arms), or `planted:<N>us` /
    `planted:<N>ns` (the positive control); ValueError naming the known arms otherwise."""
    known = {**ARMS, **(extra or {})}
    if name in known:
        return known[name]
    m = _PLANTED.match(name)
    if m is None:
        raise ValueError(f"unknown arm {name!r}; expected one of {tuple(known)} or planted:<N>us")
    value, unit = m.groups()
    ns = PLANTED_DEFAULT_NS if value is None else round(float(value) * (1000 if unit == "us" else 1))
    return planted(ns)


def replica_label(arm: str, k: int) -> str:
    """The label of an arm's k-th engine or server: the arm's name for k = 0, then "<arm>-b", "<arm>-c"."""
    if not 0 <= k < 25:
        raise ValueError(f"replica index {k} out of range 0-24")
    return arm if k == 0 else f"{arm}-{chr(ord('a') + k)}"


def replica_base(label: str, known: set[str] | frozenset[str]) -> str:
    """The arm a replica label stands for ("stock-b" -> "stock") when that arm is in `known` (the labels
    of the same run); any other label stands for itself."""
    m = re.fullmatch(r"(.+)-([b-y])", label)
    return m.group(1) if m and m.group(1) in known else label


def model_shape(model: str | Path | dict, dtype: str = "auto") -> tuple[str, int]:
    """(dtype name, hidden size) of a model directory's config.json (or of that config as a dict),
    `dtype` overriding 'auto'."""
    if isinstance(model, dict):
        cfg, where = model, "model config"
    else:
        where = str(Path(model) / "config.json")
        cfg = json.loads(Path(where).read_text())
    if "hidden_size" not in cfg:
        raise ValueError(f"{where}: no hidden_size")
    name = (cfg.get("torch_dtype") or cfg.get("dtype") or "float32") if dtype in ("auto", None) else dtype
    if name not in CONFIG_DTYPES:
        raise ValueError(f"{where}: dtype {name!r} is not one of {sorted(CONFIG_DTYPES)}")
    return CONFIG_DTYPES[name], int(cfg["hidden_size"])


def check_plugin_installed(arm: Arm) -> None:
    """Raise if an entry point the arm loads is not installed, so vLLM could not load it."""
    installed = {e.name for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    missing = [name for name in arm.plugins if name not in installed]
    if missing:
        raise RuntimeError(f"the vLLM plugin entry point(s) {missing} of arm {arm.name!r} are not "
                           f"installed in {sys.prefix} (installed: {sorted(installed)}); the kit's own "
                           f"({PLUGIN_NAME}) comes with `pip install -e .` in the project root")


def compilation_config(model_dir: Path, dtype: str = "auto", max_rows: int = MAX_COMPILE_ROWS,
                       arm: Arm | None = None) -> dict:
    """The `--compilation-config` of a compiled arm of a CUDA run: one uncaptured warm-up run per
    CUDA-graph size (fused kernels get built before any capture even when vLLM's compile cache skips
    the lowering pass), and, for an arm that dispatches by the kit's policy (`uses_policy`; every
    arm when `arm` is None), compile ranges that end where the policy switches fused/stock, for the
    hidden-size norms and (models with q/k norms) where tokens x heads crosses a head-width switch. Any
    other arm keeps vLLM's default single range, as a user's stock server has: the ranges are part
    of what the patched arm changes (Inductor compiles each range on its own)."""
    if arm is not None and not uses_policy(arm):
        return compilation_config_for([])
    dtype_name, hidden = model_shape(model_dir, dtype)
    ends = set(choice.stock_boundaries(dtype_name, hidden, max_rows))
    heads = head_norms(model_dir)
    if heads:  # q/k norms over [tokens, heads, head_dim]: their row boundaries in tokens
        ends.update(choice.head_boundaries(dtype_name, heads[0], heads[1:], max_rows))
    return compilation_config_for(sorted(ends))


def head_norms(model_dir: Path) -> tuple[int, int, int] | None:
    """head_layout of a model whose layers norm q and k per head (QK_NORM_ARCHITECTURES), from its
    config.json; None for any other model."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return head_layout(cfg) if (cfg.get("architectures") or ["?"])[0] in QK_NORM_ARCHITECTURES else None


def head_layout(cfg: dict) -> tuple[int, int, int]:
    """(head_dim, q heads, kv heads) of a model config: head_dim defaults to hidden / heads, kv
    heads to the q heads."""
    heads = int(cfg["num_attention_heads"])
    return (int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads), heads,
            int(cfg.get("num_key_value_heads", heads)))


def uses_policy(arm: Arm) -> bool:
    """Whether the arm's norm calls go through the kit's provider and its policy table (patched,
    plugin-idle and the planted control)."""
    return arm.provider == PROVIDER


def current_gpu() -> str | None:
    """This process's GPU slug, None without one (choice.current_gpu)."""
    return choice.current_gpu()


def policy_table(arm: Arm, eager: bool, gpu: str | None) -> str | None:
    """What a policy arm dispatches by on `gpu`: the table's path, or 'all'/'none' where its own
    environment (or this process's) names one; None where that GPU has no table."""
    env = {**os.environ, **dict(arm.extra_env)}
    path = choice.policy_path("eager" if eager else "compiled", gpu, env)
    return None if path is None else str(path)


FUSE_ALL_NOTE = "--fuse-all: instead, every norm call fused, whatever the GPU's policy table says"


def fusing_every_call(arm: Arm) -> Arm:
    """A policy arm that follows the GPU's table (patched, its planted twin) made to fuse every norm
    call (both policy variables 'all'); any other arm, and one that sets a policy itself, unchanged."""
    env = dict(arm.extra_env)
    if not uses_policy(arm) or POLICY_ENV in env or POLICY_ENV_COMPILED in env:
        return arm
    env |= {POLICY_ENV: ALL_FUSED, POLICY_ENV_COMPILED: ALL_FUSED}
    return replace(arm, extra_env=tuple(env.items()), description=f"{arm.description}; {FUSE_ALL_NOTE}")


def compilation_config_for(range_ends: list[int]) -> dict:
    """The compilation config with the given compile-range ends (none: vLLM's one range)."""
    cc: dict = {"cudagraph_num_of_warmups": 1}
    if range_ends:
        cc["compile_ranges_endpoints"] = list(range_ends)
    return cc


def policy_record(model: Path | dict, dtype: str = "auto", mode: str = "compiled",
                  table: str | Path | None = None) -> dict:
    """What the patched arm's policy picks for a model (a model directory or its config dict), for a
    run record: see choice.policy_record. `table`: describe this policy file instead of the mode's."""
    dtype_name, hidden = model_shape(model, dtype)
    return choice.policy_record(dtype_name, hidden, mode, MAX_COMPILE_ROWS, table)
