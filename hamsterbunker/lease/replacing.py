"""The keeper's take of a lease record nobody can read (``unreadable``), and its loss of
the lease to one."""

from __future__ import annotations

from ..core.errors import LeaseConflict, UnreadableLease
from .outcome import Outcome, TickResult
from .state import KeeperState
from .unreadable import replacement, waited_ttl_s

__all__ = ["Replacing"]


class Replacing(KeeperState):
    """The keeper's take of an unreadable record, and its loss to one."""

    def _replace_unreadable(self, found: UnreadableLease) -> TickResult:
        """Stand by while the lease record is unreadable; replace it once it stood unchanged
        for a TTL, under an epoch above every one known."""
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
            wall=self.wall(),
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

    def _lose_to_unreadable(self, found: UnreadableLease) -> TickResult:
        """Our record was replaced by one nobody can read: nobody can renew it, so stop
        now and time it as every standby does (it is replaced a TTL later)."""
        lost = self._lose(f"the lease record was replaced by one that cannot be read: {found}")
        self.observed = None
        self.unreadable.see(found, self.clock.monotonic())
        return lost
