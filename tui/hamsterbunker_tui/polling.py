"""One poll of the store: the blocking reads the monitor makes, always run in a thread.

No Textual here. The app calls ``read_store`` through ``asyncio.to_thread`` so
that a slow or hanging store never freezes the screen, and turns what it
raises into the "store unreachable" banner. A lease record that does not parse
is not a lost store: it is passed on as ``lease_error`` and the rest is read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hamsterbunker.errors import CorruptRecord
from hamsterbunker.records import CheckpointInfo, Event, Heartbeat, LeaseRecord
from hamsterbunker.stores import Store, Tail

__all__ = ["Reading", "read_store"]


@dataclass(frozen=True)
class Reading:
    """Everything one poll saw, with the monitor's clocks at the moment it finished."""

    events: list[Event]
    heartbeats: list[Heartbeat]
    lease: LeaseRecord | None
    checkpoints: list[CheckpointInfo]
    now: float  # monotonic
    wall: float
    lease_error: str | None = None  # why the lease record could not be read (lease is None)


def read_store(store: Store, tail: Tail, agent: str) -> Reading:
    """Read lease, checkpoints and new events; StoreError or OSError if the store is lost."""
    # A file store reads a missing record as "not written yet": without this, a
    # removed store directory would show as an empty cluster, not a lost store.
    store.check()
    lease_error = None
    try:
        lease = store.read_lease(agent)
    except CorruptRecord as exc:
        # Unauthenticated: anyone who can write the store can damage it. Say so, read on.
        lease, lease_error = None, str(exc)
    checkpoints = store.list_checkpoints(agent)
    # The tail goes last: it hands out each event only once, so a read that
    # failed after it would lose those events from the log.
    got = tail.read()
    return Reading(
        got.events, got.heartbeats, lease, checkpoints, time.monotonic(), time.time(), lease_error
    )
