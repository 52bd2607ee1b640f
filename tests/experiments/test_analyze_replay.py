"""End to end through the real replayer: records written by loadgen against two fake servers."""

import asyncio
import gzip
import shutil

from experiments.analyze import analyze_run
from experiments.slo import SLO
from loadgen.fakeserver import FakeServerConfig, fake_server
from loadgen.replay import replay
from tests.experiments.synthetic_run import write_run
from traces.trace import TraceRequest

REQUESTS = [TraceRequest(timestamp=0.02 * i, input_tokens=8, output_tokens=6) for i in range(5)]
# stock streams a token every 25 ms, patched every 2 ms: only patched meets TPOT <= 12 ms (wide margins:
# CI machines are slow and busy)
PACE = {"stock": 0.025, "patched": 0.002}


async def _replay_all(out, windows, loads):
    for win in range(windows):
        for load in loads:
            for arm, itl in PACE.items():
                async with fake_server(FakeServerConfig(ttft_s=0.002, itl_s=itl)) as url:
                    await replay(url, REQUESTS, out=out, progress=False, seed=win,
                                 tags={"arm": arm, "window": win, "load": load, "phase": "measure"})


def test_report_from_replayed_records(tmp_path):
    run_dir = write_run(tmp_path / "run", lambda *a: [(1.0, 1.0, None)] * len(REQUESTS), windows=2,
                        loads=(1.0,), requests=len(REQUESTS), duration_s=0.1, warmup=0)
    out = run_dir / "requests.jsonl"
    out.unlink()
    asyncio.run(_replay_all(out, windows=2, loads=(1.0,)))
    with out.open("rb") as src, gzip.open(run_dir / "requests.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    out.unlink()  # readers accept the compressed file written when a run ends
    r = analyze_run(run_dir, [SLO("fast", 1000.0, 12.0)])
    s = r["slos"][0]
    assert r["records"]["file"] == "requests.jsonl.gz" and r["records"]["total"] == 20
    assert s["stock"]["attainment"] == 0.0 and s["patched"]["attainment"] == 1.0
    assert s["patched"]["goodput_rps"] == 10 / 0.2  # 10 requests met over 2 windows of 0.1 s
    assert s["delta_goodput_pct"] is None  # stock goodput 0: a relative change is undefined, and said so
    assert len(s["undefined"]) == 2 and "no goodput comparison" in s["verdict"]
    tpot = {row["arm"]: row["tpot_p50_ms"] for row in r["latency"]}
    assert tpot["stock"] > 12.0 and tpot["patched"] < 12.0
