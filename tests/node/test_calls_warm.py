"""NodeCalls.warm: the store check made on every store thread at once, so that a pooled
store client opens as many connections before a takeover needs them."""

from __future__ import annotations

import asyncio
import threading

from hamsterbunker.node.calls import STORE_THREADS, NodeCalls


def test_warm_calls_the_check_on_every_store_thread_at_the_same_time() -> None:
    inside: set[str] = set()
    all_in = threading.Barrier(STORE_THREADS)  # passes only if every call is inside at once
    lock = threading.Lock()

    def check() -> None:
        with lock:
            inside.add(threading.current_thread().name)
        all_in.wait(timeout=10)

    async def run() -> None:
        calls = NodeCalls()
        await calls.warm(check)
        calls.close()

    asyncio.run(run())
    assert len(inside) == STORE_THREADS and not all_in.broken


def test_a_check_that_fails_fails_nothing() -> None:
    def check() -> None:
        raise OSError("the store is not there yet")

    async def run() -> None:
        calls = NodeCalls()
        await calls.warm(check)  # errors are for later calls to find
        calls.close()

    asyncio.run(run())
