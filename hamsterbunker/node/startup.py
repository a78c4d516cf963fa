"""Waiting for the store at start: a node that boots before its store waits for it.

``StoreUnavailable`` is tried again with capped backoff (0.5 s doubling to 10 s) for as
long as it takes, one WARNING line a try, systemd's start timeout extended before
each wait; any other error is raised. A stop ends the wait at once. The wait's events
are emitted once the store answered (docs/design.md, "The node").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..core.clock import Clock
from ..core.errors import StoreUnavailable
from ..core.timing import LeaseTiming
from ..lease import LeaseKeeper
from ..lease.proof import LeaseProof
from ..sealing import Sealer
from .calls import NodeCalls
from .cluster import Cluster
from .events import EventSink
from .identity_check import check_node_id_free
from .keys import show_keys
from .notify import Notifier
from .state import Standing

__all__ = ["DEFAULT_START_RETRY", "StartRetry", "StoreWait"]

log = logging.getLogger("hamsterbunker")
T = TypeVar("T")
# How long past the next try systemd's start timeout is pushed: room for a try
# that takes the store's own timeouts, and for the rest of the start once it answers.
EXTEND_MARGIN_S = 60.0
# How long a try in flight when a stop comes may still take before it is left behind.
STOP_PATIENCE_S = 2.0


@dataclass(frozen=True)
class StartRetry:
    """The waits between tries of a store that does not answer at start: doubling, capped."""

    first_s: float = 0.5
    max_s: float = 10.0

    def delay(self, tries: int) -> float:
        """The wait after the tries-th failed try."""
        return min(self.max_s, self.first_s * 2.0 ** min(tries - 1, 64))


DEFAULT_START_RETRY = StartRetry()


class StoreWait:
    """Runs the start's store calls, trying again while the store does not answer."""

    def __init__(
        self,
        *,
        node_id: str,
        store_url: str,
        notifier: Notifier,
        stopping: asyncio.Event,
        clock: Clock,
        retry: StartRetry = DEFAULT_START_RETRY,
    ) -> None:
        self._node_id, self._url, self._notifier = node_id, store_url, notifier
        self._stopping, self._clock, self._retry = stopping, clock, retry
        self.tries = 0  # failed tries so far
        self.first_error: str | None = None
        self.gave_up = False  # a stop ended the wait: the node ends without starting
        self._began: float | None = None

    async def until_answered(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """The call's result once the store answers; None (and ``gave_up`` set) if a stop
        came first. A try in flight when the stop comes may still finish, briefly."""
        while True:
            attempt: asyncio.Future[T] = asyncio.ensure_future(call())
            stop: asyncio.Future[Any] = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait((attempt, stop), return_when=asyncio.FIRST_COMPLETED)
                if not attempt.done():
                    await asyncio.wait((attempt,), timeout=STOP_PATIENCE_S)
            finally:
                stop.cancel()
            if not attempt.done():  # a stop, and the try hangs: leave it behind
                attempt.cancel()
                attempt.add_done_callback(_consume)
                self.gave_up = True
                return None
            try:
                return attempt.result()
            except StoreUnavailable as exc:
                if self._stopping.is_set():
                    self.gave_up = True
                    return None
                await self._failed(exc)
                if self._stopping.is_set():
                    self.gave_up = True
                    return None

    async def _failed(self, exc: StoreUnavailable) -> None:
        """Say so (log, STATUS, a longer start timeout), then wait the backoff or a stop."""
        self.tries += 1
        reason = " ".join(str(exc).split())
        if self.first_error is None:
            self.first_error, self._began = reason, self._clock.monotonic()
        delay = self._retry.delay(self.tries)
        log.warning(
            "%s store.error waiting for the store %s: %s (try %d, next in %.1f s)",
            self._node_id,
            self._url,
            reason,
            self.tries,
            delay,
        )
        self._notifier.status(
            f"starting · waiting for the store {self._url}: {reason} (try {self.tries})"
        )
        self._notifier.extend_timeout(delay + EXTEND_MARGIN_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)

    def report(self, emit: Callable[..., Any]) -> None:
        """Emit the wait's events, if there was a wait (once the event numbering is known)."""
        if self.first_error is None or self._began is None:
            return
        waited_ms = round((self._clock.monotonic() - self._began) * 1000)
        emit("store.error", error=self.first_error, tries=self.tries, during="start")
        emit("store.recovered", waited_ms=waited_ms)
        self._notifier.status("starting · the store answered")


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned try's outcome, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


async def open_for_node(
    cluster: Cluster,
    keeper: LeaseKeeper,
    standing: Standing,
    calls: NodeCalls,
    sink: EventSink,
    stopping: asyncio.Event,
    *,
    notifier: Notifier,
    timing: LeaseTiming,
    clock: Clock,
) -> Sealer | None:
    """The cluster record opened with the secret and this node's id checked free, the
    store waited for while it does not answer; None if the node stopped meanwhile. A node
    with the wrong secret writes nothing.
    """
    store, agent, node = keeper.store, keeper.agent, keeper.node
    notifier.status("starting · opening the store")
    wait = StoreWait(
        node_id=node, store_url=store.url, notifier=notifier, stopping=stopping, clock=clock
    )
    sealer = await wait.until_answered(functools.partial(calls.io, cluster.open))
    if sealer is None:
        return None
    show_keys(standing, sealer)
    keeper.proof = proof = LeaseProof(sealer, agent)  # before any write
    if store.chains is not None:
        store.chains.check_claims_with(agent, proof.problem)
    # Before this node beats or emits: refuse an id another live process uses.
    await check_node_id_free(store, agent, node, timing=timing, clock=clock, calls=calls)
    await wait.until_answered(sink.number_on_from_store)
    if wait.gave_up:
        return None
    wait.report(sink.emit)
    if cluster.created:
        sink.emit("store.created", store=store.url)
    return sealer
