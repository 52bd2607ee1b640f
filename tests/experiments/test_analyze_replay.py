"""End to end through the real replayer: records written by loadgen against two fake servers."""

import asyncio

from common.jsonfile import compress_file
from experiments.analyze import analyze_run
from experiments.core.slo import SLO
from loadgen.fakeserver import FakeServerConfig, fake_server
from loadgen.replay import ReplayOptions, replay
from tests.experiments.synthetic_run import write_run
from traces.trace import TraceRequest

REQUESTS = [TraceRequest(timestamp=0.02 * i, input_tokens=8, output_tokens=6) for i in range(5)]
# The "stock" fake server ends every reply after 3 of the 6 asked tokens (a short reply is a miss);
# the bounds are loose so that nothing depends on timing on a busy machine.
SERVERS = {"stock": FakeServerConfig(ttft_s=0.002, itl_s=0.002, max_output_tokens=3),
           "patched": FakeServerConfig(ttft_s=0.002, itl_s=0.002)}
LOOSE = SLO("loose", 60_000.0, 10_000.0)


async def _replay_all(out, windows, loads):
    for win in range(windows):
        for load in loads:
            for arm, cfg in SERVERS.items():
                async with fake_server(cfg) as url:
                    await replay(url, REQUESTS, ReplayOptions(out=out, progress=False, seed=win,
                                 tags={"arm": arm, "window": win, "load": load, "phase": "measure"}))


def test_report_from_replayed_records(tmp_path):
    run_dir = write_run(tmp_path / "run", lambda *a: [(1.0, 1.0, None)] * len(REQUESTS), windows=2,
                        loads=(1.0,), requests=len(REQUESTS), duration_s=0.1, warmup=0)
    out = run_dir / "requests.jsonl"
    out.unlink()
    asyncio.run(_replay_all(out, windows=2, loads=(1.0,)))
    compress_file(out)  # readers accept the compressed file written when a run ends
    r = analyze_run(run_dir, [LOOSE], draw_plots=False)
    s = r["slos"][0]
    assert r["records"]["file"] == "requests.jsonl.xz" and r["records"]["total"] == 20
    assert s["stock"]["attainment"] == 0.0 and s["patched"]["attainment"] == 1.0
    assert s["patched"]["goodput_rps"] == 10 / 0.2  # 10 requests met over 2 windows of 0.1 s
    assert s["delta_goodput_pct"] is None  # stock goodput 0: a relative change is undefined, and said so
    assert len(s["undefined"]) == 2 and "stock goodput is 0 in all 2 paired windows" in s["verdict"]
    failed = {row["arm"]: row["failed"] for row in r["latency"]}
    assert failed == {"stock": 10, "patched": 0}  # short replies counted as failures, not dropped
