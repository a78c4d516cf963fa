"""An unreadable lease record, judged as a lease whose holder went silent: replaced once what
is stored stood unchanged for a TTL (``docs/design.md``, "Leases, effects and sealing in the
code"). This module keeps the wait and builds the record; ``Replacing`` acts.
"""

from __future__ import annotations

import secrets
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
    own (file, memory, Redis): above the newest this node saw, by a random step."""
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
    wall: float,
) -> LeaseRecord:
    """The record that replaces an unreadable one: held by node under epoch, its history
    one expiry, the last readable record's operator request carried on. waited_s: since node
    first found it unreadable, the takeover's gap (``lease.gap``); wall: node's wall clock."""
    takeover = Takeover(
        epoch=epoch,
        to=node,
        via="expired",
        gap_ms=round(waited_s * 1000),
        time=wall,
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
        written=wall,
    )
