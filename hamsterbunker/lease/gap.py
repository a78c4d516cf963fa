"""The takeover gap: how long the agent had no leader able to step, as its taker judges it.

The taker writes it into the lease record's history (``Takeover.gap_ms``) with its acquiring
compare-and-set; ``hb history``, the ``lease.acquired`` event and ``hb-tui`` show that number
and compute none of their own. It runs

    from the previous leader's last write of the lease record (its last renewal, or its
    release) to the sending of the taker's acquiring write.

- ``expired``: from the old leader's last renewal. A leader that died did so within a tick of
  it; one cut off from the store but alive may step on until its renew deadline after it, so
  for that case the gap overstates by at most the renew deadline (0.6 × TTL by default).
- ``released``, ``handoff``: from the release (a leader stops stepping before it releases).
- ``switchover``: 0. The old leader writes its successor's term in the very write that ends its
  own, and the successor counts its term from a read before that write.
- ``empty``: 0: with no record, no earlier leader is known.
- An unreadable record replaced: from when the taker first found it unreadable (no time can be
  read from it), so the gap may be short by how long it stood there before.

A paused leader renews as any leader does: time paused is never part of a gap. Neither is the
new leader's restore, which follows the takeover (``agent.resumed`` tells when it ended).

Both ends are on the taker's clocks. It saw that write first at some read, and the read before
it still found the write before (or nothing): the write was made between the two, so the gap
lies between the times since each, on its monotonic clock. Within that window it compares the
write's wall-clock time (``LeaseRecord.written``, the writer's clock) with its own: off by at
most the skew between the two clocks (milliseconds under NTP), clamped into the window, so a
standby reading all along is never off by more than the time between two of its reads,
whatever the clocks say. A taker that never read the record before (it started later) has no
upper bound: it trusts the wall clocks, never below the time it watched the record stand
itself. Display only: no node decides anything by the gap.
"""

from __future__ import annotations

import math

from ..records import LeaseRecord

__all__ = ["LeaderWrites", "format_gap"]


class LeaderWrites:
    """When this node first saw the lease record's last leader write (an acquisition, renewal,
    release or hand-over), and when it last read the write before. An operator's request
    written into the record is no leader write: it changes none of what the key holds."""

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._seen_at = 0.0  # the first read that found the current write
        self._before: float | None = None  # the last read that found an earlier one (or none)
        self._read_at: float | None = None  # the last read

    def see(self, record: LeaseRecord | None, now: float) -> None:
        """record was read (or written by us) at now, on our monotonic clock."""
        key = None if record is None else _write_key(record)
        if key != self._key or self._read_at is None:
            self._key, self._seen_at, self._before = key, now, self._read_at
        self._read_at = now

    def gap_ms(self, record: LeaseRecord | None, now: float, wall: float) -> int:
        """The gap of taking record (the one seen last) now, on our monotonic clock; wall:
        our wall clock now. In milliseconds."""
        if record is None:
            return 0
        watched = now - self._seen_at
        latest = math.inf if self._before is None else now - self._before
        by_walls = wall - record.written if record.written else watched
        return _ms(min(max(by_walls, watched), latest))


def format_gap(gap_ms: float) -> str:
    """A takeover gap as ``hb history`` and ``hb-tui`` show it: 2.004 s."""
    return f"{gap_ms / 1000:.3f} s"


def _write_key(record: LeaseRecord) -> tuple[object, ...]:
    return (record.epoch, record.holder, record.session, record.renewals, record.written)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))
