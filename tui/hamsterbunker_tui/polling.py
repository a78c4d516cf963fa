"""One poll of the store: the blocking reads the monitor makes, always run in a thread.

No Textual here. The app calls ``read_store`` through ``asyncio.to_thread`` so
that a slow or hanging store never freezes the screen, and turns what it
raises into the "store unreachable" banner. A lease record that does not parse
is not a lost store: it is passed on as ``lease_error`` and the rest is read.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

from hamsterbunker.errors import CorruptRecord, StoreUnavailable
from hamsterbunker.records import CheckpointInfo, Event, Heartbeat, LeaseRecord
from hamsterbunker.stores import Store
from hamsterbunker.stores.file import FileStore
from hamsterbunker.tail import Tail

__all__ = ["Reading", "check_reachable", "read_store"]


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
    check_reachable(store)
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


def check_reachable(store: Store) -> None:
    """Raise StoreUnavailable if a file store's directory is gone.

    The file store reads a missing record as "not written yet", so a removed
    store directory would read as an empty cluster: every node offline, no
    lease. For a monitor that is a lost store, and it must say so.
    """
    if not isinstance(store, FileStore):
        return
    try:
        mode = os.stat(store.root).st_mode
    except OSError as exc:
        raise StoreUnavailable(f"store directory {store.root}: {exc.strerror}") from exc
    if not stat.S_ISDIR(mode):
        raise StoreUnavailable(f"store path {store.root} is not a directory")
