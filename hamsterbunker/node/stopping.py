"""A stop of the node asked for from any thread or a signal handler, and the deadline
it must keep: how long the step in flight may still take, and each store call of the
shutdown (DESIGN.md invariant 6)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from ..core.clock import Clock
from ..core.timing import DEFAULT_STOP_GRACE_MS

__all__ = ["SHUTDOWN_CALL_S", "StopRequest"]

# The most a stop waits for each store call of its shutdown (release, heartbeat),
# and for the events to be flushed, when stop() names no deadline of its own.
SHUTDOWN_CALL_S = 5.0


class StopRequest:
    """A stop asked for from any thread or a signal handler, and the deadline it must keep."""

    def __init__(self, clock: Clock, grace_s: float = DEFAULT_STOP_GRACE_MS / 1000) -> None:
        self._clock, self._grace_s = clock, grace_s
        self._asked = threading.Event()  # seen by bind() if the loop is not running yet
        self._by: float | None = None  # when the stop must be done, on the clock
        self._bound: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def ask(self, within: float | None = None) -> None:
        """Ask the node to stop (within that many seconds, if given)."""
        if within is not None:
            self._by = self._clock.monotonic() + within
        self._asked.set()
        bound = self._bound
        if bound is not None and not bound[0].is_closed():
            # RuntimeError: the loop closed between the check and the call; already stopped.
            with contextlib.suppress(RuntimeError):
                bound[0].call_soon_threadsafe(bound[1].set)

    def bind(self) -> asyncio.Event:
        """The event that a stop sets, in the running event loop (set now if already asked)."""
        stopping = asyncio.Event()
        self._bound = (asyncio.get_running_loop(), stopping)
        if self._asked.is_set():
            stopping.set()
        return stopping

    def grace(self) -> float:
        """How long the step in flight may still take: the stop grace, within the deadline."""
        if self._by is None:
            return self._grace_s
        return max(0.0, min(self._grace_s, (self._by - self._clock.monotonic()) / 2))

    def budget(self) -> float:
        """How long one step of a shutdown may wait on the store: the stop's deadline halved."""
        if self._by is None:
            return SHUTDOWN_CALL_S
        return max(0.05, min(SHUTDOWN_CALL_S, (self._by - self._clock.monotonic()) / 2))
