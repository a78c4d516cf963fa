"""Wake the moment a lease record changes: inotify on its directory, no polling thread.

Every lease watch of an event loop shares one inotify instance. inotify sees this machine's
writes only; where it cannot be had (not Linux, a limit reached) or would miss writes
(NFS) ``open_lease_watch`` returns None and the store polls through watchfiles instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .location import mount_of

if TYPE_CHECKING:
    from asyncinotify import Inotify, Watch

log = logging.getLogger(__name__)


class LeaseWatch:
    """One directory's watch: woken when a name wanted arrives or goes, or the directory goes.
    As an async iterator: None after each change of a name wanted, to the end when the
    directory goes; aclose (``contextlib.aclosing``) closes it, iterated or not."""

    def __init__(self, shared: _LoopWatches, directory: str, wanted: Callable[[str], bool]) -> None:
        self._shared, self.directory, self.wanted = shared, directory, wanted
        self.woken = asyncio.Event()
        self.changed = False  # a name wanted arrived or went (or events were lost)
        self.gone = False  # the directory was moved or removed: this watch sees no more

    def wake(self, *, gone: bool = False) -> None:
        self.gone |= gone
        self.changed |= not gone
        self.woken.set()

    def close(self) -> None:
        self._shared.leave(self)

    def __aiter__(self) -> LeaseWatch:
        return self

    async def __anext__(self) -> None:
        while not self.gone:
            await self.woken.wait()
            self.woken.clear()
            if self.changed and not self.gone:
                self.changed = False
                return
        self.close()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.close()


class _LoopWatches:
    """Every lease watch of one event loop on one inotify instance (the user's limit,
    fs.inotify.max_user_instances, is 128 for all their processes together)."""

    def __init__(self, inotify: Inotify) -> None:
        self._inotify = inotify
        self._by_dir: dict[str, tuple[Watch, set[LeaseWatch]]] = {}
        self._by_wd: dict[int, str] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="hb-inotify")

    def join(self, directory: str, wanted: Callable[[str], bool]) -> LeaseWatch | None:
        from asyncinotify import Mask

        if directory not in self._by_dir:
            # A record is renamed into place or removed; nothing else is asked for (temp
            # and lock files would wake the loop for nothing); the directory moved or gone.
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
            # Closed once the reader has let go of it: a read callback of its already due
            # in this turn of the loop would find it closed ("Can not work with closed inotify").
            self._reader.add_done_callback(lambda _reader: self._inotify.close())

    async def _read(self) -> None:
        from asyncinotify import Mask

        async for event in self._inotify:
            if Mask.Q_OVERFLOW in event.mask:  # events were lost: any record may have changed
                for member in [m for _watch, ms in self._by_dir.values() for m in ms]:
                    member.wake()
                continue
            directory = None if event.watch is None else self._by_wd.get(event.watch.wd)
            if directory is None:
                continue
            members = list(self._by_dir[directory][1])
            if event.mask & (Mask.IGNORED | Mask.MOVE_SELF | Mask.DELETE_SELF):
                self._drop(directory)  # the records are elsewhere now
                for member in members:
                    member.wake(gone=True)
            elif event.name is not None:
                for member in members:
                    if member.wanted(event.name.name):
                        member.wake()


# The inotify instance of each running event loop, while it watches anything.
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWatches] = (
    weakref.WeakKeyDictionary()
)


def open_lease_watch(directory: Path, wanted: Callable[[str], bool]) -> LeaseWatch | None:
    """An inotify watch of the names wanted in directory, on the running event loop's one
    instance; None where inotify cannot be had or would miss writes (NFS)."""
    if mount_of(directory).fstype.startswith("nfs"):
        return None
    loop = asyncio.get_running_loop()
    shared = _SHARED.get(loop)
    if shared is None:
        try:
            from asyncinotify import Inotify

            inotify = Inotify()
        # RuntimeError: asyncinotify found no libc with inotify; EMFILE: the instance limit.
        except (ImportError, RuntimeError, OSError, AttributeError) as exc:
            log.debug("no inotify (%s): the lease watch polls", exc)
            return None
        shared = _SHARED[loop] = _LoopWatches(inotify)
    return shared.join(str(directory), wanted)
