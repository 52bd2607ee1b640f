"""One arm of the in-vLLM proof: an offline vLLM engine in this process, greedy outputs, kernel trace.

Started by integration/prove.py (one process per arm and mode; VLLM_PLUGINS set by the caller).
The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor 'uni'), so
torch.profiler sees every kernel of the forward pass, CUDA-graph replays included.

Steps: build the engine; greedy-decode seeded prompts (token ids and top-2 logprobs); write
`<out>/<label>-<mode>.json` and `<out>/<label>-<mode>.ready`; then, if --turn-file is given, wait for it
and profile decode steps at each --batch-sizes and prefill steps at each --prefill-sizes (wall time
per step, and a kernel trace of a few; in the first --profile-rounds rounds), and with --graph-replays
time each decode size's CUDA-graph replay by CUDA events in every round (integration.proof.graphtime);
write `<out>/<label>-<mode>.done`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common.jsonfile import write_json  # noqa: E402
from integration import arms  # noqa: E402
from integration.names import IR_OPS  # noqa: E402
from integration.proof import graphtime, normcalls, steptrace  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m integration.proof.prove_arm", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", type=_arm_name, required=True,
                   help="which arm this process is: stock, patched, planted:<N>ns (integration.arms)")
    p.add_argument("--label", default=None,
                   help="this engine's name in the run (default: the arm; prove --replicas names an "
                        "arm's further engines <arm>-b, <arm>-c)")
    p.add_argument("--mode", choices=("compiled", "eager"), required=True,
                   help="compiled: torch.compile + CUDA graphs (vLLM default); eager: --enforce-eager")
    p.add_argument("--model", required=True, help="model directory with config.json (dummy weights)")
    p.add_argument("--out", required=True, help="directory for <label>-<mode>.json and marker files")
    p.add_argument("--dtype", default="bfloat16", help="model dtype (default bfloat16)")
    p.add_argument("--prompts", type=int, default=4, help="greedy prompts (default 4)")
    p.add_argument("--steps", type=int, default=256, help="greedy tokens per prompt (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt token ids and of vLLM")
    p.add_argument("--batch-sizes", default="1,8,32,128,256",
                   help="decode batch sizes to profile after --turn-file appears (comma list)")
    p.add_argument("--prefill-sizes", default="",
                   help="prompt lengths (comma list) whose one-request prefill step is profiled after "
                        "the decode sizes")
    p.add_argument("--max-num-batched-tokens", type=int, default=16384,
                   help="vLLM's token budget per step; also the top of the default compile range")
    p.add_argument("--timed-steps", type=int, default=20, help="decode steps timed per batch size")
    p.add_argument("--traced-steps", type=int, default=4, help="decode steps kernel-traced per batch size")
    p.add_argument("--turn-file", default=None,
                   help="wait for <this>1, <this>2, ... before each profile round, write "
                        "<out>/<label>-<mode>.done<round>")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the per-batch profile (default 2)")
    p.add_argument("--profile-rounds", type=int, default=2,
                   help="rounds that also time steps by wall clock and kernel-trace them (default 2; "
                        "later: graphs only)")
    p.add_argument("--graph-replays", type=int, default=0,
                   help="CUDA-graph replays timed per decode size and round (0: none; default 0)")
    p.add_argument("--turn-timeout", type=float, default=400.0, help="seconds to wait for --turn-file")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2, help="vLLM memory share")
    p.add_argument("--kv-cache-gib", type=float, default=4.0, help="explicit KV-cache size (GiB)")
    p.add_argument("--weights", choices=("scaled", "dummy"), default="scaled",
                   help="scaled: redraw vLLM's dummy weights at std 0.02 (seeded); dummy: keep them")
    p.add_argument("--compile-ranges", default="",
                   help="compile range endpoints (comma list) for compiled mode")
    return p.parse_args(argv)


def _arm_name(name: str) -> str:
    try:
        arms.get(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def build_llm(a: argparse.Namespace):
    """The offline engine for this arm and mode."""
    from vllm import LLM

    kwargs = dict(model=a.model, load_format="dummy", skip_tokenizer_init=True, dtype=a.dtype,
                  seed=a.seed, enforce_eager=a.mode == "eager",
                  gpu_memory_utilization=a.gpu_memory_utilization,
                  kv_cache_memory_bytes=int(a.kv_cache_gib * (1 << 30)),
                  max_model_len=max([2048] + [n + 16 for n in _sizes(a.prefill_sizes)]),
                  max_num_batched_tokens=a.max_num_batched_tokens,
                  max_num_seqs=256, async_scheduling=False, distributed_executor_backend="uni")
    kwargs.update(arms.get(a.arm).engine_kwargs(eager=a.mode == "eager"))
    if a.mode == "compiled":  # what every compiled arm of a server gets
        ends = [int(v) for v in a.compile_ranges.split(",")] if a.compile_ranges else []
        kwargs["compilation_config"] = arms.compilation_config_for(ends)
    return LLM(**kwargs)


def scaled_weights(seed: int):
    """A function for LLM.apply_model that redraws every weight from a seeded normal: std 0.02
    (the usual init scale), norm weights N(1, 0.1). vLLM's dummy weights (uniform +-1e-3) give flat
    logits (every token within 1e-6 nats), where greedy agreement would prove nothing. In place, so
    captured CUDA graphs stay valid; the same in every process (seeded by parameter name order)."""
    def apply(model) -> int:  # noqa: ANN001 (an nn.Module)
        params = sorted(model.named_parameters(), key=lambda kv: kv[0])
        with torch.no_grad():
            for i, (name, p) in enumerate(params):
                if not p.is_floating_point():
                    continue
                g = torch.Generator(device=p.device)
                g.manual_seed(seed * 1_000_003 + i)
                if name.endswith("norm.weight"):
                    p.normal_(1.0, 0.1, generator=g)
                else:
                    p.normal_(0.0, 0.02, generator=g)
        return len(params)
    return apply


def prompt_ids(seed: int, index: int, length: int, vocab: int) -> list[int]:
    """Seeded prompt token ids (the same in every arm)."""
    return np.random.default_rng((seed, index)).integers(100, vocab - 100, size=length).tolist()


def greedy(llm, a: argparse.Namespace, vocab: int) -> list[dict]:
    """Greedy decode of --prompts prompts: token ids, chosen-token logprob, top-1/top-2 margin."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    lengths = [16 + 48 * i for i in range(a.prompts)]
    prompts = [TokensPrompt(prompt_token_ids=prompt_ids(a.seed, i, n, vocab)) for i, n in enumerate(lengths)]
    params = SamplingParams(temperature=0.0, max_tokens=a.steps, ignore_eos=True, logprobs=2)
    outs = llm.generate(prompts, params, use_tqdm=False)
    result = []
    for i, o in enumerate(outs):
        c = o.outputs[0]
        lp, margin = [], []
        for tok, d in zip(c.token_ids, c.logprobs or []):
            vals = sorted((v.logprob for v in d.values()), reverse=True)
            lp.append(float(d[tok].logprob))
            margin.append(float(vals[0] - vals[1]) if len(vals) > 1 else None)
        result.append({"prompt_len": lengths[i], "tokens": list(c.token_ids), "logprob": lp,
                       "margin": margin})
    return result


