"""The order in which a run's servers start: together on a GPU (the KV caches are explicit and equal),
servers sharing a compile cache after the first of it, one at a time on the CPU and for endpoints."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from experiments.runner import config
from experiments.runner.config import make_config
from experiments.runner.servers import StartFailed, _stop_then_raise, start_waves

TRACE = Path(__file__).resolve().parents[2] / "traces" / "chat.jsonl"


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "detect_device", lambda: "cuda")


def test_gpu_servers_start_together_and_those_sharing_a_compile_cache_after(gpu: None) -> None:
    # the arms as --aa interleaved makes them: a second server of the baseline last; the planted twin
    # of patched resolves the same policy table, so the same compile cache (integration.compilecache)
    cfg = make_config(TRACE, "cuda", arms=("stock", "patched", "planted:500ns", "stock"),
                      gpu_memory_utilization=0.2)
    labels = list(cfg.labels)
    assert len(labels) == 4 and sorted(labels) == sorted(set(labels))
    stock, patched, planted, repeat = labels
    assert start_waves(cfg, labels) == [[stock, patched], [planted, repeat]]
    assert start_waves(cfg, [repeat]) == [[repeat]]  # a restart of the repeat alone
    assert start_waves(cfg, [planted, stock]) == [[planted, stock]]
    eager = dataclasses.replace(cfg, eager=True)  # nothing compiled, no cache to wait for
    assert start_waves(eager, labels) == [labels]


def test_endpoints_are_waited_for_one_at_a_time(gpu: None) -> None:
    cfg = make_config(TRACE, "cuda", arms=("stock", "mine"),
                      endpoints=("http://127.0.0.1:8001", "http://127.0.0.1:8002"))
    assert start_waves(cfg, list(cfg.labels)) == [[lab] for lab in cfg.labels]


def test_cpu_servers_start_in_turn() -> None:
    cfg = make_config(TRACE, "cpu", arms=("stock", "patched"))
    assert start_waves(cfg, list(cfg.labels)) == [[lab] for lab in cfg.labels]


class _Stoppable:
    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize("exc,kind", [(RuntimeError("exited with code 1"), StartFailed),
                                      (TimeoutError("not healthy"), StartFailed),
                                      (StartFailed("other", RuntimeError("x")), StartFailed),
                                      (KeyboardInterrupt(), KeyboardInterrupt)])
def test_a_failed_start_stops_what_started_and_names_the_server(exc: BaseException, kind: type) -> None:
    started = {"stock": _Stoppable(), "patched": _Stoppable()}
    with pytest.raises(kind) as got:
        _stop_then_raise(started, "patched", exc)
    assert all(s.stopped for s in started.values())
    if isinstance(exc, StartFailed):
        assert got.value is exc and got.value.label == "other"  # the inner wave's name is kept
    elif kind is StartFailed:
        assert got.value.label == "patched" and str(exc) in str(got.value)
