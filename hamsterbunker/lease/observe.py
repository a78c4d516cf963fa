"""Is an agent's lease live? Judged as a standby judges it, on this process's monotonic
clock, never by comparing clocks: *live* once the record changed and has not stood still for
a full TTL since, *expired* once it stood still for a full TTL of watching. Watching stops
after ``MAX_WATCH_S``: a lease with a longer TTL that stood still that long is *unknown*.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.errors import CorruptRecord
from ..core.timing import MAX_WATCH_S
from ..records import LeaseRecord
from ..stores import Store

__all__ = ["MAX_WATCH_S", "LeaseObserver", "Liveness", "Observed"]

# How often the record is read while watching.
POLL_S = 0.1

# The states of a lease, as seen from here. Only "live" has a leader to count on.
LIVE, EXPIRED, RELEASED, NEVER_TAKEN, UNREADABLE, UNKNOWN, NOT_WATCHED = (
    "live", "expired", "released", "never taken", "unreadable", "unknown", "not watched",
)  # fmt: skip


@dataclass(frozen=True)
class Liveness:
    """What watching the record showed: its state, and its changes on our clock."""

    state: str
    watched_s: float  # how long this process has watched the record (0: not at all)
    changes: int  # changes seen while watching
    changed_s_ago: float | None  # since the last change seen (None: none seen)
    ttl_s: float  # the record's TTL (0 without a record)


@dataclass(frozen=True)
class Observed:
    lease: LeaseRecord | None
    lease_error: str | None  # why the record could not be read (lease is None)
    liveness: Liveness


@dataclass
class _Seen:
    key: tuple[object, ...]
    started: float  # the first read
    since: float  # the read that first saw the record as it is now
    changes: int = 0


class LeaseObserver:
    """Watch agents' lease records, remembering what was seen across ``observe`` calls
    (``hb status --watch``); ``limit_s`` bounds each call's watching (0: read once)."""

    def __init__(
        self,
        store: Store,
        *,
        limit_s: float = MAX_WATCH_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._limit_s = max(0.0, min(limit_s, MAX_WATCH_S))
        self._clock, self._sleep = clock, sleep
        self._seen: dict[str, _Seen] = {}

    def observe(self, agents: Sequence[str]) -> dict[str, Observed]:
        """Each agent's lease as last read, and its liveness: at most limit_s of watching."""
        started = self._clock()
        found: dict[str, Observed] = {}
        pending = list(agents)
        while pending:
            for agent in pending:
                found[agent] = self._read(agent)
            pending = [a for a in pending if found[a].liveness.state == UNKNOWN]
            if pending and self._clock() - started < self._limit_s:
                self._sleep(POLL_S)
            else:
                break
        return found

    def _read(self, agent: str) -> Observed:
        try:
            lease = self._store.read_lease(agent)
        except CorruptRecord as exc:
            self._seen.pop(agent, None)
            return Observed(None, str(exc), Liveness(UNREADABLE, 0.0, 0, None, 0.0))
        now = self._clock()
        if lease is None or lease.holder is None:
            self._seen.pop(agent, None)
            state = NEVER_TAKEN if lease is None else RELEASED
            return Observed(lease, None, Liveness(state, 0.0, 0, None, 0.0))
        key = lease.change_key()
        seen = self._seen.get(agent)
        if seen is None:
            seen = self._seen[agent] = _Seen(key, started=now, since=now)
        elif seen.key != key:
            seen.key, seen.since, seen.changes = key, now, seen.changes + 1
        ttl_s = lease.ttl_ms / 1000
        if self._limit_s == 0:
            state = NOT_WATCHED
        elif now - seen.since >= ttl_s:
            state = EXPIRED  # stood still for a full TTL, on our clock
        elif seen.changes:
            state = LIVE  # changed, and not a full TTL ago
        else:
            state = UNKNOWN  # not watched long enough yet
        changed = round(now - seen.since, 3) if seen.changes else None
        liveness = Liveness(state, round(now - seen.started, 3), seen.changes, changed, ttl_s)
        return Observed(lease, None, liveness)