def _sizes(spec: str) -> list[int]:
    return [int(v) for v in spec.split(",") if v]


def _trace_steps(engine, n: int, label: str, before=None) -> tuple[list[dict], dict]:  # noqa: ANN001
    """Kernel-trace n engine steps (`before(k)` runs ahead of step k, outside its annotation). In eager
    mode an IrCensus counts each step's IR-op norm calls and tags them with their row width, so the
    trace tells which kernels each width launched; under torch.compile the IR ops are lowered away
    (no per-call Python), so a step's norm calls are not observable by width there."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    census = normcalls.IrCensus(tag=True)
    with torch.profiler.profile(activities=acts) as prof, census:
        for k in range(n):
            if before is not None:
                before(k)
            census.step(k)
            with torch.profiler.record_function(f"{steptrace.STEP_PREFIX}{k}"):
                engine.step()
            census.step(None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{label}.json"
        prof.export_chrome_trace(str(path))
        events = steptrace.load_profiler_trace(path)
    names = {k: steptrace.kernel_names(events, k) for k in ("fused", "vllm_c", "inductor")}
    stats = steptrace.step_stats(events)
    calls = {k: Counter() for k in range(n)}
    for r in census.records:
        if r["step"] is not None and not r["fake"]:
            calls[r["step"]][f"{r['op']}/{r['width']}/{r['provider']}"] += 1
    for k, st in enumerate(stats):
        st["ir_calls"] = dict(calls.get(k, {}))  # {op/width/provider: calls}; empty when compiled
    return stats, names


def decode_batch(llm, a: argparse.Namespace, batch: int, vocab: int, timed: int, traced: int,
                 replays: int = 0) -> dict:
    """Put `batch` requests into decode, then time `timed` steps, time `replays` replays of one
    step's CUDA graph (if > 0) and kernel-trace `traced` more steps."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=timed + traced + 17, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt_ids(a.seed + 1, i, 32, vocab)), params)
    started: set[str] = set()
    for _ in range(64):  # prefill (possibly chunked) until every request has its first token
        started |= {o.request_id for o in engine.step() if o.outputs and o.outputs[0].token_ids}
        if len(started) == batch:
            break
    if len(started) != batch:
        raise RuntimeError(f"batch {batch}: only {len(started)} requests reached decode")
    for _ in range(3):
        engine.step()
    samples = []
    for _ in range(timed):
        t0 = time.perf_counter_ns()
        engine.step()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    row = {"kind": "decode", "batch_tokens": batch, "step_wall_us": samples}
    if replays:
        row["graph_rounds"] = [graphtime.time_step(engine.step, replays)]
    row["traced_steps"], row["norm_kernel_names"] = (_trace_steps(engine, traced, f"b{batch}") if traced
                                                     else ([], {}))
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return row


