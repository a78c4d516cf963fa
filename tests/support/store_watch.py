"""Waiting for a store's watch to wake, for the tests of the network stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.interface import Store

WAIT_S = 10.0


async def next_wake(watcher: AsyncIterator[None], writer: Store) -> None:
    """Wait (bounded) for watcher to yield while writer keeps changing lease "a".

    Writing until it wakes, not once: the watch may not be set up yet when the
    first write lands, and a watch is only a hint.
    """
    loop = asyncio.get_running_loop()
    woke = asyncio.ensure_future(anext(watcher))
    deadline = loop.time() + WAIT_S
    new = LeaseRecord(holder="n1", region="eu", session="s1", epoch=1, ttl_ms=2000)
    try:
        while not woke.done():
            assert loop.time() < deadline, f"the watch did not yield within {WAIT_S} s"
            current = await asyncio.to_thread(writer.read_lease, "a")
            version = None if current is None else current.version
            await asyncio.to_thread(writer.cas_lease, "a", version, new)
            await asyncio.wait({woke}, timeout=0.25)
        woke.result()
    finally:
        woke.cancel()
        await asyncio.gather(woke, return_exceptions=True)
