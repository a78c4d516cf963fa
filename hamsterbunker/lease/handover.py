"""A lease handed over (a switchover) or released; one handed to this node, led."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from ..core.errors import LeaseConflict
from ..core.reach import Reach
from ..records import MAX_HISTORY, LeaseRecord, Takeover
from .outcome import Outcome, TickResult
from .state import KeeperState

__all__ = ["Handing", "previous_holder", "released_via", "with_takeover"]

T = TypeVar("T")


class Handing(KeeperState):
    """The keeper's hand-overs and releases."""

    def _renew(self) -> TickResult:
        raise NotImplementedError

    def _handed_to_us(self, record: LeaseRecord) -> bool:
        """Whether record is a term of ours that this keeper did not take itself: the
        previous holder wrote it for us (hand_over)."""
        return (
            self.held is None
            and self._is_ours(record)
            and record.epoch > self._held_epoch
            and self._proven(record)  # a session is no secret: heartbeats name it
        )

    def _adopt_handed(self, record: LeaseRecord, now: float) -> TickResult:
        """Lead under a lease handed to this node, counted from the send time of the newest
        read that still found the record before it; with no such read (or one older than half
        the renew deadline, or another TTL in the record) after a renewal. ``unconfirmed``
        asks the loop to renew at once, beside the restore."""
        self._note(record, now)
        self._hold(record)
        self._taken_read = None
        before = self._read_before
        start = before[1] if before is not None and before[0] < record.version else -math.inf
        stepping_left = self.timing.renew_deadline_s - (now - start)
        if (
            stepping_left < self.timing.renew_deadline_s / 2
            or record.ttl_ms != self.timing.lease_ttl_ms
        ):
            renewed = self._renew()
            if renewed.outcome is not Outcome.RENEWED or renewed.record is None:
                self.held = None
                reason = f"handed the lease, could not renew it: {renewed.reason}"
                return TickResult(Outcome.STANDBY, record, reason)
            record = renewed.record
        else:
            self._renew_sent_at = start
            self.unconfirmed = True
        return TickResult(Outcome.ACQUIRED, record, "switchover")

    def hand_over(self, successor: str, session: str, region: str) -> bool:
        """Give the lease to successor (a switchover), its next term written in its name and
        the session its heartbeat names. True if the store took it."""
        held, self.held = self.held, None
        if held is None:
            return False
        epoch = self._next_epoch(held)
        # No gap (lease.gap): this write ends our term and starts the successor's.
        takeover = Takeover(
            epoch=epoch, to=successor, via="switchover", gap_ms=0, time=self.wall(), from_=self.node
        )
        handed = replace(
            self._next_write(held),
            holder=successor,
            session=session,
            region=region,
            epoch=epoch,
            renewals=0,
            successor=None,
            handoff=False,
            history=with_takeover(held, takeover),
        )
        try:
            record = self.store.cas_lease(self.agent, held.version, self._signed(handed))
        except LeaseConflict:
            return False
        self._note(record, self.clock.monotonic())
        return True

    def release_with(
        self, write: Callable[[int, LeaseRecord], tuple[T, LeaseRecord | None]], reach: Reach
    ) -> tuple[T, bool]:
        """Give the lease up (a graceful stop) in the commit of another write: write(the
        version held, the record released, naming reach) returns what it wrote and the
        lease record stored, or None if it did not release (release() then). True if it did."""
        held = self.held
        if held is None:
            raise LeaseConflict("this node does not hold the lease")
        reach = self.reach().union(reach)
        released = replace(
            self._next_write(held), holder=None, successor=None, handoff=False,
            seq=reach.seq, seq_epoch=reach.epoch,
        )  # fmt: skip
        result, record = write(held.version, self._signed(released))
        if record is not None:
            self.held = None
            self._note(record, self.clock.monotonic())
            # A pass of the lease loop may still come before the stop ends it: not taken back.
            self.hold_off(self.timing.lease_ttl_s)
        return result, record is not None

    def release(self, successor: str | None = None, *, handoff: bool = False) -> bool:
        """Give the lease up at once (graceful stop; to successor on a switchover; handoff
        after failing steps). True if the store took the release."""
        held, self.held = self.held, None
        if held is None:
            return False
        released = replace(
            self._next_write(held), holder=None, successor=successor, handoff=handoff
        )
        try:
            record = self.store.cas_lease(self.agent, held.version, self._signed(released))
        except LeaseConflict:
            return False
        self._note(record, self.clock.monotonic())
        return True


def released_via(record: LeaseRecord) -> str:
    """How a released record came to be free for anyone."""
    if record.successor is not None:
        return "expired"  # handed to a node that did not take it within a TTL
    return "handoff" if record.handoff else "released"


def previous_holder(record: LeaseRecord | None) -> str | None:
    """Who held the lease before: the holder, or for a released record its last taker."""
    if record is None:
        return None
    if record.holder is not None:
        return record.holder
    return record.history[-1].to if record.history else None


def with_takeover(record: LeaseRecord | None, takeover: Takeover) -> tuple[Takeover, ...]:
    """The record's history and takeover, the newest MAX_HISTORY."""
    earlier = () if record is None else record.history
    return (*earlier, takeover)[-MAX_HISTORY:]
