"""Norm calls per step by kind (hidden, head): what a model's layers make, what reaches vLLM's IR ops.

    python -m integration.proof.normcalls --model integration/models/tiny-qwen3 --dtype float32 --eager \\
        --out census.json

A norm's kind is its row width: `hidden_size` (input, post-attention and final norms) or `head_dim`
(Qwen3's q_norm and k_norm over [tokens, heads, head_dim] views), read from the model's config.json.
Per forward a decoder of L layers makes 2L+1 hidden-size norms (the first layer's input norm is
`rms_norm`, every later one `fused_add_rms_norm`, then the final norm) and, with q/k norms, 2L head
norms (`rms_norm`). `IrCensus` wraps the dispatch of `vllm.ir.ops.rms_norm` and `fused_add_rms_norm`
in this process and records every call: per call in eager mode (real tensors, once per step), per
graph node and compile range under torch.compile (vLLM's lowering pass, fake tensors). With `tag`, it
also wraps each eager call in a `norm:<op>:<width>` profiler annotation, so a kernel trace can say
which kernels a norm of each width launched (integration.proof.steptrace). The CLI starts one offline
engine in process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), decodes one seeded prompt and writes the census.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from common.cliargs import command_line, fail, refuse_output
from common.jsonfile import write_json
from integration.arms import QK_NORM_ARCHITECTURES, head_layout
from integration.names import IR_OPS

TAG_PREFIX = "norm:"  # profiler annotation around one eager IR-op call: norm:<op>:<width>


@dataclass(frozen=True)
class NormShape:
    """The norm widths and counts of a decoder model, from its config.json."""

    architecture: str
    hidden: int
    head_dim: int
    layers: int
    q_heads: int
    kv_heads: int
    qk_norm: bool

    def kind(self, width: int) -> str:
        """'hidden', 'head' or 'other' for a norm over rows of this width."""
        if width == self.hidden:
            return "hidden"
        return "head" if width == self.head_dim and self.qk_norm else "other"

    def expected(self) -> dict[str, int]:
        """Norm calls per forward by kind: 2L+1 hidden; 2L head with q/k norms, else 0."""
        return {"hidden": 2 * self.layers + 1, "head": 2 * self.layers if self.qk_norm else 0}

    def expected_by_op(self) -> dict[str, dict[str, int]]:
        """The same per IR op: rms_norm takes the first input norm and the head norms."""
        return {"rms_norm": {"hidden": 1, "head": self.expected()["head"]},
                "fused_add_rms_norm": {"hidden": 2 * self.layers, "head": 0}}

    def head_rows_per_token(self) -> int:
        """Rows a token adds to one layer's two head norms (q heads + kv heads), 0 without them."""
        return self.q_heads + self.kv_heads if self.qk_norm else 0


def recorded_model_dir(model: str | Path) -> Path:
    """A model directory as a result file records it; one of a run elsewhere (e.g.
    /tmp/kr/integration/models/X, absent here) is read from the kit's copy of X."""
    from integration.launcher import MODELS_DIR

    path = Path(model)
    if not (path / "config.json").is_file() and (MODELS_DIR / path.name / "config.json").is_file():
        return MODELS_DIR / path.name
    return path


def norm_shape(model: str | Path | dict) -> NormShape:
    """The NormShape of a model directory's config.json (or that config as a dict); ValueError naming
    the file and the missing field otherwise."""
    if isinstance(model, dict):
        cfg, where = model, "model config"
    else:
        where = str(Path(model) / "config.json")
        try:
            cfg = json.loads(Path(where).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where}: cannot read the model config ({exc})") from None
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads") if k not in cfg]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)}")
    arch = (cfg.get("architectures") or ["?"])[0]
    head_dim, heads, kv_heads = head_layout(cfg)
    if arch in QK_NORM_ARCHITECTURES and head_dim == int(cfg["hidden_size"]):
        raise ValueError(f"{where}: head_dim equals hidden_size ({head_dim}): norm kinds are told by width")
    return NormShape(arch, int(cfg["hidden_size"]), head_dim, int(cfg["num_hidden_layers"]), heads,
                     kv_heads, arch in QK_NORM_ARCHITECTURES)


def by_kind(counts: dict, shape: NormShape) -> dict[str, int]:
    """{width: calls} (int or str keys) summed into {kind: calls}."""
    out: Counter = Counter()
    for width, n in counts.items():
        out[shape.kind(int(width))] += n
    return dict(out)


def check(seen: dict[str, float | int], shape: NormShape) -> dict:
    """The calls seen per forward by kind against what the model's layers make."""
    expected = shape.expected()
    kinds = set(expected) | set(seen)
    return {"expected": expected, "seen": {k: seen.get(k, 0) for k in sorted(kinds)},
            "matches": all(seen.get(k, 0) == expected.get(k, 0) for k in kinds)}


