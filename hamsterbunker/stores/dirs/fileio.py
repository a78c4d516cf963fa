"""File I/O for a store directory whose contents nobody vouches for (DESIGN.md invariant 10).

Whoever can write the directory can plant anything in it, so nothing below
the store's root is trusted: each directory is opened relative to its
parent's descriptor with ``O_NOFOLLOW`` (the root itself is the user's and may
be a symlink), each file with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO does not
block the open) and read only if ``fstat`` on the open descriptor says it is a
regular file, and no read goes past the cap its caller gives. Something else
under one of our names is a CorruptRecord naming the path. Writes go through
directory descriptors too: temp file, fsync, rename, directory fsync.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from ...core.blob import Blob, BlobPieces
from ...core.errors import CorruptRecord, StoreError, StoreUnavailable
from ...core.failpoints import failpoint
from ...core.limits import STALE_TEMP_AGE_S

__all__ = [
    "TMP_PREFIX",
    "atomic_write",
    "closing_fd",
    "dir_entries",
    "discard",
    "file_kind",
    "make_subdir",
    "open_regular",
    "opened_dir",
    "opened_subdir",
    "pread_upto",
    "read_file",
    "sweep_temps",
    "write_all",
    "write_temp",
]

log = logging.getLogger("hamsterbunker.stores.file")

# Temporary names start with "tmp-hb-": no editor or sync tool uses that shape,
# and no reader pattern of the store matches it.
TMP_PREFIX = "tmp-hb-"
_CHUNK = 8 * 1024 * 1024  # the most asked of one read(2)
# Linux starts writing back a range's dirty pages when told they are not needed again
# (POSIX_FADV_DONTNEED, without waiting: what PostgreSQL does where sync_file_range is
# missing), and drops them from the cache once written (a checkpoint is read on another
# node, or after a restart); elsewhere the hint may do nothing, and the fsync does it
# all, as before. Measured at 8 MiB: a publish 1.37 × a raw write with it, 1.45 without.
_START_WRITEBACK = getattr(os, "posix_fadvise", None)
_WRITEBACK_BYTES = 256 * 1024  # a smaller piece is left to the fsync

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What open(2) answers when a file name holds something we refuse to open.
_NOT_A_FILE = {
    errno.ELOOP: "a symbolic link (not followed)",
    errno.ENXIO: "a FIFO or a socket",
    errno.EISDIR: "a directory",
}
# And when a directory name holds a symlink (ENOTDIR with O_DIRECTORY, ELOOP without) or a file.
_NOT_A_DIR = {errno.ENOTDIR, errno.ELOOP}


# -- directories: opened one component at a time, never through a symlink


def _refuse_non_dir(exc: OSError, path: Path) -> None:
    """Raise CorruptRecord if exc, from opening the directory at path, says a symlink or a
    file is there."""
    if exc.errno in _NOT_A_DIR:
        raise CorruptRecord(
            f"{path} is not a directory (a symbolic link or a file is there): not followed"
        ) from exc


def _open_subdir(parent: int, name: str, path: Path) -> int | None:
    """The directory name in parent (shown as path), not through a symlink; None if absent."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _refuse_non_dir(exc, path)
        raise


def make_subdir(parent: int, name: str, path: Path) -> int:
    """Like _open_subdir, but make the directory if it is absent, durably in its parent."""
    fd = _open_subdir(parent, name, path)
    if fd is not None:
        return fd
    try:
        os.mkdir(name, dir_fd=parent)
    except FileExistsError:
        pass  # another node made it just now (or planted something: the open below says)
    else:
        os.fsync(parent)  # the new entry outlives a crash before anything in it counts
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        _refuse_non_dir(exc, path)
        raise


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_dir(root: Path, parts: Sequence[str], *, create: bool = False) -> Iterator[int | None]:
    """The directory root/parts/..., walked from root without following a symlink below it.

    The root is the user's own path and may be a symlink. None if root or a
    part is absent (with create, parts are made; root never is).
    """
    try:
        fd: int | None = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    opener: Callable[[int, str, Path], int | None] = make_subdir if create else _open_subdir
    try:
        for depth, name in enumerate(parts, 1):
            if fd is None:
                break
            parent, fd = fd, None
            try:
                fd = opener(parent, name, root.joinpath(*parts[:depth]))
            finally:
                os.close(parent)
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def opened_subdir(parent: int, name: str, path: Path) -> Iterator[int | None]:
    """_open_subdir, closed on leaving."""
    fd = _open_subdir(parent, name, path)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def dir_entries(dir_fd: int, limit: int | None = None) -> list[os.DirEntry[str]]:
    """The directory's entries (their stat() does not follow symlinks when asked not to).

    With limit, no more than that many, in the directory's own order: a listing
    stops there however many entries were planted.
    """
    with os.scandir(dir_fd) as entries:
        return list(entries if limit is None else itertools.islice(entries, limit))


# -- files: regular ones only, read within a cap --------------------------------------


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, for messages; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISLNK: "a symbolic link",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((kind for test, kind in kinds.items() if test(mode)), "not a regular file")


