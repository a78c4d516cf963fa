"""Lease keeping: acquire, renew, release, judged on the local monotonic clock.

This is the elector of Kubernetes' leaderelection, over the store contract:

* A standby judges the lease expired only after a full TTL in which it saw no
  change of the lease record, timed on its own monotonic clock. It never
  compares another node's clock with its own.
* The leader may step only while less than ``renew_deadline`` has passed since
  it *sent* its last successful renewal (``may_step``). Past the deadline it
  keeps trying to renew; it has lost the lease when the record changed under
  it, or when a full TTL passed without a renewal.
* Every acquisition writes epoch + 1 by compare-and-set, so every epoch has
  exactly one holder; the store fences checkpoint writes by that epoch.
* Epochs and reach are learned only from records whose proof opens
  (``hamsterbunker.lease_proof``, once the runtime sets ``proof``); a record
  whose proof does not open counts as held by nobody known: it is taken over
  once it stood still for this node's own TTL, above every epoch known.

Every method is blocking (it calls the store); the runtime runs them in a
thread, one at a time. ``may_step`` reads only the clock and may be called from
anywhere at any time, even while a store call hangs.
"""

from __future__ import annotations

import enum
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from .clock import Clock, MonotonicClock
from .errors import LeaseConflict, StoreError, UnreadableLease
from .lease_proof import LeaseProof
from .lease_unreadable import UnreadableWait, replacement, waited_ttl_s
from .limits import MAX_EPOCH
from .reach import Reach
from .records import MAX_HISTORY, LeaseRecord, Takeover
from .stores.base import Fence, RestoreRead, Store
from .timing import DEFAULT_TIMING, LeaseTiming

__all__ = ["LeaseKeeper", "Outcome", "TickResult"]


class Outcome(enum.Enum):
    STANDBY = "standby"  # someone else holds a live lease
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RENEW_FAILED = "renew_failed"  # the store did not answer; still leading until the deadline
    LOST = "lost"


@dataclass(frozen=True)
class TickResult:
    outcome: Outcome
    record: LeaseRecord | None
    reason: str = ""
    store_error: str = ""  # why the store did not answer this tick, if it did not
    replaced: str = ""  # for an acquisition that replaced an unreadable record: what it was


