"""Lease keeping: acquire, renew, release, judged on the local monotonic clock
(``docs/design.md``, "Lease keeping"). Every method but ``may_step`` calls the store and
blocks (the runtime runs them in a thread, one at a time); ``may_step`` reads only the clock.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.errors import LeaseConflict, StoreError, UnreadableLease
from ..records import LeaseRecord, Takeover
from ..stores.base import Fence
from .handover import Handing, previous_holder, released_via, with_takeover
from .outcome import Outcome, TickResult
from .replacing import Replacing
from .unreadable import waited_ttl_s

__all__ = ["LeaseKeeper"]


class LeaseKeeper(Handing, Replacing):
    """One node's view of one agent's lease: acquire, renew, release (see the module)."""

    def may_step(self) -> bool:
        """True while we hold the lease and our last renewal was sent within the deadline."""
        return self.held is not None and self._since_renewal() < self.timing.renew_deadline_s

    def fence(self) -> Fence:
        if self.held is None:
            raise LeaseConflict("this node does not hold the lease")
        return Fence(holder=self.node, session=self.session, epoch=self.held.epoch)

    def seconds_until_expiry(self) -> float | None:
        """How long until the lease another node holds (or an unreadable record) counts as
        expired here, for a standby to wake then; None when there is nothing to wait for."""
        record = self.observed
        if self.held is None and record is None:
            ttl_s = waited_ttl_s(self.timing, self._last_seen)
            return self.unreadable.seconds_left(self.clock.monotonic(), ttl_s)
        if self.held is not None or record is None:
            return None
        if record.holder is None and self._proven(record):
            return None
        return max(0.0, self._ttl_of(record) - (self.clock.monotonic() - self._observed_at))

    def seconds_until_deadline(self) -> float:
        return max(0.0, self.timing.renew_deadline_s - self._since_renewal())

    def seconds_since_renewal(self) -> float:
        """Since the last successful renewal (or the acquisition) was sent, on our clock."""
        return self._since_renewal()

    def tick(self, heard: LeaseRecord | None = None) -> TickResult:
        """Renew if leading, else observe the record and acquire it when free or expired.
        heard: the record the store's watch carried, if any (taken for a read if news)."""
        if self.held is not None:
            return self._renew()
        return self._observe_or_acquire(heard)

    def _renew(self) -> TickResult:
        """Renew by compare-and-set, even past the renew deadline (a renewal that succeeds
        proves nobody took over)."""
        assert self.held is not None
        sent = self.clock.monotonic()
        try:
            renewed = self.store.cas_lease(
                self.agent,
                self.held.version,
                self._signed(self._next_write(self.held)),
            )
        except LeaseConflict:
            try:
                current = self.store.read_lease(self.agent)
            except UnreadableLease as exc:
                return self._lose_to_unreadable(exc)
            if current is not None and self._is_ours(current) and current.epoch == self.held.epoch:
                # Our previous renewal landed although its answer was lost, or the
                # store went back within our term (reported by _note): either way
                # nobody else has written under our epoch, so adopt the record.
                self._note(current, self.clock.monotonic())
                self.held = current
                return TickResult(Outcome.RENEWED, current)
            self._note(current, self.clock.monotonic())
            return self._lose("the lease record was changed by another node")
        except UnreadableLease as exc:
            return self._lose_to_unreadable(exc)
        except StoreError as exc:
            if self._since_renewal() >= self.timing.lease_ttl_s:
                # A standby may have taken over by now: judge afresh, as a standby.
                lost = self._lose(
                    f"no renewal for a full TTL ({self.timing.lease_ttl_ms} ms): {exc}"
                )
                return replace(lost, store_error=str(exc))
            return TickResult(Outcome.RENEW_FAILED, self.held, str(exc), store_error=str(exc))
        self.held = renewed
        self._renew_sent_at = sent
        self.unconfirmed = False
        self._note(renewed, sent)
        return TickResult(Outcome.RENEWED, renewed)

    def _observe_or_acquire(self, heard: LeaseRecord | None) -> TickResult:
        if heard is None and self._expired_as_seen():
            # Taken on the version seen, with no read first: the compare-and-set fails if
            # the record changed since, and the read below then tells how.
            taken = self._acquire(self.observed, "expired")
            if taken.outcome is Outcome.ACQUIRED:
                return taken
        try:
            record = self._read_unless_heard(heard)
        except UnreadableLease as exc:
            return self._replace_unreadable(exc)
        now = self.clock.monotonic()
        if record is not None and self._handed_to_us(record):
            return self._adopt_handed(record, now)
        self._note(record, now)
        via = self._free_as(record, now)
        if via is None:
            unproven = record is not None and not self._proven(record)
            reason = "the lease record is unproven" if unproven else ""
            return TickResult(Outcome.STANDBY, record, reason)
        if now < self._hold_off_until and via != "switchover":
            return TickResult(Outcome.STANDBY, record, "holding off after giving the lease up")
        return self._acquire(record, via)

    def _read_unless_heard(self, heard: LeaseRecord | None) -> LeaseRecord | None:
        """The record the watch carried if it is news and asks nothing new, else read
        (UnreadableLease if it does not parse)."""
        if heard is not None and self._is_news(heard) and not self._asks_anew(heard):
            return heard
        sent = self.clock.monotonic()
        record = self.store.read_lease(self.agent)
        if record is not None and not self._is_ours(record):
            self._read_before = (record.version, sent)
        return record

    def _expired_as_seen(self) -> bool:
        """Whether the record seen last, proven and held by a node, stood still for its TTL
        (and this node may take a lease now)."""
        record, now = self.observed, self.clock.monotonic()
        return (
            record is not None
            and record.holder is not None
            and self._proven(record)
            and now - self._observed_at >= self._ttl_of(record)
            and now >= self._hold_off_until
        )

    def _free_as(self, record: LeaseRecord | None, now: float) -> str | None:
        """How this standby may take record now (the takeover's ``via``); None if it may not."""
        if record is None:
            return "empty"  # a new cluster, or a lease record that was lost
        stood_still = now - self._observed_at >= self._ttl_of(record)
        if not self._proven(record):
            # Nobody known holds it: taken once it stood still for our own TTL.
            return "expired" if stood_still else None
        if record.holder is None and record.successor == self.node:
            return "switchover"  # handed to us: take it at once
        if record.holder is None and (record.successor is None or stood_still):
            # Handed to another node, which has not taken it for a full TTL: anyone may.
            return released_via(record)
        if record.holder is not None and stood_still:
            return "expired"
        return None

    def _acquire(self, record: LeaseRecord | None, via: str) -> TickResult:
        """Take the lease by compare-and-set at an epoch above every one known."""
        epoch = self._next_epoch(record)
        sent, wall = self.clock.monotonic(), self.wall()
        takeover = Takeover(
            epoch=epoch,
            to=self.node,
            via=via,
            gap_ms=self._leader_writes.gap_ms(record, sent, wall),
            time=wall,
            from_=previous_holder(record),
        )
        reach = self.reach()
        new = LeaseRecord(
            holder=self.node,
            region=self.region,
            session=self.session,
            epoch=epoch,
            ttl_ms=self.timing.lease_ttl_ms,
            seq=reach.seq,
            seq_epoch=reach.epoch,
            # An operator's request (a pause) holds from term to term.
            control=self._carry_control("" if record is None else record.control),
            history=with_takeover(record, takeover),
            written=wall,
        )
        expected = None if record is None else record.version
        try:
            acquired, read = self.store.take_lease(self.agent, expected, self._signed(new))
        except LeaseConflict:
            return TickResult(Outcome.STANDBY, record, "another node acquired it first")
        self._taken_read = None if read is None else (acquired.epoch, read)
        self._hold(acquired)
        if record is not None and not self._proven(record):
            self._replaced_at = acquired.epoch  # numbered above only what this node knew
        self._renew_sent_at = sent
        self._note(acquired, sent)
        return TickResult(Outcome.ACQUIRED, acquired, via)

    def changed_under_us(self, heard: LeaseRecord | None = None) -> LeaseRecord | None:
        """The lease record if another writer changed it since our last write, else None,
        for a leader woken by the store's watch (heard: the record it carried, if any). One
        still of our term (an operator's request written into it) is adopted."""
        held = self.held
        if held is None or (heard is not None and heard.version <= held.version):
            return None  # our own write, or one before it
        record = heard if heard is not None else self.store.read_lease(self.agent)
        if record is not None and record.version == held.version:
            return None
        if record is not None and self._is_ours(record) and record.epoch == held.epoch:
            self._note(record, self.clock.monotonic())
            self.held = record
        return record

    def abandon(self, reason: str) -> TickResult:
        """Stop leading without touching the store (for example after being fenced)."""
        return self._lose(reason)
