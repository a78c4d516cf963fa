"""The record layer's watch of terms through a store outage: a hint that outlives it.

A watch of terms reads the lease at its start and after each notice that carries
no value (a gap: the backend could not listen). Over a network store those reads
fail while the server is down; the watch must say "read to know" (None) and go
on, never end, and never wait for the store in the watcher's event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from hamsterbunker.core.errors import StoreUnavailable
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.backend import Notice, TooLarge, Txn, TxnResult
from hamsterbunker.stores.backends.memory import MemoryBackend
from hamsterbunker.stores.layer import RecordStore

BOUND_S = 5.0  # every wait in these tests


class DownBackend(MemoryBackend):
    """A memory backend that can be taken down (reads and commits fail, as a server gone)
    or made to hang (reads wait, as a frozen server), with a watch the test feeds."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.reads = 0
        self.answering = threading.Event()
        self.answering.set()
        self.notices: asyncio.Queue[Notice] | None = None

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        self.answering.wait(BOUND_S)
        self.reads += 1
        if self.down:
            raise StoreUnavailable("memory store: down")
        return super().get(key, max_bytes)

    def commit(self, txn: Txn) -> TxnResult:
        if self.down:
            raise StoreUnavailable("memory store: down")
        return super().commit(txn)

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        assert self.notices is not None
        while True:
            yield await self.notices.get()


def lease(holder: str | None, epoch: int) -> LeaseRecord:
    return LeaseRecord(holder=holder, region="eu", session="s1", epoch=epoch, ttl_ms=2000)


@pytest.mark.parametrize("down_from_the_start", [False, True], ids=["down later", "down at start"])
def test_a_watch_of_terms_goes_on_through_an_outage(down_from_the_start: bool) -> None:
    """A gap while the lease cannot be read yields None (read to know); once the store is
    back, a release still wakes the watch."""
    backend = DownBackend()
    store = RecordStore(backend)
    version = store.cas_lease("a", None, lease("n1", 1)).version

    async def main() -> None:
        backend.notices = asyncio.Queue()
        watcher = store.watch("a", lease_only=True, terms_only=True)
        backend.down = down_from_the_start
        woke = asyncio.ensure_future(anext(watcher))
        try:
            while backend.reads == 0:  # the term as the watch begins: read, or not
                await asyncio.wait({woke}, timeout=0.01)
                assert not woke.done(), woke
            backend.down = True
            await backend.notices.put(Notice(None))
            assert await asyncio.wait_for(woke, BOUND_S) is None
            backend.down = False
            store.cas_lease("a", version, lease(None, 1))
            await backend.notices.put(Notice(None))
            assert await asyncio.wait_for(anext(watcher), BOUND_S) is None
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_watch_of_terms_reads_the_lease_outside_the_event_loop() -> None:
    """The watch's first read of the lease waits on the store in a thread: the watcher's
    event loop goes on meanwhile."""
    backend = DownBackend()
    store = RecordStore(backend)
    store.cas_lease("a", None, lease("n1", 1))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        backend.notices = asyncio.Queue()
        watcher = store.watch("a", lease_only=True, terms_only=True)
        backend.answering.clear()  # the store hangs
        woke = asyncio.ensure_future(anext(watcher))
        try:
            started = loop.time()
            await asyncio.sleep(0.05)
            assert loop.time() - started < BOUND_S / 2, "the watch held up the event loop"
        finally:
            backend.answering.set()
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
