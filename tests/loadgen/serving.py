"""The fake server on its own event loop in a thread, for tests of CLIs that run their own loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from loadgen.fakeserver import FakeServerConfig, fake_server


@contextmanager
def serving(cfg: FakeServerConfig) -> Iterator[str]:
    """Serve `cfg` until the block ends; its URL."""
    ready: list[str] = []
    stop = threading.Event()

    async def serve() -> None:
        async with fake_server(cfg) as url:
            ready.append(url)
            while not stop.is_set():
                await asyncio.sleep(0.02)

    t = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    t.start()
    while not ready:
        t.join(0.01)
    try:
        yield ready[0]
    finally:
        stop.set()
        t.join(5)
