"""Wake the moment an agent's lease record changes: inotify on its directory, no polling.

The node loop waits on this watch (a standby to take a released lease, a
leader to see an operator's request). A polling watcher trades latency for
CPU: watchfiles' thread wakes every ``step`` even when nothing changes, and
yields a change only after a ``step`` of quiet. An inotify descriptor on the
event loop costs nothing while idle and reads a change as it lands.

inotify sees the writes of this machine only (NFS: the store uses polling);
where it cannot be had (not Linux, the watch limit reached) this returns None
and the store falls back to watchfiles. Every lease watch of an event loop
shares one inotify instance (a process keeping many agents watches many).

A watch of terms alone (``terms_only``) reads the record at each change and
stays quiet through renewals; that read is of one small file on a local disk,
so it runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import CorruptRecord
from ...core.limits import MAX_RECORD_BYTES
from .._terms import TermChanges
from .fileio import closing_fd, read_file

if TYPE_CHECKING:
    from asyncinotify import Inotify, Watch

log = logging.getLogger(__name__)

LEASE_NAME = "lease.json"


def is_lease_name(name: str) -> bool:
    """The lease record's name, or a claim a syncdir node published beside it (a node's
    subtree there is a file store: ``stores/syncdir/published.py``)."""
    return name == LEASE_NAME or (name.startswith("claim.") and name.endswith(".json"))


class LeaseWatch:
    """One directory's lease watch: woken for its lease record (or the names wanted), or
    when it goes away."""

    def __init__(self, shared: _LoopWatches, directory: str, wanted: Callable[[str], bool]) -> None:
        self._shared, self.directory, self.wanted = shared, directory, wanted
        self.woken = asyncio.Event()
        self.changed = False  # the lease record arrived or went (or events were lost)
        self.gone = False  # the directory was moved or removed: this watch sees no more

    def close(self) -> None:
        self._shared.leave(self)


class _LoopWatches:
    """Every lease watch of one event loop on one inotify instance: a process that keeps
    many agents would otherwise spend an instance on each, and the user's limit
    (fs.inotify.max_user_instances) is 128 for all their processes together."""

    def __init__(self, inotify: Inotify) -> None:
        self._inotify = inotify
        self._by_dir: dict[str, tuple[Watch, set[LeaseWatch]]] = {}
        self._by_wd: dict[int, str] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="hb-inotify")

    def join(self, directory: str, wanted: Callable[[str], bool]) -> LeaseWatch | None:
        from asyncinotify import Mask

        if directory not in self._by_dir:
            # The record is replaced by a rename (MOVED_TO) or removed; a planted symlink
            # in place of the directory is not followed. Nothing else is asked for: every
            # lease write and checkpoint here also closes a temp or lock file and moves a
            # temp file away, and each such event would wake the loop for nothing. The
            # directory itself moved away or removed: the records are elsewhere now.
            mask = Mask.MOVED_TO | Mask.DELETE | Mask.MOVE_SELF | Mask.DELETE_SELF
            try:
                watch = self._inotify.add_watch(directory, mask | Mask.ONLYDIR | Mask.DONT_FOLLOW)
            except OSError as exc:  # ENOSPC: the user's watch limit; ENOTDIR, ENOENT: raced
                log.debug("inotify watch of %s refused (%s): the lease watch polls", directory, exc)
                self._close_if_unused()
                return None
            self._by_dir[directory] = (watch, set())
            self._by_wd[watch.wd] = directory
        joined = LeaseWatch(self, directory, wanted)
        self._by_dir[directory][1].add(joined)
        return joined

    def leave(self, member: LeaseWatch) -> None:
        entry = self._by_dir.get(member.directory)
        if entry is not None and member in entry[1]:
            entry[1].discard(member)
            if not entry[1]:
                self._drop(member.directory)
        self._close_if_unused()

    def _drop(self, directory: str) -> None:
        watch, _members = self._by_dir.pop(directory)
        del self._by_wd[watch.wd]
        with contextlib.suppress(OSError):  # gone already, with its directory
            self._inotify.rm_watch(watch)

    def _close_if_unused(self) -> None:
        if not self._by_dir and _SHARED.get(asyncio.get_running_loop()) is self:
            del _SHARED[asyncio.get_running_loop()]
            self._reader.cancel()
            self._inotify.close()

    async def _read(self) -> None:
        from asyncinotify import Mask

        async for event in self._inotify:
            if Mask.Q_OVERFLOW in event.mask:  # events were lost: any record may have changed
                members = [m for _watch, ms in self._by_dir.values() for m in ms]
                for member in members:
                    member.changed = True
                    member.woken.set()
                continue
            directory = None if event.watch is None else self._by_wd.get(event.watch.wd)
            if directory is None:
                continue
            members = list(self._by_dir[directory][1])
            if event.mask & (Mask.IGNORED | Mask.MOVE_SELF | Mask.DELETE_SELF):
                self._drop(directory)  # the records are elsewhere now
                for member in members:
                    member.gone = True
                    member.woken.set()
            elif event.name is not None:
                for member in members:
                    if member.wanted(event.name.name):
                        member.changed = True
                        member.woken.set()


# The inotify instance of each running event loop, while it watches anything.
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWatches] = (
    weakref.WeakKeyDictionary()
)


def open_lease_watch(
    directory: Path, wanted: Callable[[str], bool] = is_lease_name
) -> LeaseWatch | None:
    """An inotify watch of the lease record in directory (or of the names wanted), on the
    running event loop's one instance; None where inotify cannot be had."""
    loop = asyncio.get_running_loop()
    shared = _SHARED.get(loop)
    if shared is None:
        try:
            from asyncinotify import Inotify

            inotify = Inotify()
        # No inotify on this system (RuntimeError: asyncinotify found no libc that has it),
        # or EMFILE: the user's instance limit (fs.inotify.max_user_instances, 128 by default).
        except (ImportError, RuntimeError, OSError, AttributeError) as exc:
            log.debug("no inotify (%s): the lease watch polls", exc)
            return None
        shared = _SHARED[loop] = _LoopWatches(inotify)
    return shared.join(str(directory), wanted)


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
    watch: LeaseWatch, term_changed: Callable[[], bool] | None = None
) -> AsyncGenerator[None, None]:
    """Yield after each change of the lease record (of its term, if term_changed is given);
    end when the directory goes away.

    Takes ownership of watch and closes it.
    """
    try:
        while True:
            await watch.woken.wait()
            watch.woken.clear()
            if watch.gone:
                return
            if watch.changed:
                watch.changed = False
                if term_changed is None or term_changed():
                    yield None
    finally:
        watch.close()
