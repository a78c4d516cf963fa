"""An unreadable lease record, judged as a lease whose holder went silent.

A lease record that does not parse (junk, a number past every bound, a file that
is not one) names no holder, no TTL and no version: nobody can renew it or
compare-and-set against it. If nodes only waited for someone to repair it, one
write would stop the agent for good. So it is judged as a record that stopped
changing is (DESIGN.md invariant 2): once what is stored stood unchanged for a
full TTL on this node's monotonic clock, the node replaces it by a
compare-and-set against what it found (``Store.replace_unreadable_lease``),
under an epoch above every one it knows. Any change of what is stored restarts
the wait: a storm of such writes stalls the agent while it lasts, one write for
a TTL.

The TTL is the longer of this node's and the one in the newest readable record
it saw, as for an expiry: a holder with a longer TTL that cannot renew (its
record is junk now) stops stepping within its own renew deadline of its last
renewal, which came before the junk this node has been timing.

This module keeps the wait, builds the record and acts (``Replacing``, a part of
``LeaseKeeper``).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from ..core.errors import UnreadableLease
from ..core.reach import Reach
from ..core.timing import LeaseTiming
from ..records import LeaseRecord, Takeover

__all__ = ["UnreadableWait", "fresh_version", "replacement"]

# A replacement's version is this much above the newest seen, at most (fresh_version).
_VERSION_SPREAD = 2**32


@dataclass(frozen=True)
class Sighting:
    """What was found in place of the lease record, and since when (our monotonic clock)."""

    found: str  # UnreadableLease.found: the same while what is stored stays the same
    what: str  # why it does not parse, for events and status
    since: float


class UnreadableWait:
    """How long the lease record has been the same unreadable thing, as seen here."""

    def __init__(self) -> None:
        self.sighting: Sighting | None = None

    def see(self, found: UnreadableLease, now: float) -> Sighting:
        """found was read at now: the wait goes on if it is what was read before, else restarts."""
        seen = self.sighting
        if seen is None or seen.found != found.found:
            seen = self.sighting = Sighting(found.found, str(found), now)
        return seen

    def clear(self) -> None:
        """A readable record (or none) was read: the next unreadable one starts a new wait."""
        self.sighting = None

    def seconds_left(self, now: float, ttl_s: float) -> float | None:
        """Until the record may be replaced (0: now); None if no unreadable record is seen."""
        seen = self.sighting
        return None if seen is None else max(0.0, ttl_s - (now - seen.since))


def waited_ttl_s(timing: LeaseTiming, last_readable: LeaseRecord | None) -> float:
    """The TTL an unreadable record must stand for: ours, or the last readable record's."""
    last_ttl_ms = 0 if last_readable is None else last_readable.ttl_ms
    return max(timing.lease_ttl_ms, last_ttl_ms) / 1000


def fresh_version(last_readable: LeaseRecord | None) -> int:
    """A version for a record that replaces an unreadable one, where records carry their
    own version (file, memory, Redis; etcd numbers its own).

    Above the newest this node saw, so that its watch takes the new record for news.
    But an old holder paused since before the junk may still hold a version this
    node never saw, and retry a renewal against it: a new line of versions from
    a fixed start could reach that version and let the renewal through. A random
    start makes that a one-in-2**32 chance.
    """
    last = 0 if last_readable is None else last_readable.version
    return last + 1 + secrets.randbelow(_VERSION_SPREAD)


def replacement(
    *,
    node: str,
    region: str,
    session: str,
    epoch: int,
    timing: LeaseTiming,
    reach: Reach,
    last_readable: LeaseRecord | None,
    waited_s: float,
) -> LeaseRecord:
    """The record that replaces an unreadable one: held by node under epoch, history anew.

    An operator's request in the last readable record holds on, as it does from
    term to term: junk must not lift a pause. Its takeover is an expiry (what
    was found went silent for a TTL); the event ``lease.replaced_unreadable`` says more.
    """
    takeover = Takeover(
        epoch=epoch,
        to=node,
        via="expired",
        gap_ms=round(waited_s * 1000),
        time=time.time(),
        from_=None,  # nobody readable
    )
    return LeaseRecord(
        holder=node,
        region=region,
        session=session,
        epoch=epoch,
        ttl_ms=timing.lease_ttl_ms,
        version=fresh_version(last_readable),
        seq=reach.seq,
        seq_epoch=reach.epoch,
        control="" if last_readable is None else last_readable.control,
        history=(takeover,),
    )