def prefill_steps(llm, a: argparse.Namespace, length: int, vocab: int, timed: int, traced: int) -> dict:
    """Steps that prefill one fresh `length`-token prompt each (distinct ids: no prefix-cache hit;
    max_tokens 1, so the request ends in that step): wall time of `timed`, kernel trace of `traced`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    if length > a.max_num_batched_tokens:
        raise ValueError(f"prefill size {length} exceeds --max-num-batched-tokens {a.max_num_batched_tokens}")
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    counter = itertools.count()

    def add() -> None:
        i = next(counter)
        ids = prompt_ids(a.seed + 7919 * length, i, length, vocab)
        engine.add_request(f"p{length}-{i}", TokensPrompt(prompt_token_ids=ids), params)

    def drain() -> None:
        while engine.has_unfinished_requests():
            engine.step()

    for _ in range(2):  # warm-up
        add()
        drain()
    samples = []
    for _ in range(timed):
        add()
        t0 = time.perf_counter_ns()
        engine.step()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        drain()

    def next_prompt(_: int) -> None:
        drain()
        add()

    steps, names = _trace_steps(engine, traced, f"p{length}", before=next_prompt)
    drain()
    return {"kind": "prefill", "batch_tokens": length, "step_wall_us": samples, "traced_steps": steps,
            "norm_kernel_names": names}


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{a.label or a.arm}-{a.mode}"
    if torch.cuda.is_available():  # start CUPTI before any CUDA graph exists
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
    t0 = time.perf_counter()
    with normcalls.IrCensus() as lowering:  # under torch.compile vLLM's lowering pass dispatches here
        llm = build_llm(a)
    import vllm
    from vllm import ir

    vocab = llm.llm_engine.model_config.get_vocab_size()
    n_params = llm.apply_model(scaled_weights(a.seed)) if a.weights == "scaled" else None
    res: dict = {"arm": a.arm, "label": a.label or a.arm, "mode": a.mode, "model": a.model,
                 "vllm": vllm.__version__,
                 "torch": torch.__version__, "build_s": time.perf_counter() - t0,
                 "ir_priority": {op: getattr(ir.ops, op).get_priority() for op in IR_OPS},
                 "providers": {op: list(getattr(ir.ops, op).impls) for op in IR_OPS},
                 "vllm_plugins_env": os.environ.get("VLLM_PLUGINS"), "weights": a.weights,
                 "params_redrawn": n_params,
                 "ir_lowered": dict(Counter(f"{r['op']}/{r['width']}/{r['provider']}"
                                            for r in lowering.records if r["fake"]))}
    res["greedy"] = greedy(llm, a, vocab)
    res["proof"] = decode_batch(llm, a, 8, vocab, timed=4, traced=3)
    res["python_calls"] = _python_calls()
    write_json(out / f"{name}.json", res)
    (out / f"{name}.ready").touch()
    if a.turn_file:
        sizes = ([("decode", n) for n in _sizes(a.batch_sizes)]
                 + [("prefill", n) for n in _sizes(a.prefill_sizes)])
        rows: dict = {key: None for key in sizes}
        for r in range(1, a.rounds + 1):  # the caller alternates the arms' rounds (AB BA)
            _wait_for(Path(f"{a.turn_file}{r}"), a.turn_timeout)
            full = r <= a.profile_rounds
            timed, traced = (a.timed_steps, a.traced_steps) if full else (0, 0)
            for kind, n in sizes:
                if kind == "decode":
                    row = decode_batch(llm, a, n, vocab, timed, traced, a.graph_replays)
                elif full:
                    row = prefill_steps(llm, a, n, vocab, timed, traced)
                else:
                    continue
                rows[kind, n] = _merge(rows[kind, n], row)
            (out / f"{name}.done{r}").touch()
        res["steps"] = list(rows.values())
        res["python_calls"] = _python_calls()
        write_json(out / f"{name}.json", res)
        (out / f"{name}.done").touch()
    return 0


def _merge(acc: dict | None, row: dict) -> dict:
    """One batch size's samples over the rounds."""
    if acc is None:
        return row
    acc["step_wall_us"] += row["step_wall_us"]
    acc["traced_steps"] += row["traced_steps"]
    if "graph_rounds" in row:
        acc["graph_rounds"] = acc.get("graph_rounds", []) + row["graph_rounds"]
    return acc


def _python_calls() -> dict:
    """Calls of the fused custom ops that went through Python here (eager calls and captures)."""
    if "integration.ops" not in sys.modules:
        return {}
    from integration.ops import CALLS

    return {f"{op}/{answer}": n for (op, answer), n in sorted(CALLS.items())}


if __name__ == "__main__":
    sys.exit(main())
