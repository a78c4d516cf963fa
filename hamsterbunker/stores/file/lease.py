"""The file store's lease record and the lock held across its read-check-write.

Compare-and-set is real: an open-file-description (OFD) fcntl lock on
``lease.lock`` is held across read-compare-rename of the lease, and across the
fence check and rename of a checkpoint. OFD locks belong to the open file, not
the process, so they exclude other threads and other FileStore objects of this
process as well as other processes and (through lockd) other NFS clients.
Classic POSIX locks would not: every fd of one process shares one lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from ...errors import CorruptRecord, LeaseConflict, StoreError, StoreUnavailable, UnreadableLease
from ...limits import MAX_RECORD_BYTES
from ...records import LeaseRecord
from ..base import parse_lease
from .fileio import discard, log, open_regular, read_file, write_temp

__all__ = ["cas_lease_in", "lease_in", "lease_locked", "replace_unreadable_in"]

# struct flock for F_OFD_SETLK: whole file, write lock, l_pid 0 (Linux, 64-bit off_t).
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
# O_NONBLOCK: a FIFO planted there fails the open (ENXIO) instead of waiting for a reader.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Tries to open lease.lock, each after moving aside what was planted there.
_LOCK_OPEN_TRIES = 3


def lease_in(agent_fd: int, agent_dir: Path) -> LeaseRecord | None:
    """The lease record in the agent's directory (open as agent_fd), or None if never written.

    UnreadableLease for anything else there (junk, a symlink, a FIFO, a huge file).
    """
    try:
        data = read_file(agent_fd, "lease.json", agent_dir / "lease.json", MAX_RECORD_BYTES)
    except CorruptRecord as exc:
        raise UnreadableLease(str(exc), _found(agent_fd)) from exc
    return None if data is None else parse_lease(data, lambda: _found(agent_fd))


def _found(agent_fd: int) -> str:
    """What lease.json is, for replace_unreadable_lease: its kind, inode, size and change
    time, unread (it may be a FIFO or huge). Every write of it, ours (a rename) or
    anyone's, changes its change time or inode."""
    try:
        st = os.stat("lease.json", dir_fd=agent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "gone"
    return f"{stat.S_IFMT(st.st_mode):o}:{st.st_ino}:{st.st_size}:{st.st_ctime_ns}"


@contextlib.contextmanager
def lease_locked(agent_fd: int, agent_dir: Path, agent: str, timeout: float) -> Iterator[None]:
    """Hold the agent's lease lock, waiting at most timeout seconds (then StoreUnavailable)."""
    path = agent_dir / "lease.lock"
    fd = _open_lock(agent_fd, path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise StoreUnavailable(f"cannot lock {path}: {exc.strerror}") from exc
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"lease lock of {agent!r} held elsewhere for {timeout} s"
                    ) from exc
                time.sleep(0.002)
        yield
    finally:
        os.close(fd)  # closing the description releases its lock


def _open_lock(agent_fd: int, path: Path) -> int:
    """lease.lock, open to lock. Anything else planted there (a link, a FIFO, a directory)
    is moved aside first and reported: we only ever make a regular file there, and while
    it stood no lease write could ever happen again."""
    for _ in range(_LOCK_OPEN_TRIES):
        try:
            return open_regular(agent_fd, "lease.lock", path, _LOCK_FLAGS)
        except CorruptRecord as exc:
            _move_aside(agent_fd, "lease.lock", str(exc))
    raise StoreUnavailable(f"{path} is replaced by something other than a file at every try")


def _move_aside(dir_fd: int, name: str, problem: str) -> None:
    """Rename what is at name (not a regular file) to a name nothing reads, for a person to
    look at. A regular file there now (another process moved the junk first) is kept."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        return
    aside = f"{name}.planted-{secrets.token_hex(4)}"
    with contextlib.suppress(FileNotFoundError):
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        log.warning("%s: moved aside as %s, so that the lease can be locked", problem, aside)


def cas_lease_in(
    agent_fd: int,
    agent_dir: Path,
    agent: str,
    expected_version: int | None,
    new: LeaseRecord,
    timeout: float,
) -> LeaseRecord:
    """Store.cas_lease in the agent's directory (open as agent_fd)."""
    stored = replace(new, version=(expected_version or 0) + 1)
    # Written and synced before the lock: the lock is held only for
    # read-compare-rename, so a node paused or slowed in here holds up
    # the others as briefly as possible.
    tmp = write_temp(agent_fd, stored.to_json(), durable=True)
    try:
        with lease_locked(agent_fd, agent_dir, agent, timeout):
            current = lease_in(agent_fd, agent_dir)
            current_version = None if current is None else current.version
            if current_version != expected_version:
                raise LeaseConflict(
                    f"lease of {agent!r} is at version {current_version}, not {expected_version}"
                )
            os.replace(tmp, "lease.json", src_dir_fd=agent_fd, dst_dir_fd=agent_fd)
            os.fsync(agent_fd)
            return stored
    finally:
        discard(agent_fd, tmp)


def replace_unreadable_in(
    agent_fd: int, agent_dir: Path, agent: str, found: str, new: LeaseRecord, timeout: float
) -> LeaseRecord:
    """Store.replace_unreadable_lease in the agent's directory (open as agent_fd)."""
    tmp = write_temp(agent_fd, new.to_json(), durable=True)
    try:
        with lease_locked(agent_fd, agent_dir, agent, timeout):
            try:
                lease_in(agent_fd, agent_dir)
            except UnreadableLease as exc:
                if exc.found != found:
                    raise LeaseConflict(f"the lease record of {agent!r} changed since") from exc
            else:
                raise LeaseConflict(f"the lease record of {agent!r} is no longer unreadable")
            _clear_directory(agent_fd, agent_dir / "lease.json")
            os.replace(tmp, "lease.json", src_dir_fd=agent_fd, dst_dir_fd=agent_fd)
            os.fsync(agent_fd)
            return new
    finally:
        discard(agent_fd, tmp)


def _clear_directory(agent_fd: int, path: Path) -> None:
    """Remove an empty directory planted as lease.json (a rename cannot replace one)."""
    st = os.stat("lease.json", dir_fd=agent_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        return
    try:
        os.rmdir("lease.json", dir_fd=agent_fd)
    except OSError as exc:
        raise StoreError(f"{path} is a directory that is not empty: remove it") from exc
