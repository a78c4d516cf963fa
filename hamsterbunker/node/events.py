"""What a node tells the world: events, heartbeats and its history of store operations.

Every event goes to ``on_event``, the log (at its type's level, ``node.priorities``)
and the node's event log in the store, whose writer holds events while the store is
unreachable. ``emit`` is safe from any thread; events are numbered in order on the
event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import StoreError, StoreUnavailable
from ..core.history import HistoryWriter
from ..lease import LeaseKeeper
from ..records import MAX_SHOWN_EFFECTS, MAX_SHOWN_NAME, Event, Heartbeat
from ..stores import Store
from .calls import NodeCalls
from .priorities import event_priority
from .state import Identity, Standing

if TYPE_CHECKING:  # loads prometheus_client, which a node without metrics never needs
    from .metrics import NodeMetrics

__all__ = ["EventHandler", "EventSink"]

log = logging.getLogger("hamsterbunker")
EventHandler = Callable[[Event], None]
# In a long outage the oldest unsent events give way, so memory stays bounded.
MAX_PENDING_EVENTS = 10_000
# The longest a hush holds the node's event and heartbeat writes (see EventSink.hush).
HUSH_MAX_S = 0.25


class EventSink:
    """Numbers, hands on and stores one run's events; writes its heartbeats and history.

    Made inside the node's event loop: events are handed on in its thread.
    """

    def __init__(
        self,
        identity: Identity,
        store: Store,
        calls: NodeCalls,
        keeper: LeaseKeeper,
        standing: Standing,
        *,
        retry_s: float,
        on_event: EventHandler | None = None,
        history: HistoryWriter | None = None,
        metrics: NodeMetrics | None = None,
        log_agent: bool = False,
        load: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self._id, self._store, self._calls = identity, store, calls
        # Who the log lines name: the node, and the agent where a process keeps several.
        self._log_name = f"{identity.node}/{identity.agent}" if log_agent else identity.node
        # The node process's (agents led, agents kept), told in each heartbeat: a node of
        # one agent tells its own.
        self._load = load or (lambda: (int(keeper.held is not None), 1))
        self._keeper, self._standing = keeper, standing
        self._retry_s = retry_s  # how often the writer tries a store that does not answer
        self._on_event, self._history, self._metrics = on_event, history, metrics
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._pending: asyncio.Queue[Event] = asyncio.Queue(MAX_PENDING_EVENTS)
        self._n = 0
        self._beats = 0
        self._quiet = asyncio.Event()  # cleared while hushed
        self._quiet.set()
        self._hush_ends: asyncio.TimerHandle | None = None

    # -- events ----------------------------------------------------------------

    async def number_on_from_store(self) -> None:
        """Number on from this node's highest event number in the store: readers that keep a
        cursor per node see a new process's events too."""
        self._n = await self._calls.io(self._last_stored_number)

    def _last_stored_number(self) -> int:
        own = [e.n for e in self._store.read_events(self._id.agent) if e.node == self._id.node]
        return max(own, default=0)

    def _effects_shown(self) -> tuple[tuple[str, str], ...]:
        """The newest effects of the step in flight, as a heartbeat shows them."""
        if self._standing.role != "active":
            return ()
        shown = self._standing.effects[-MAX_SHOWN_EFFECTS:]
        return tuple((name[:MAX_SHOWN_NAME], state) for name, state in shown if name)

    def emit(self, kind: str, *, epoch: int | None = None, **detail: Any) -> None:
        """Record a state change: on_event, the log, and this node's event log in the store.
        epoch: the term it is about (by default the lease held, else the newest seen)."""
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(lambda: self.emit(kind, epoch=epoch, **detail))
            return
        self._n += 1
        held = self._keeper.held
        if epoch is None:
            epoch = held.epoch if held else self._standing.epoch_seen
        event = Event(
            node=self._id.node,
            n=self._n,
            type=kind,
            time=time.time(),
            epoch=epoch,
            seq=self._standing.seq,
            detail=detail,
        )
        log.log(
            event_priority(kind),
            "%s %s epoch=%d seq=%d %s",
            self._log_name,
            kind,
            event.epoch,
            event.seq,
            " ".join(f"{k}={v}" for k, v in detail.items()),
        )
        if self._metrics is not None:
            self._metrics.on_event(kind, detail)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                log.exception("on_event handler failed for %s", kind)
        if self._pending.full():
            self._pending.get_nowait()  # bounded: the oldest unsent event gives way
            self._pending.task_done()
        self._pending.put_nowait(event)

    async def write(self) -> None:
        """Store the events in order (until cancelled); while the store is unreachable, retry."""
        holding = False  # said so once per outage
        while True:
            event = await self._pending.get()
            await self._quiet.wait()
            try:
                while True:
                    try:
                        await self._calls.io(self._store.append_event, self._id.agent, event)
                    except StoreUnavailable as exc:
                        if not holding:
                            holding = True
                            log.warning("%s: holding events until the store answers: %s",
                                        self._id.node, exc)  # fmt: skip
                        await asyncio.sleep(self._retry_s)
                        continue
                    except StoreError as exc:
                        log.warning("%s: event %s not stored: %s", self._id.node, event.type, exc)
                    holding = False
                    break
            finally:
                self._pending.task_done()

    def hush(self) -> None:
        """Hold event and heartbeat writes while the lease changes hands, so that they do not
        slow the handover's store calls: until unhush(), for HUSH_MAX_S at most.
        """
        self._quiet.clear()
        if self._hush_ends is not None:
            self._hush_ends.cancel()
        self._hush_ends = self._loop.call_later(HUSH_MAX_S, self.unhush)

    def unhush(self) -> None:
        if self._hush_ends is not None:
            self._hush_ends.cancel()
            self._hush_ends = None
        self._quiet.set()

    def hushed(self) -> bool:
        return not self._quiet.is_set()

    async def until_quiet(self) -> None:
        await self._quiet.wait()

    async def flush(self, timeout: float) -> None:
        """Wait up to timeout for the writer to store every event; say how many it could not."""
        try:
            await asyncio.wait_for(self._pending.join(), timeout=timeout)
        except TimeoutError:
            log.warning(
                "%s: %d events could not be written to the store",
                self._id.node,
                self._pending.qsize(),
            )

    # -- heartbeats and history --------------------------------------------------

    async def beat(self) -> None:
        """Write this node's heartbeat (a failure is only logged: the next tick writes again)."""
        self._beats += 1
        held, observed = self._keeper.held, self._keeper.observed
        leads, agents = self._load()
        heartbeat = Heartbeat(
            node=self._id.node,
            region=self._id.region,
            host=self._id.host,
            pid=os.getpid(),
            role=self._standing.role,
            epoch=self._standing.epoch_seen,
            seq=self._standing.seq,
            leader=held.holder if held else (observed.holder if observed else None),
            time=time.time(),
            beats=self._beats,
            effects=self._effects_shown(),
            inbox_depth=self._standing.inbox[0],
            inbox_oldest=self._standing.inbox[1],
            failing=self._standing.failing[0],
            failing_error=self._standing.failing[1],
            paused=self._standing.paused,
            keys=self._standing.keys,
            sealing=self._standing.sealing,
            lease_session=self._keeper.session,
            host_leads=leads,
            host_agents=agents,
        )
        try:
            await self._calls.io(self._store.put_heartbeat, self._id.agent, heartbeat)
        except StoreError as exc:
            log.debug("%s: heartbeat not written: %s", self._id.node, exc)

    def record(
        self, op: str, epoch: int, seq: int, start: float, outcome: str, **detail: Any
    ) -> None:
        """One completed store operation, into the history file if the node keeps one."""
        if self._history is not None:
            self._history.record(self._id.node, op, epoch, seq, start, outcome, **detail)
        if self._metrics is not None:
            self._metrics.recorded(op, start, outcome)

    def measured(self, what: str, seconds: float) -> None:
        """How long a renewal or a step took, for the metrics (no event carries it)."""
        if self._metrics is not None:
            self._metrics.measured(what, seconds)
