"""One poll of the store: the blocking reads the monitor makes, always run in a thread.

No Textual here. The app calls ``read_store`` through ``asyncio.to_thread`` so
that a slow or hanging store never freezes the screen, and turns what it
raises into the "store unreachable" banner. A lease record that does not parse
is not a lost store: it is passed on as ``lease_error`` and the rest is read.

A ``syncdir://`` store's own report (``SyncDirPoll``) lists every node's chain
and reads every event: it is read in the same poll, but only every
``SYNCDIR_S``, or at the next poll after a ``store.diverged`` event came in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hamsterbunker.core.errors import CorruptRecord
from hamsterbunker.ops.status import SyncDirShown, syncdir_shown
from hamsterbunker.records import CheckpointInfo, Event, Heartbeat, LeaseRecord
from hamsterbunker.stores import Store, Tail

__all__ = ["SYNCDIR_S", "Reading", "SyncDirPoll", "read_store"]

SYNCDIR_S = 5.0  # the syncdir report is read this often (it reads every chain and event)


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
    syncdir: SyncDirShown | None = None  # a syncdir store's report, when this poll read one


class SyncDirPoll:
    """When a poll reads the syncdir report: at the first poll, then every every_s, and at
    the next poll after a store.diverged event; never again on a store that is not one."""

    def __init__(self, every_s: float = SYNCDIR_S) -> None:
        self.every_s = every_s
        self.applies: bool | None = None  # None: not known until the first read
        self._due = 0.0  # monotonic

    def read(self, store: Store, agent: str) -> SyncDirShown | None:
        """The report if it is due (None if not, or if the store is not a syncdir store)."""
        if self.applies is False or time.monotonic() < self._due:
            return None
        shown = syncdir_shown(store, agent)
        self.applies = shown is not None
        self._due = time.monotonic() + self.every_s
        return shown

    def note(self, events: list[Event]) -> None:
        if any(event.type == "store.diverged" for event in events):
            self._due = 0.0  # a node just reported a chain kept aside: show it soon


def read_store(store: Store, tail: Tail, agent: str, syncdir: SyncDirPoll | None = None) -> Reading:
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
    shown = syncdir.read(store, agent) if syncdir is not None else None
    # The tail goes last: it hands out each event only once, so a read that
    # failed after it would lose those events from the log.
    got = tail.read()
    if syncdir is not None:
        syncdir.note(got.events)
    return Reading(
        got.events,
        got.heartbeats,
        lease,
        checkpoints,
        time.monotonic(),
        time.time(),
        lease_error,
        shown,
    )
