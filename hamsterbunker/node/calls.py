"""Blocking calls made from the node's event loop, each on a thread pool of the node's own.

Store calls on one; steps, sealing and init on another, never asyncio's default
executor (which ``asyncio.run`` waits for: a sync step that never returns must not
keep ``stop()`` from returning).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..core.errors import StoreError, StoreUnavailable

__all__ = ["NodeCalls", "bounded"]

T = TypeVar("T")

STORE_THREADS = 4  # the store calls a node makes at once


class NodeCalls:
    """The pools of one run of a node; made inside its event loop, closed when it ends."""

    def __init__(self) -> None:
        self._io = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="hb-store")
        self._work = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hb-work")
        # A LeaseKeeper is used by one call at a time: its methods are not thread-safe.
        self._keeper_lock = asyncio.Lock()

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Call fn on the store pool; an OSError there is a StoreError here."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._io, fn, *args)
        except OSError as exc:
            raise StoreError(f"store I/O failed: {exc}") from exc

    async def warm(self, check: Callable[[], object]) -> None:
        """Call check on every store thread at once, so that a store client that pools its
        connections holds as many open: a takeover's first calls, made all at once, then
        pay no connection's handshake (several round trips to a far Redis). Errors are for
        later calls to find."""
        together = threading.Barrier(STORE_THREADS)

        def at_once() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                together.wait(timeout=1)
            check()

        await asyncio.gather(
            *(self.io(at_once) for _ in range(STORE_THREADS)), return_exceptions=True
        )

    async def keeper(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a LeaseKeeper method on the store pool, one call at a time."""
        async with self._keeper_lock:
            return await self.io(fn, *args)

    async def work(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn on the worker pool (steps, sealing, init, memory).

        As asyncio.to_thread does, in a copy of the caller's context, so that
        current_step() works in a sync step.
        """
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._work, call)

    async def detached(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn in a thread of its own, in a copy of the caller's context.

        For an effect's blocking function, which may take minutes or hang: it
        holds up no pool, and nothing waits for it when the node stops.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()

        def settle(outcome: Callable[[], None]) -> None:
            if not done.done():
                outcome()

        def run() -> None:
            try:
                result = context.run(fn, *args, **kwargs)
            except BaseException as exc:  # handed to the awaiting task
                answer = functools.partial(settle, functools.partial(done.set_exception, exc))
            else:
                answer = functools.partial(settle, functools.partial(done.set_result, result))
            with contextlib.suppress(RuntimeError):  # the node's loop has closed: nobody waits
                loop.call_soon_threadsafe(answer)

        threading.Thread(target=run, name="hb-effect", daemon=True).start()
        return await done

    def close(self) -> None:
        """Stop both pools without waiting: a hung call is abandoned in its thread."""
        self._io.shutdown(wait=False, cancel_futures=True)
        self._work.shutdown(wait=False, cancel_futures=True)


async def bounded(call: Awaitable[T], timeout: float) -> T:
    """A shutdown's store call, given up (StoreUnavailable) after timeout seconds."""
    try:
        return await asyncio.wait_for(call, timeout=timeout)
    except TimeoutError:
        raise StoreUnavailable("the store did not answer in time during the stop") from None
