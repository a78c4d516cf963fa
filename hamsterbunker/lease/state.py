"""What a lease keeper knows: the record seen and when it last changed, the epochs and
reach learned, the lease held; and the small steps every transition shares."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import replace

from ..core.clock import Clock, MonotonicClock
from ..core.errors import StoreError
from ..core.limits import MAX_EPOCH
from ..core.reach import Reach
from ..core.timing import DEFAULT_TIMING, LeaseTiming
from ..records import LeaseRecord
from ..stores.base import RestoreRead
from ..stores.interface import Store
from .gap import LeaderWrites
from .outcome import Outcome, TickResult
from .proof import LeaseProof
from .unreadable import UnreadableWait

__all__ = ["KeeperState"]


class KeeperState:
    """One node's view of one agent's lease (``LeaseKeeper`` acts on it)."""

    def __init__(
        self,
        store: Store,
        agent: str,
        node: str,
        region: str,
        *,
        timing: LeaseTiming = DEFAULT_TIMING,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.agent, self.node, self.region = store, agent, node, region
        self.timing = timing
        self.clock = clock or MonotonicClock()
        # Written into records for people and for the takeover gap (lease.gap); never judged.
        self.wall = wall
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
        self._leader_writes = LeaderWrites()  # for the takeover gap
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
        """Write carry(the control field found) into every lease record written over another
        (``ControlView.carried``); by default the field found, as it is."""
        self._carry_control = carry

    def reach(self) -> Reach:
        """How far the store's checkpoints are known to have reached: never less, if intact."""
        return self.seen_reach.union(self.published)

    def read_at_taking(self, epoch: int) -> RestoreRead | None:
        """What the store held as this keeper took the lease for epoch (once; None if it
        was not read then), for the term's first restore."""
        taken, self._taken_read = self._taken_read, None
        return taken[1] if taken is not None and taken[0] == epoch else None

    def replaced_unreadable(self, epoch: int) -> bool:
        """Whether this keeper took epoch in place of an unreadable or unproven record (so an
        authenticated checkpoint at or above it is no regression)."""
        return epoch == self._replaced_at

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
        """Above every epoch seen: in the record, in earlier records, in authenticated
        checkpoints (``learn_epoch``); StoreError if none is left."""
        current = 0 if record is None else record.epoch
        # An unproven record's epoch is gone above only while half the epochs stay free.
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
        """What this node remembered of the store from before a restart (``memory``)."""
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
            written=self.wall(),
        )

    def _signed(self, record: LeaseRecord) -> LeaseRecord:
        return record if self.proof is None else self.proof.signed(record)

    def _proven(self, record: LeaseRecord) -> bool:
        return self.proof is None or self.proof.proves(record)

    def _ttl_of(self, record: LeaseRecord) -> float:
        """Seconds record must stand still to count as expired here: the longer of our TTL
        and its holder's, but only ours for a record without a proof."""
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
        self._leader_writes.see(record, now)
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


def _same_term(record: LeaseRecord, earlier: LeaseRecord | None) -> bool:
    """Whether both records were written by one process under one epoch."""
    return (
        earlier is not None and record.epoch == earlier.epoch and record.session == earlier.session
    )
