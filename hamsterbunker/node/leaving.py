"""Leaving the lead: acting on how a term ended (fenced, given up, handed over), and a
stop's release of the lease (DESIGN.md invariant 6). A part of ``NodeLoop``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

from ..core.errors import HamsterbunkerError, StoreError
from ..core.failpoints import failpoint
from ..core.timing import LeaseTiming
from ..lease import LeaseKeeper
from ..records import Heartbeat
from ..stores import Store
from .calls import NodeCalls, bounded
from .events import EventSink
from .notify import Notifier
from .state import Identity
from .stopping import StopRequest
from .term import TermEnd

__all__ = ["Leaving"]

log = logging.getLogger("hamsterbunker")


class Leaving:
    """The node loop's ways out of a term and out of the loop (``NodeLoop`` sets these)."""

    _id: Identity
    _store: Store
    _keeper: LeaseKeeper
    _calls: NodeCalls
    _sink: EventSink
    _stop: StopRequest
    _notifier: Notifier
    _timing: LeaseTiming
    # A switchover's target's heartbeat, read while the term finishes (_hand_over).
    _target_beats: asyncio.Future[list[Heartbeat]] | None

    def _set_role(self, role: str) -> None:
        raise NotImplementedError

    def _end_term(self) -> None:
        raise NotImplementedError

    async def _hand_over(self, ended: TermEnd) -> None:
        """Hand the lease to the successor an operator chose: its next term written in its
        name, so it leads at once with no write of its own; or, when its heartbeat names
        no session (an older node), released naming it, for it to take at once."""
        emit = self._sink.emit
        target = await self._target(ended.successor)
        held = self._keeper.held
        if held is None or held.epoch != ended.epoch:
            return  # lost meanwhile: nothing of ours to hand over
        failpoint("switchover.before_release")
        if target is not None:
            hand = functools.partial(self._keeper.hand_over, ended.successor, *target)
        else:
            hand = functools.partial(self._keeper.release, ended.successor)
        try:
            if await self._calls.keeper(hand):
                failpoint("switchover.after_release")
                emit("lease.released", via="switchover", to=ended.successor)
        except StoreError as exc:  # not released: it expires a TTL after the last renewal
            emit("store.error", error=f"release: {exc}")
        finally:
            self._sink.unhush()
        self._set_role("standby")

    async def _target(self, node: str) -> tuple[str, str] | None:
        """The session and region the switchover target's heartbeat names, if usable."""
        reading, self._target_beats = self._target_beats, None
        try:
            beats = [] if reading is None else await reading
        except StoreError:
            return None
        for beat in beats:
            if beat.node == node and beat.lease_session:
                return beat.lease_session, beat.region[:64]  # display only; keeps the record small
        return None

    async def _fenced(self, ended: TermEnd) -> None:
        """The store refused a publish of the term: the lease is lost if still held for it."""
        held = self._keeper.held
        if held is not None and held.epoch == ended.epoch:
            result = await self._calls.keeper(self._keeper.abandon, "fenced by the store")
            self._sink.emit("lease.lost", reason=result.reason)
            self._set_role("standby")

    async def _give_up(self, ended: TermEnd) -> None:
        """Release the lease so another node can try, and stand by. With hold_off this node
        takes no free lease for two TTLs (or the term's longer hold-off after failing steps).
        """
        emit = self._sink.emit
        via: dict[str, Any] = {"via": ended.via} if ended.via else {}
        emit("lease.given_up", reason=ended.reason, **via)
        try:
            release = functools.partial(self._keeper.release, handoff=ended.via == "handoff")
            if await self._calls.keeper(release):
                emit("lease.released", **via)
        except StoreError as exc:  # not released: it expires a TTL after the last renewal
            emit("store.error", error=f"release: {exc}")
        if ended.hold_off:
            self._keeper.hold_off(max(2 * self._timing.lease_ttl_s, ended.hold_off_s))
        self._set_role("standby")

    async def _within_budget(
        self, task: asyncio.Future[Any], what: str, extra: float = 0.0
    ) -> bool:
        """Wait for task within the shutdown budget (and extra); False (logged) if it did not end."""
        done, _ = await asyncio.wait([task], timeout=self._stop.budget() + extra)
        if not done:
            log.warning("%s: %s did not end in time during the stop; gave up on it",
                        self._id.node, what)  # fmt: skip
        return bool(done)

    async def _finish_leading(self, leader: asyncio.Task[None]) -> None:
        self._end_term()  # tells the term to cancel the step in flight
        if not await self._within_budget(leader, "the leader's store call"):
            leader.cancel()
        with contextlib.suppress(asyncio.CancelledError, HamsterbunkerError):
            await leader

    async def _shutdown(self, writer: asyncio.Task[None]) -> None:
        """Release the lease, drop the heartbeat, flush the events (graceful stop); each store
        call bounded by the stop's budget.
        """
        emit, budget = self._sink.emit, self._stop.budget
        self._notifier.stopping()
        self._set_role("stopping")
        try:
            if self._keeper.held is not None:
                released = await bounded(self._calls.keeper(self._keeper.release), budget())
                if released:
                    emit("lease.released")
            await bounded(
                self._calls.io(self._store.remove_heartbeat, self._id.agent, self._id.node),
                budget(),
            )
        except StoreError as exc:
            emit("store.error", error=str(exc))
        emit("node.offline")
        await self._sink.flush(budget())
        writer.cancel()
