"""The GPU-memory arithmetic of a run: weights from config.json, KV bytes per token, the trace's KV
need, and the design picked (or refused, with flags that fit) for 24, 40, 80 and 141 GB GPUs."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest

from experiments.runner import readiness, sizing
from experiments.runner.config import DEVICE_DEFAULTS, GIB, ConfigError, RunConfig
from integration.launcher import MODELS_DIR
from tests.experiments.test_config import TRACE
from traces.trace import TraceRequest

GB = 10**9
DESIGN_ARMS = ("stock", "patched", "planted:3us", "stock")  # the GPU default with the interleaved A/A


@pytest.fixture(scope="module")
def design() -> RunConfig:
    return RunConfig(trace=TRACE, device="cuda", arms=DESIGN_ARMS, **DEVICE_DEFAULTS["cuda"])


@pytest.fixture(scope="module")
def need(design: RunConfig) -> int:
    return readiness.need_tokens(design)


def test_weights_and_kv_per_token_come_from_config_json() -> None:
    eight = sizing.shape(MODELS_DIR / "llama-3.1-8b", "bfloat16")
    one = sizing.shape(MODELS_DIR / "llama-3.2-1b", "bfloat16")
    assert eight.weight_bytes == 2 * 8_030_261_248  # vLLM logs "Model loading took 15.0 GiB"
    assert one.weight_bytes == 2 * 1_235_814_400  # tied lm_head; vLLM logs 2.32 GiB
    assert eight.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 and one.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert sizing.shape(MODELS_DIR / "tiny-llama", "auto").weight_bytes % 4 == 0  # float32 from config


def test_in_flight_tokens_counts_requests_held_at_once() -> None:
    reqs = [TraceRequest(0.0, 100, 10), TraceRequest(0.1, 50, 10), TraceRequest(100.0, 1000, 1)]
    assert sizing.in_flight_tokens(reqs, 1.0) == 1001  # the last alone is the most
    assert sizing.in_flight_tokens(reqs[:2], 1.0) == 170  # the first two overlap
    assert sizing.kv_need_tokens([reqs[:2]], [1.0], 16384) == 16384  # vLLM's cache holds max-model-len


def _sized(cfg: RunConfig, gb: float, given: set[str]) -> RunConfig:
    """cfg with what fits a GPU of `gb` GB (readiness.sized), as the CLI makes the run's config."""
    fit = readiness.sized(cfg, {"arms", *given}, (int(gb * GB), int(gb * GB)))
    return dataclasses.replace(cfg, **dataclasses.asdict(fit))


def _apply(cfg: RunConfig, flags: str) -> tuple[RunConfig, set[str]]:
    """cfg with a suggested flag set applied (the flags the CLI would pass), and the names given."""
    words, changes, given = flags.split(), {}, {"kv_cache_memory_bytes"}
    arms = list(cfg.arms)
    for i, w in enumerate(words):
        if w == "--model":
            changes["model"] = words[i + 1]
            given.add("model")
        elif w == "--kv-cache-memory-bytes":
            changes["kv_cache_memory_bytes"] = int(words[i + 1].removesuffix("GiB")) * GIB
        elif w == "--resident":
            changes["resident"] = int(words[i + 1])
            given.add("resident")
        elif w == "--one-at-a-time":
            changes.update(one_at_a_time=True, knee_factors=None)
            arms = arms[:-1]  # no interleaved A/A with one server at a time
        elif w == "--arms":
            arms = words[i + 1].split(",") + arms[-1:]
        elif w == "--aa":
            arms = arms[:-1]
        elif w == "--sleep-mode":
            changes["sleep_mode"] = True
    return dataclasses.replace(cfg, arms=tuple(arms), **changes), given