class LeaseKeeper:
    """One node's view of one agent's lease."""

    def __init__(
        self,
        store: Store,
        agent: str,
        node: str,
        region: str,
        *,
        timing: LeaseTiming = DEFAULT_TIMING,
        clock: Clock | None = None,
    ) -> None:
        self.store, self.agent, self.node, self.region = store, agent, node, region
        self.timing = timing
        self.clock = clock or MonotonicClock()
        self.session = secrets.token_hex(8)  # tells this process from an earlier one of the node
        self.observed: LeaseRecord | None = None
        # While the record read is unreadable (observed is None then): what, since when.
        self.unreadable = UnreadableWait()
        self.highest_epoch = 0  # the highest epoch this keeper has seen in any record
        self.seen_reach = Reach()  # the furthest reach named by any record seen
        # The newest checkpoint this node saw accepted (learn_published): written
        # into every record this node writes, so standbys learn it too.
        self.published = Reach()
        # What went back in time since the runtime last asked (see drain_regressions).
        self._regressions: list[str] = []
        self._last_regression = ""
        self.held: LeaseRecord | None = None
        self._observed_key: tuple[int, int, str, int] | None = None
        self._last_seen: LeaseRecord | None = None  # to tell a term's record going back
        self._observed_at = 0.0
        self._renew_sent_at = 0.0
        self._hold_off_until = float("-inf")
        # What a restore reads first, as the store was when this keeper took the lease
        # (Store.take_lease), kept for that term's restore: see read_at_taking.
        self._taken_read: tuple[int, RestoreRead] | None = None
        # A lease handed to this node (a switchover) starts no later than the send time
        # of a read that still found the record before it: (that record's version, sent).
        self._read_before: tuple[int, float] | None = None
        self._held_epoch = 0  # the highest epoch this keeper has held
        # The epoch of its latest term taken in place of an unreadable or unproven record.
        self._replaced_at = 0
        # Held since a read before its hand-over, not since a write of ours: renew at once.
        self.unconfirmed = False
        self._carry_control: Callable[[str], str] = _as_found
        # Signs every record written, and tells which records read to learn from: set
        # by the runtime once the secret opened the cluster record (None: trust all).
        self.proof: LeaseProof | None = None

    def carry_control_by(self, carry: Callable[[str], str]) -> None:
        """Write carry(the control field found) into every lease record this keeper writes
        over another (``ControlView.carried``: an operator's request older than one this
        node saw is not passed on). By default the field found is carried as it is."""
        self._carry_control = carry

    # -- what the runtime asks -------------------------------------------

    def may_step(self) -> bool:
        """True while we hold the lease and our last renewal was sent within the deadline."""
        return self.held is not None and self._since_renewal() < self.timing.renew_deadline_s

    def fence(self) -> Fence:
        if self.held is None:
            raise LeaseConflict("this node does not hold the lease")
        return Fence(holder=self.node, session=self.session, epoch=self.held.epoch)

    def seconds_until_expiry(self) -> float | None:
        """How long until the lease another node holds counts as expired here.

        None when there is nothing to wait for (we hold it, it is released, or
        no record was seen). A standby wakes then, not at its next tick, so a
        takeover comes one TTL after the last change it saw, not up to a tick later.
        """
        record = self.observed
        if self.held is None and record is None:
            ttl_s = waited_ttl_s(self.timing, self._last_seen)
            return self.unreadable.seconds_left(self.clock.monotonic(), ttl_s)
        if self.held is not None or record is None:
            return None
        if record.holder is None and self._proven(record):
            return None
        return max(0.0, self._ttl_of(record) - (self.clock.monotonic() - self._observed_at))

    def reach(self) -> Reach:
        """How far the store's checkpoints are known to have reached: never less, if intact."""
        return self.seen_reach.union(self.published)

    def seconds_until_deadline(self) -> float:
        return max(0.0, self.timing.renew_deadline_s - self._since_renewal())

    def seconds_since_renewal(self) -> float:
        """Since the last successful renewal (or the acquisition) was sent, on our clock."""
        return self._since_renewal()

    # -- one tick ----------------------------------------------------------

    def tick(self, heard: LeaseRecord | None = None) -> TickResult:
        """Renew if leading, else observe the record and acquire it when free or expired.

        heard: the record the store's watch carried, if any: a standby takes it for
        the read it would make, if it is newer than any record seen here.
        """
        if self.held is not None:
            return self._renew()
        return self._observe_or_acquire(heard)

    def _renew(self) -> TickResult:
        """Renew by compare-and-set, even past the renew deadline.

        Past the deadline the leader does not step (``may_step``), but a renewal
        that still succeeds proves nobody took over, so a short pause or store
        hiccup costs no epoch. The compare-and-set is the arbiter, not the time.
        """
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
        if heard is not None and self._is_news(heard) and not self._asks_anew(heard):
            record: LeaseRecord | None = heard
        else:
            sent = self.clock.monotonic()
            try:
                record = self.store.read_lease(self.agent)
            except UnreadableLease as exc:
                return self._replace_unreadable(exc)
            if record is not None and not self._is_ours(record):
                self._read_before = (record.version, sent)
        now = self.clock.monotonic()
        if record is not None and self._handed_to_us(record):
            return self._adopt_handed(record, now)
        self._note(record, now)
        stood_still = record is not None and now - self._observed_at >= self._ttl_of(record)
        if record is None:
            expected, via = None, "empty"  # a new cluster, or a lease record that was lost
        elif not self._proven(record):
            # Nobody known holds it: taken once it stood still for our own TTL.
            if not stood_still:
                return TickResult(Outcome.STANDBY, record, "the lease record is unproven")
            expected, via = record.version, "expired"
        elif record.holder is None and record.successor == self.node:
            expected, via = record.version, "switchover"  # handed to us: take it at once
        elif record.holder is None and (record.successor is None or stood_still):
            # Handed to another node, which has not taken it for a full TTL: anyone may.
            expected, via = record.version, _released_via(record)
        elif record.holder is not None and stood_still:
            expected, via = record.version, "expired"
        else:
            return TickResult(Outcome.STANDBY, record)
        if now < self._hold_off_until and via != "switchover":
            return TickResult(Outcome.STANDBY, record, "holding off after giving the lease up")
        epoch = self._next_epoch(record)
        takeover = Takeover(
            epoch=epoch,
            to=self.node,
            via=via,
            # Since the record last changed, as seen here: a TTL when it expired.
            gap_ms=0 if record is None else round((now - self._observed_at) * 1000),
            time=time.time(),
            from_=_previous_holder(record),
        )
        sent = self.clock.monotonic()
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
            history=_with_takeover(record, takeover),
        )
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

    def read_at_taking(self, epoch: int) -> RestoreRead | None:
        """What the store held as this keeper took the lease for epoch (once; None if it
        was not read then): the term's first restore needs no read of its own.

        Nothing can be written between the acquisition and that read but by the
        new holder: older terms are fenced off by the same write.
        """
        taken, self._taken_read = self._taken_read, None
        return taken[1] if taken is not None and taken[0] == epoch else None

    def _replace_unreadable(self, found: UnreadableLease) -> TickResult:
        """Stand by while the lease record is unreadable; replace it once it stood unchanged
        for a TTL (hamsterbunker.lease_unreadable), under an epoch above every one known."""
        now = self.clock.monotonic()
        self.observed = None
        sighting = self.unreadable.see(found, now)
        problem = f"the lease record is unreadable: {found}"
        if self.unreadable.seconds_left(now, waited_ttl_s(self.timing, self._last_seen)):
            return TickResult(Outcome.STANDBY, None, problem, store_error=problem)
        if now < self._hold_off_until:
            reason = "holding off after giving the lease up"
            return TickResult(Outcome.STANDBY, None, reason, store_error=problem)
        new = replacement(
            node=self.node,
            region=self.region,
            session=self.session,
            epoch=self._next_epoch(None),
            timing=self.timing,
            reach=self.reach(),
            last_readable=self._last_seen,
            waited_s=now - sighting.since,
        )
        sent = self.clock.monotonic()
        try:
            acquired = self.store.replace_unreadable_lease(
                self.agent, found.found, self._signed(new)
            )
        except LeaseConflict:
            reason = "the unreadable lease record changed before it was replaced"
            return TickResult(Outcome.STANDBY, None, reason, store_error=problem)
        self._taken_read = None
        self._hold(acquired)
        self._replaced_at = acquired.epoch
        self._renew_sent_at = sent
        self._note(acquired, sent)
        return TickResult(Outcome.ACQUIRED, acquired, "expired", replaced=sighting.what)

    def replaced_unreadable(self, epoch: int) -> bool:
        """Whether this keeper took epoch in place of an unreadable or unproven record:
        numbered above only what it knew, so an authenticated checkpoint at or above it is
        no regression."""
        return epoch == self._replaced_at

    def _lose_to_unreadable(self, found: UnreadableLease) -> TickResult:
        """Our record was replaced by one nobody can read: nobody can renew it, so stop
        now and time it as every standby does (it is replaced a TTL later)."""
        lost = self._lose(f"the lease record was replaced by one that cannot be read: {found}")
        self.observed = None
        self.unreadable.see(found, self.clock.monotonic())
        return lost

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
        """Lead under a lease handed to this node, with no write of its own.

        The lease counts from the send time of the newest read that still found the
        record before it (the hand-over was written after that read was answered),
        so may_step ends no later than for a lease this node had written then. With
        no such read (or one older than half the renew deadline, or another TTL in
        the record), a renewal comes first, as after any acquisition; with one,
        ``unconfirmed`` asks the loop to renew at once, beside the restore.
        """
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
        """Give the lease to successor, its next term already written in its name (the
        session its heartbeat names): it leads without a write of its own (a switchover).
        True if the store took it; the fence moves with the record.
        """
        held, self.held = self.held, None
        if held is None:
            return False
        epoch = self._next_epoch(held)
        takeover = Takeover(
            epoch=epoch, to=successor, via="switchover", gap_ms=0, time=time.time(), from_=self.node
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
            history=_with_takeover(held, takeover),
        )
        try:
            record = self.store.cas_lease(self.agent, held.version, self._signed(handed))
        except LeaseConflict:
            return False
        self._note(record, self.clock.monotonic())
        return True

    def release(self, successor: str | None = None, *, handoff: bool = False) -> bool:
        """Give the lease up at once (graceful stop; to successor on a switchover; handoff
        after failing steps). True if the store took the release.
        """
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

    def changed_under_us(self, heard: LeaseRecord | None = None) -> LeaseRecord | None:
        """The lease record if another writer changed it since our last write, else None.

        For a leader woken by the store's watch (heard: the record it carried, if
        any, read otherwise). A record still of our term (an operator's request
        written into it) is adopted, as a renewal that finds it would: the next
        renewal builds on it. If another node took over, the next renewal finds
        out and loses the lease.
        """
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

    # -- helpers -----------------------------------------------------------

    def _lose(self, reason: str) -> TickResult:
        lost, self.held = self.held, None
        # Our own stale record now counts as anyone's: wait a full TTL like every standby.
        self._observed_key = None
        self._note(self.observed, self.clock.monotonic())
        return TickResult(Outcome.LOST, lost, reason)

    def drain_unproven(self) -> list[str]:
        """Lease records whose proof did not open since the last call (for lease.unproven)."""
        return [] if self.proof is None else self.proof.drain_problems()

    def drain_regressions(self) -> list[str]:
        """What this keeper saw go back in time since the last call (for store.regressed)."""
        found, self._regressions = self._regressions, []
        return found

    def _next_epoch(self, record: LeaseRecord | None) -> int:
        """Above every epoch seen: in the record, in earlier records, in authenticated checkpoints.

        A store restored from an old snapshot (or a Redis that lost writes) can
        show a lease record behind what nodes have seen; taking record.epoch + 1
        then would reuse an epoch. Checkpoint *names* are not counted: anyone can
        write one, so only epochs the runtime authenticated (``learn_epoch``) are.
        An unproven record's epoch is gone above only while half the epochs stay
        free, so that no write without the secret leaves no epoch to take.
        """
        current = 0 if record is None else record.epoch
        if record is not None and not self._proven(record) and current > MAX_EPOCH // 2:
            current = 0
        epoch = max(current, self.highest_epoch, self.reach().epoch) + 1
        if epoch > MAX_EPOCH:
            raise StoreError(
                f"no epoch is left to take: the lease of {self.agent!r} is at epoch {epoch - 1}, "
                f"the most there can be is {MAX_EPOCH} (a lease record written by someone else?)"
            )
        return epoch

    def remember(self, epoch: int, reach: Reach) -> None:
        """What this node remembered of the store from before a restart (hamsterbunker.memory)."""
        self.highest_epoch = max(self.highest_epoch, epoch)
        self.seen_reach = self.seen_reach.union(reach)

    def learn_published(self, reach: Reach) -> None:
        """A checkpoint this node saw accepted (or resumed from): named in every record it writes."""
        self.published = reach

    def learn_epoch(self, epoch: int) -> None:
        """An authenticated checkpoint named this epoch: take the next lease above it."""
        self.highest_epoch = max(self.highest_epoch, epoch)

    def accept_loss(self, resume: Reach) -> None:
        """A loss accepted with ``hb accept-loss``: the store needs to reach only resume now."""
        self.seen_reach = self.published = resume

    def hold_off(self, seconds: float) -> None:
        """Take no free lease for this long (after giving it up, so another node can try)."""
        self._hold_off_until = self.clock.monotonic() + seconds

    def _regressed(self, what: str) -> None:
        # Once per state of affairs, not on every tick that still sees it.
        if what != self._last_regression:
            self._last_regression = what
            self._regressions.append(what)

    def _next_write(self, record: LeaseRecord) -> LeaseRecord:
        """record renewed once more, naming how far the checkpoints are known to reach."""
        reach = self.reach()
        return replace(
            record,
            renewals=record.renewals + 1,
            seq=reach.seq,
            seq_epoch=reach.epoch,
            ttl_ms=self.timing.lease_ttl_ms,  # ours, also in a term handed to us
            control=self._carry_control(record.control),
        )

    def _signed(self, record: LeaseRecord) -> LeaseRecord:
        return record if self.proof is None else self.proof.signed(record)

    def _proven(self, record: LeaseRecord) -> bool:
        return self.proof is None or self.proof.proves(record)

    def _ttl_of(self, record: LeaseRecord) -> float:
        """How long record must stand still to count as expired here, in seconds: the longer
        of our TTL and its holder's, but only ours for a record without a proof."""
        ttl_ms = self.timing.lease_ttl_ms
        return max(ttl_ms, record.ttl_ms) / 1000 if self._proven(record) else ttl_ms / 1000

    def _hold(self, record: LeaseRecord) -> None:
        self.held = record
        self.unconfirmed = False
        self._held_epoch = max(self._held_epoch, record.epoch)

    def _is_news(self, heard: LeaseRecord | None) -> bool:
        """Whether a record the watch carried is the newest seen here (else read: an
        older one would look like the store going back)."""
        last = self._last_seen
        return heard is not None and (last is None or heard.version >= last.version)

    def _asks_anew(self, heard: LeaseRecord) -> bool:
        """Whether heard carries an operator's request not seen before: read instead, so
        that a switchover's target has a read from before the hand-over to count from."""
        last = self._last_seen
        return last is not None and heard.control != last.control

    def _is_ours(self, record: LeaseRecord) -> bool:
        return record.holder == self.node and record.session == self.session

    def _note(self, record: LeaseRecord | None, now: float) -> None:
        """Remember when the record last changed, as seen on our own clock."""
        self.observed = record
        self.unreadable.clear()
        if record is not None and not self._proven(record):
            # Nothing is learned from it; any change of it still counts as a change.
            unproven = (record.version, 0, "", -1)
            if unproven != self._observed_key:
                self._observed_key, self._observed_at = unproven, now
            return
        if record is None and self.highest_epoch > 0:
            self._regressed(f"the lease record is gone (epoch {self.highest_epoch} was seen)")
        elif record is not None and record.epoch < self.highest_epoch:
            self._regressed(
                f"the lease record went back from epoch {self.highest_epoch} to {record.epoch}"
            )
        elif record is not None and _same_term(record, self._last_seen):
            assert self._last_seen is not None
            if record.renewals < self._last_seen.renewals or record.seq < self._last_seen.seq:
                self._regressed(
                    f"the lease record of epoch {record.epoch} went back from renewal "
                    f"{self._last_seen.renewals} (seq {self._last_seen.seq}) to "
                    f"{record.renewals} (seq {record.seq})"
                )
        if record is not None:
            self.highest_epoch = max(self.highest_epoch, record.epoch)
            self.seen_reach = self.seen_reach.union(Reach(record.seq, record.seq_epoch))
            self._last_seen = record
        if record is None:
            key = None
        elif record.epoch < self.highest_epoch:
            # A term already superseded, back only because the store went back: its
            # old holder's renewals must not keep it alive, or that holder would step
            # on forever from behind what its successor published.
            key = (0, record.epoch, record.session, 0)
        else:
            key = (record.version, record.epoch, record.session, record.renewals)
        if key != self._observed_key:
            self._observed_key = key
            self._observed_at = now

    def _since_renewal(self) -> float:
        return self.clock.monotonic() - self._renew_sent_at


def _as_found(control: str) -> str:
    return control


def _released_via(record: LeaseRecord) -> str:
    """How a released record came to be free for anyone."""
    if record.successor is not None:
        return "expired"  # handed to a node that did not take it within a TTL
    return "handoff" if record.handoff else "released"


def _previous_holder(record: LeaseRecord | None) -> str | None:
    """Who held the lease before: the holder, or for a released record its last taker."""
    if record is None:
        return None
    if record.holder is not None:
        return record.holder
    return record.history[-1].to if record.history else None


def _with_takeover(record: LeaseRecord | None, takeover: Takeover) -> tuple[Takeover, ...]:
    """The record's history and takeover, the newest MAX_HISTORY."""
    earlier = () if record is None else record.history
    return (*earlier, takeover)[-MAX_HISTORY:]


def _same_term(record: LeaseRecord, earlier: LeaseRecord | None) -> bool:
    """Whether both records were written by one process under one epoch."""
    return (
        earlier is not None and record.epoch == earlier.epoch and record.session == earlier.session
    )