class IrCensus:
    """Records every dispatch of vLLM's norm IR ops in this process while active (a context manager).

    Each record: op, row width, rank, shape and strides (symbolic sizes as text), whether the tensors
    are fake (vLLM's lowering pass), the provider vLLM chose, and the step set by `step(k)`. `tag`
    also wraps each eager call in a `norm:<op>:<width>` torch.profiler annotation."""

    def __init__(self, tag: bool = False) -> None:
        self.tag = tag
        self.records: list[dict] = []
        self.current: int | None = None
        self._saved: list[tuple[object, str, object]] = []

    def step(self, k: int | None) -> None:
        """Attribute the next calls to step k (None: outside any step)."""
        self.current = k

    def __enter__(self) -> Self:
        from vllm import ir

        for name in IR_OPS:
            op = getattr(ir.ops, name)
            self._wrap(op, "dispatch", self._dispatch(name, op.dispatch))
            if self.tag:
                self._wrap(op, "_inner_call", self._tagged(name, op._inner_call))
                if hasattr(op, "maybe_inplace"):
                    inner = op.maybe_inplace._inner_call
                    self._wrap(op.maybe_inplace, "_inner_call", self._tagged(name, inner))
        return self

    def __exit__(self, *exc: object) -> None:
        for obj, attr, old in reversed(self._saved):
            if old is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)
        self._saved.clear()

    def _wrap(self, obj: object, attr: str, fn: object) -> None:
        self._saved.append((obj, attr, obj.__dict__.get(attr)))
        setattr(obj, attr, fn)

    def _dispatch(self, name: str, original):
        def dispatch(*args, **kwargs):
            impl = original(*args, **kwargs)
            self.records.append(_record(name, args, impl.provider, self.current))
            return impl
        return dispatch

    def _tagged(self, name: str, original):
        import torch

        def inner_call(*args, **kwargs):
            with torch.profiler.record_function(f"{TAG_PREFIX}{name}:{args[0].shape[-1]}"):
                return original(*args, **kwargs)
        return inner_call

    def per_step(self, shape: NormShape) -> dict[int, dict]:
        """Per step k: calls by kind, by op and kind, and by (op, kind, provider)."""
        out: dict[int, dict] = {}
        for r in self.records:
            if r["step"] is None or r["fake"]:
                continue
            s = out.setdefault(r["step"], {"by_kind": Counter(), "by_op": Counter(), "providers": Counter()})
            kind = shape.kind(r["width"])
            s["by_kind"][kind] += 1
            s["by_op"][f"{r['op']}/{kind}"] += 1
            s["providers"][f"{r['op']}/{kind}/{r['provider']}"] += 1
        return {k: {name: dict(c) for name, c in v.items()} for k, v in sorted(out.items())}

    def lowered(self, shape: NormShape) -> dict[str, int]:
        """Graph nodes vLLM's lowering pass dispatched (fake tensors), by op, kind and provider; one
        per node and compile range (a piece served from Inductor's cache is not lowered again)."""
        return dict(Counter(f"{r['op']}/{shape.kind(r['width'])}/{r['provider']}"
                            for r in self.records if r["fake"]))


def _record(op: str, args: tuple, provider: str, step: int | None) -> dict:
    from torch._subclasses.fake_tensor import FakeTensor

    x = args[0]
    return {"op": op, "width": int(x.shape[-1]), "dim": x.dim(), "shape": [str(n) for n in x.shape],
            "strides": [str(s) for s in x.stride()], "fake": isinstance(x, FakeTensor),
            "weight_dtype": str(getattr(args[2 if op == "fused_add_rms_norm" else 1], "dtype", None)),
            "provider": provider, "step": step}


def census_run(llm, shape: NormShape, steps: int, seed: int = 0) -> dict:
    """Decode one seeded 16-token prompt for `steps` engine steps under an IrCensus; per step the norm
    calls by kind and provider, and each step's check against the model's layers."""
    import numpy as np
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    vocab = engine.model_config.get_vocab_size()
    ids = np.random.default_rng(seed).integers(10, vocab - 10, size=16).tolist()
    engine.add_request("census", TokensPrompt(prompt_token_ids=ids),
                       SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
    with IrCensus() as census:
        for k in range(steps):
            census.step(k)
            engine.step()
        census.step(None)
    per = census.per_step(shape)
    return {"model": shape.__dict__, "expected_per_forward": shape.expected(),
            "expected_by_op": shape.expected_by_op(), "steps": per,
            "checks": {k: check(v["by_kind"], shape) for k, v in per.items()},
            "example_calls": _examples(census.records)}


def _examples(records: list[dict]) -> list[dict]:
    """One record per distinct (op, width, rank, strides pattern), for the evidence."""
    seen, out = set(), []
    for r in records:
        key = (r["op"], r["width"], r["dim"], r["provider"], len(set(r["strides"])))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: the IR-op census of one offline engine (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m integration.proof.normcalls", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory with config.json (dummy weights)")
    p.add_argument("--dtype", default="auto", help="model dtype (default: the config's)")
    p.add_argument("--eager", action="store_true", help="--enforce-eager (per-call census)")
    p.add_argument("--steps", type=int, default=3, help="engine steps to census (prefill, then decode)")
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args(argv)
    refuse_output(p.prog, "--out", a.out)
    try:
        shape = norm_shape(a.model)
    except ValueError as exc:
        return fail(p.prog, str(exc))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    with IrCensus() as build:  # compiled mode: the lowering pass dispatches here
        llm = LLM(model=a.model, load_format="dummy", skip_tokenizer_init=True, dtype=a.dtype, seed=0,
                  enforce_eager=a.eager, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=512)
    doc = census_run(llm, shape, a.steps)
    doc["lowered_at_build"] = build.lowered(shape)
    doc["command"] = command_line(p.prog, argv)
    write_json(a.out, doc)
    ok = all(c["matches"] for c in doc["checks"].values())
    print(json.dumps({"checks": doc["checks"], "lowered_at_build": doc["lowered_at_build"]}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