def open_regular(
    dir_fd: int, name: str, path: Path, flags: int = _READ_FLAGS, mode: int = 0o600
) -> int:
    """Open name in dir_fd, never through a symlink and never blocking: a regular file only.

    Anything else there is a CorruptRecord naming path; FileNotFoundError if absent.
    """
    return _open_regular(dir_fd, name, path, flags, mode)[0]


def _open_regular(
    dir_fd: int, name: str, path: Path, flags: int = _READ_FLAGS, mode: int = 0o600
) -> tuple[int, int]:
    """open_regular, and the size its fstat saw (a reader need not ask again)."""
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            raise CorruptRecord(f"{path} is {_NOT_A_FILE[exc.errno]}: not opened") from exc
        raise
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind is not None:
            raise CorruptRecord(f"{path} is {kind}, not a regular file: not read")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def pread_upto(fd: int, offset: int, count: int) -> bytes:
    """Up to count bytes of fd from offset: fewer only at the end of the file."""
    chunks: list[bytes] = []
    while count > 0:
        chunk = os.pread(fd, min(count, _CHUNK), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _too_big(path: Path, limit: int) -> CorruptRecord:
    return CorruptRecord(f"{path} is over the limit of {limit} bytes: not read")


def _read_limited(fd: int, size: int, path: Path, limit: int) -> bytes:
    """The whole file (size bytes when opened) if at most limit bytes; CorruptRecord if not.

    Never reads more than limit + 1 bytes (nothing, if its size already says so).
    """
    if size > limit:
        raise _too_big(path, limit)
    data = pread_upto(fd, 0, size + 1)  # + 1: to see whether it grew since
    if len(data) > size:  # it did (an event log being appended): read on, within the limit
        data += pread_upto(fd, len(data), limit + 1 - len(data))
    if len(data) > limit:
        raise _too_big(path, limit)
    return data


def read_file(dir_fd: int, name: str, path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file name in dir_fd (see open_regular), or None if absent."""
    try:
        fd, size = _open_regular(dir_fd, name, path)
    except FileNotFoundError:
        return None
    with closing_fd(fd):
        return _read_limited(fd, size, path, limit)


# -- writing --------------------------------------------------------------------------


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def discard(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _write_pieces(fd: int, pieces: Iterable[bytes], durable: bool) -> None:
    """Write each piece as it is made; with durable, have the disk start on each large one
    at once (fsync still waits for them all), so that it writes while the next is made."""
    offset = 0
    for piece in pieces:
        write_all(fd, piece)
        if durable and _START_WRITEBACK is not None and len(piece) >= _WRITEBACK_BYTES:
            _START_WRITEBACK(fd, offset, len(piece), os.POSIX_FADV_DONTNEED)
        offset += len(piece)


def write_temp(dir_fd: int, data: Blob, durable: bool, points: str = "") -> str:
    """Write data to a new temporary file in dir_fd, returning its name; points names
    its failpoints. Pieces (``hamsterbunker.core.blob``) are written as they are made; if
    making them raises, the file is removed and that is raised."""
    name = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    fd = os.open(name, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        if isinstance(data, BlobPieces):
            _write_pieces(fd, data, durable)
        else:
            write_all(fd, data)
        if points:
            failpoint(f"{points}.after_temp_write")
        if durable:
            os.fsync(fd)
        if points:
            failpoint(f"{points}.after_temp_fsync")
    except BaseException:
        os.close(fd)
        discard(dir_fd, name)
        raise
    os.close(fd)
    return name


def atomic_write(dir_fd: int, name: str, data: bytes, durable: bool = True) -> None:
    """Replace name in dir_fd with data: temp file, (fsync,) rename, (directory fsync)."""
    tmp = write_temp(dir_fd, data, durable)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        discard(dir_fd, tmp)
        raise
    if durable:
        os.fsync(dir_fd)


def sweep_temps(dir_fd: int, path: Path) -> None:
    """Remove temporary files in dir_fd older than STALE_TEMP_AGE_S: a crash left them."""
    cutoff = time.time() - STALE_TEMP_AGE_S
    for entry in dir_entries(dir_fd):
        if not entry.name.startswith(TMP_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                os.unlink(entry.name, dir_fd=dir_fd)
                log.info("removed %s, a temporary file left by a crash", path / entry.name)
        except FileNotFoundError:
            continue  # removed by another node's sweep


_UNAVAILABLE = {errno.ETIMEDOUT, errno.ESTALE, errno.EIO, errno.ENOTCONN, errno.EHOSTDOWN}
_P = ParamSpec("_P")
_R = TypeVar("_R")


def os_errors_as_store_errors(store: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A decorator translating OSError (disk full, permissions, a stale NFS handle) at a
    folder store's boundary: StoreUnavailable for what may pass, StoreError for the rest;
    store names the store in the message ("file store", "syncdir store")."""

    def decorate(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def translated(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return method(*args, **kwargs)
            except OSError as exc:
                where = f" ({exc.filename})" if exc.filename else ""
                message = f"{store} {method.__name__}: {exc.strerror or exc}{where}"
                error = StoreUnavailable if exc.errno in _UNAVAILABLE else StoreError
                raise error(message) from exc

        return translated

    return decorate