# (GB, --model or None for the default) -> (model picked, KV GiB, servers resident at once) or None for a
# refusal: the larger model in resident sets (--resident) before the smaller one with every arm resident;
# the KV cache is sized for the knee search's highest load (--knee-max 64 x 1.25), 12 GiB of the 8B shape
EXPECTED = {
    (24, None): ("llama-3.2-1b", 5, 2), (24, "llama-3.2-1b"): ("llama-3.2-1b", 5, 2),
    (24, "llama-3.1-8b"): None,
    (40, None): ("llama-3.2-1b", 3, 4), (40, "llama-3.2-1b"): ("llama-3.2-1b", 3, 4),
    (40, "llama-3.1-8b"): None,
    (80, None): ("llama-3.1-8b", 12, 2), (80, "llama-3.2-1b"): ("llama-3.2-1b", 10, 4),
    (80, "llama-3.1-8b"): ("llama-3.1-8b", 12, 2),
    (141, None): ("llama-3.1-8b", 12, 4), (141, "llama-3.2-1b"): ("llama-3.2-1b", 10, 4),
    (141, "llama-3.1-8b"): ("llama-3.1-8b", 12, 4),
}


@pytest.mark.parametrize("gb,model", sorted(EXPECTED, key=str))
def test_the_design_fits_or_is_refused_with_flags_that_fit(design: RunConfig, need: int, gb: int,
                                                          model: str | None) -> None:
    cfg = dataclasses.replace(design, model=model or design.model)
    given = {"model"} if model else set()
    expected = EXPECTED[(gb, model)]
    if expected is None:
        with pytest.raises(ConfigError) as err:
            _sized(cfg, gb, given)
        message = str(err.value)
        assert "\n" not in message and message.startswith("GPU memory: 4 x ")
        flags = re.findall(r"`([^`]+)`", message)
        assert flags, message
        for f in flags:  # every suggestion fits when applied
            fixed, fixed_given = _apply(cfg, f)
            assert readiness.memory_fit(_sized(fixed, gb, fixed_given | given), (gb * GB, gb * GB)).fits, f
        return
    out = _sized(cfg, gb, given)
    fit = readiness.memory_fit(out, (gb * GB, gb * GB))
    assert (out.model, out.kv_cache_memory_bytes // GIB, fit.servers) == expected
    assert out.resident == (None if fit.servers == 4 else fit.servers)
    assert fit.fits and fit.kv_tokens >= need
    assert fit.total_bytes <= gb * GB and fit.servers * out.gpu_memory_utilization <= 1
    if fit.servers < 4:  # the most that fit: one more does not
        assert not readiness.memory_fit(out, (gb * GB, gb * GB), servers=fit.servers + 1).fits


def test_the_default_fits_an_h100_and_an_h200_as_torch_reports_them(design: RunConfig) -> None:
    h100 = (85_029_158_912 - GIB // 2, 85_029_158_912)  # "NVIDIA H100 80GB HBM3": 79.2 GiB
    h200 = (int(139.29 * GIB), 150_754_820_096)  # the first server's "Initial free memory 139.29 GiB"
    on_h100 = readiness.sized(design, {"arms"}, h100)  # two 8B servers at a time, not the 1B shape
    assert (on_h100.model, on_h100.resident, on_h100.kv_cache_memory_bytes) == ("llama-3.1-8b", 2, 12 * GIB)
    on_h200 = readiness.sized(design, {"arms"}, h200)
    assert on_h200.model == "llama-3.1-8b" and on_h200.kv_cache_memory_bytes == 12 * GIB
    assert on_h200.resident is None  # all four fit


def test_the_kv_cache_is_sized_for_the_knee_searchs_highest_load(design: RunConfig, need: int) -> None:
    assert readiness.highest_load(design) == 80.0  # a knee at --knee-max 64 is measured up to 64 x 1.25
    low = dataclasses.replace(design, knee_max=8.0)
    assert readiness.highest_load(low) == 10.0 and readiness.need_tokens(low) < need
    assert readiness.highest_load(dataclasses.replace(design, knee_factors=None)) == 8.0  # --loads 5,8


def test_a_given_resident_count_is_kept_or_refused(design: RunConfig) -> None:
    three = dataclasses.replace(design, resident=3)
    assert readiness.sized(three, {"arms", "resident"}, (141 * GB, 141 * GB)).resident == 3
    with pytest.raises(ConfigError, match=r"^GPU memory: 3 x llama-3.1-8b .* need 91.2 GiB, the GPU has "
                                          r"74.5 GiB free .* flags that fit: `--resident 2 --kv-cache"):
        readiness.sized(three, {"arms", "resident", "model"}, (80 * GB, 80 * GB))


def test_sleep_mode_fits_the_8b_design_on_an_h100_one_server_awake(design: RunConfig, need: int) -> None:
    h100 = (85_029_158_912 - GIB // 2, 85_029_158_912)  # as torch reports it: 78.7 GiB free
    kv = max(sizing.DESIGN_KV_BYTES, sizing.need_bytes(sizing.shape(design.model_dir, design.dtype), need))
    shapes = {m: sizing.shape(MODELS_DIR / m, design.dtype) for m in sizing.DESIGN_MODELS}
    arms = DESIGN_ARMS[:3]
    offered = sizing.flags_that_fit(shapes, "llama-3.1-8b", arms, True, h100[0], need)
    assert offered[:2] == [f"--resident 2 --kv-cache-memory-bytes {kv // GIB}GiB",  # four awake do not fit
                           f"--sleep-mode --kv-cache-memory-bytes {kv // GIB}GiB"]
    beside = sizing.flags_that_fit(shapes, "llama-3.1-8b", arms, True, h100[0], need, may_sleep=False)
    assert not any("--sleep-mode" in f for f in beside)  # not offered beside a given --resident
    asleep = dataclasses.replace(design, sleep_mode=True)
    out = dataclasses.replace(asleep, **dataclasses.asdict(readiness.sized(asleep, {"arms"}, h100)))
    assert out.resident is None  # every arm stays resident: no sets chosen
    assert (out.model, out.kv_cache_memory_bytes) == ("llama-3.1-8b", kv)
    fit = readiness.memory_fit(out, h100)
    assert (fit.servers, fit.asleep, fit.fits) == (1, 3, True)
    assert fit.total_bytes == fit.server_bytes + 3 * sizing.ASLEEP_BYTES + sizing.MARGIN_BYTES
    assert fit.start_awake == 2  # two awake and two asleep fit while they start, three awake do not
    two = dataclasses.replace(fit, servers=2, asleep=2)
    assert two.fits and not dataclasses.replace(fit, servers=3, asleep=1).fits
    m = fit.to_json()
    assert (m["asleep"], m["start_awake"], m["all_awake_fit"]) == (3, 2, False)
    assert m["all_awake_bytes"] == 4 * fit.server_bytes + sizing.MARGIN_BYTES > h100[0]
    awake = dataclasses.replace(out, sleep_mode=False, gpu_memory_utilization=None)
    assert "asleep" not in readiness.memory_fit(awake, h100).to_json()


def test_a_given_kv_cache_too_small_for_the_trace_is_refused(design: RunConfig) -> None:
    small = dataclasses.replace(design, kv_cache_memory_bytes=2 * GIB)
    with pytest.raises(ConfigError, match=r"holds 16,384 tokens of llama-3.1-8b, the trace needs"):
        readiness.sized(small, {"arms", "kv_cache_memory_bytes"}, (141 * GB, 141 * GB))


def test_one_server_at_a_time_sizes_one_server(design: RunConfig) -> None:
    one = dataclasses.replace(design, arms=DESIGN_ARMS[:3], one_at_a_time=True, knee_factors=None)
    out = _sized(one, 24, set())
    assert out.model == "llama-3.2-1b" and readiness.memory_fit(out, (24 * GB, 24 * GB)).servers == 1


def test_an_unreadable_gpu_memory_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "RuntimeError: No CUDA GPUs are available"
    failed = subprocess.CompletedProcess([], 1, "", f"Traceback ...\n{why}\n")
    monkeypatch.setattr(sizing.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(OSError, match=rf"^cannot read the GPU's memory .*: {why}$"):
        sizing.gpu_memory.__wrapped__()
