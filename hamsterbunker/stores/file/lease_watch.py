"""Wake the moment an agent's lease record changes: inotify on its directory, no polling.

The node loop waits on this watch (a standby to take a released lease, a
leader to see an operator's request). A polling watcher trades latency for
CPU: watchfiles' thread wakes every ``step`` even when nothing changes, and
yields a change only after a ``step`` of quiet. An inotify descriptor on the
event loop costs nothing while idle and reads a change as it lands.

inotify sees the writes of this machine only (NFS: the store uses polling);
where it cannot be had (not Linux, the watch limit reached) this returns None
and the store falls back to watchfiles.

A watch of terms alone (``terms_only``) reads the record at each change and
stays quiet through renewals; that read is of one small file on a local disk,
so it runs on the event loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import CorruptRecord
from ...limits import MAX_RECORD_BYTES
from .._terms import TermChanges
from .fileio import closing_fd, read_file

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
    # in place of the directory is not followed. Nothing else is asked for: every
    # lease write and checkpoint here also closes a temp or lock file and moves a
    # temp file away, and each such event would wake the loop for nothing.
    mask = Mask.MOVED_TO | Mask.DELETE
    # The directory itself moved away or removed: the records are elsewhere now.
    mask |= Mask.MOVE_SELF | Mask.DELETE_SELF
    try:
        inotify.add_watch(directory, mask | Mask.ONLYDIR | Mask.DONT_FOLLOW)
    except OSError as exc:  # ENOSPC: the user's watch limit; ENOTDIR, ENOENT: raced away
        log.debug("inotify watch of %s refused (%s): the lease watch polls", directory, exc)
        inotify.close()
        return None
    return inotify


def term_changes(directory: Path) -> Callable[[], bool]:
    """Whether the lease record in directory is of another term than when last asked
    (asked once here: the term as the watch begins)."""
    terms = TermChanges()

    def changed() -> bool:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            with closing_fd(os.open(directory, flags)) as fd:
                data = read_file(fd, LEASE_NAME, directory / LEASE_NAME, MAX_RECORD_BYTES)
        except (OSError, CorruptRecord):  # gone, or not a file we read: look
            return True
        return terms.changed(data)

    changed()
    return changed


async def lease_changes(
    inotify: Inotify, term_changed: Callable[[], bool] | None = None
) -> AsyncIterator[None]:
    """Yield after each change of the lease record (of its term, if term_changed is given);
    end when the directory goes away.

    Takes ownership of inotify and closes it.
    """
    from asyncinotify import Mask

    with inotify:
        async for event in inotify:
            if event.mask & (Mask.IGNORED | Mask.MOVE_SELF | Mask.DELETE_SELF):
                return  # the directory was moved or removed: this watch sees no more
            # An overflowed queue lost events: the record may have changed.
            if Mask.Q_OVERFLOW in event.mask:
                yield None
                continue
            if event.name is None or event.name.name != LEASE_NAME:
                continue
            if term_changed is None or term_changed():
                yield None
