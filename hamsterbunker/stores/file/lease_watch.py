"""Wake the moment an agent's lease record changes: inotify on its directory, no polling.

The node loop waits on this watch (a standby to take a released lease, a
leader to see an operator's request). A polling watcher trades latency for
CPU: watchfiles' thread wakes every ``step`` even when nothing changes, and
yields a change only after a ``step`` of quiet. An inotify descriptor on the
event loop costs nothing while idle and reads a change as it lands.

inotify sees the writes of this machine only (NFS: the store uses polling);
where it cannot be had (not Linux, the watch limit reached) this returns None
and the store falls back to watchfiles.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncinotify import Inotify

log = logging.getLogger(__name__)

LEASE_NAME = "lease.json"


def open_lease_watch(directory: Path) -> Inotify | None:
    """An inotify watch of the lease record in directory, or None where inotify cannot be had."""
    try:
        from asyncinotify import Inotify, Mask

        inotify = Inotify()
    # No inotify on this system (RuntimeError: asyncinotify found no libc that has it), or
    # EMFILE: the user's instance limit (fs.inotify.max_user_instances, 128 by default).
    except (ImportError, RuntimeError, OSError, AttributeError) as exc:
        log.debug("no inotify (%s): the lease watch polls", exc)
        return None
    # The record is replaced by a rename (MOVED_TO) or removed; a planted symlink
    # in place of the directory is not followed.
    mask = Mask.MOVED_TO | Mask.MOVED_FROM | Mask.CLOSE_WRITE | Mask.DELETE
    # The directory itself moved away or removed: the records are elsewhere now.
    mask |= Mask.MOVE_SELF | Mask.DELETE_SELF
    try:
        inotify.add_watch(directory, mask | Mask.ONLYDIR | Mask.DONT_FOLLOW)
    except OSError as exc:  # ENOSPC: the user's watch limit; ENOTDIR, ENOENT: raced away
        log.debug("inotify watch of %s refused (%s): the lease watch polls", directory, exc)
        inotify.close()
        return None
    return inotify


async def lease_changes(inotify: Inotify) -> AsyncIterator[None]:
    """Yield after each change of the lease record; end when the directory goes away.

    Takes ownership of inotify and closes it.
    """
    from asyncinotify import Mask

    with inotify:
        async for event in inotify:
            if event.mask & (Mask.IGNORED | Mask.MOVE_SELF | Mask.DELETE_SELF):
                return  # the directory was moved or removed: this watch sees no more
            # An overflowed queue lost events: the record may have changed.
            if Mask.Q_OVERFLOW in event.mask or (
                event.name is not None and event.name.name == LEASE_NAME
            ):
                yield None
