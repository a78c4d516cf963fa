"""File I/O for a store directory whose contents nobody vouches for (DESIGN.md invariant 10).

Below the store's root each directory is opened relative to its parent without following
a symlink, each file with ``O_NOFOLLOW | O_NONBLOCK`` and read only if ``fstat`` says it is
a regular file, never past its caller's cap; anything else under one of our names is a
CorruptRecord naming the path. Writes: temp file, fsync, rename, directory fsync.
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
    "closing_fd",
    "dir_entries",
    "discard",
    "file_kind",
    "make_subdir",
    "open_dirs",
    "open_regular",
    "opened_dir",
    "opened_subdir",
    "pread_upto",
    "read_file",
    "read_upto",
    "sweep_temps",
    "write_all",
    "write_temp",
]

log = logging.getLogger("hamsterbunker.stores.file")

TMP_PREFIX = "tmp-hb-"  # a shape no editor, sync tool or record name of ours has
_CHUNK = 8 * 1024 * 1024  # the most asked of one read(2)
# POSIX_FADV_DONTNEED starts writeback of a range at once (what PostgreSQL does without
# sync_file_range) and drops it from the cache once written; the fsync still waits for
# it all. Measured at 8 MiB: a publish 1.37 x a raw write with it, 1.45 without.
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


def _open_subdir(parent: int, name: str, shown: Callable[[], Path]) -> int | None:
    """The directory name in parent, not through a symlink; None if absent. shown: its path,
    made only for an error (a commit opens a dozen folders: no path is made for each)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in _NOT_A_DIR:
            raise CorruptRecord(
                f"{shown()} is not a directory (a symbolic link or a file is there): not followed"
            ) from exc
        raise


def make_subdir(parent: int, name: str, path: Path) -> int:
    """Like _open_subdir, but make the directory if it is absent, durably in its parent."""
    return _make_subdir(parent, name, lambda: path)


def _make_subdir(parent: int, name: str, shown: Callable[[], Path]) -> int:
    fd = _open_subdir(parent, name, shown)
    if fd is None:
        try:
            os.mkdir(name, dir_fd=parent)
        except FileExistsError:
            pass  # another node made it just now (or planted something: the open below says)
        else:
            os.fsync(parent)  # the new entry outlives a crash before anything in it counts
        fd = _open_subdir(parent, name, shown)
    if fd is None:  # removed again at once
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(shown()))
    return fd


def open_dirs(dir_fd: int, path: Path, parts: Sequence[str], *, create: bool = False) -> int | None:
    """dir_fd's parts/... (dir_fd shown as path), each opened without following a symlink;
    None if one is absent (with create, made). CorruptRecord where one is no directory."""
    fd = os.dup(dir_fd)
    for at, name in enumerate(parts):

        def shown(upto: int = at + 1) -> Path:
            return path.joinpath(*parts[:upto])

        try:
            child = _make_subdir(fd, name, shown) if create else _open_subdir(fd, name, shown)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_dir(root: Path, parts: Sequence[str], *, create: bool = False) -> Iterator[int | None]:
    """open_dirs from root, the user's own path (which may be a symlink); None if root is
    absent (never made)."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    else:
        with closing_fd(root_fd):
            fd = open_dirs(root_fd, root, parts, create=create)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def opened_subdir(parent: int, name: str, path: Path) -> Iterator[int | None]:
    """_open_subdir, closed on leaving."""
    fd = _open_subdir(parent, name, lambda: path)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def dir_entries(dir_fd: int, limit: int | None = None) -> list[os.DirEntry[str]]:
    """The directory's entries, in its own order; with limit, no more than that many."""
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
    Anything else there is a CorruptRecord naming path; FileNotFoundError if absent."""
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            raise CorruptRecord(f"{path} is {_NOT_A_FILE[exc.errno]}: not opened") from exc
        raise
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise CorruptRecord(f"{path} is {kind}, not a regular file: not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def read_upto(dir_fd: int, name: str, path: Path, most: int) -> bytes | int | None:
    """The regular file's bytes if at most `most`; else its size, unread (or, once it grew
    past, the bytes read: never more than most + 1); None if absent (see open_regular)."""
    try:
        fd = open_regular(dir_fd, name, path)
    except FileNotFoundError:
        return None
    with closing_fd(fd):
        size = os.fstat(fd).st_size
        if size > most:
            return size
        data = pread_upto(fd, 0, size + 1)  # + 1: to see whether it grew since
        if len(data) > size:  # it did (an event log being appended): read on, within most
            data += pread_upto(fd, len(data), most + 1 - len(data))
    return len(data) if len(data) > most else data


def read_file(dir_fd: int, name: str, path: Path, limit: int) -> bytes | None:
    """read_upto, with a file over limit a CorruptRecord."""
    data = read_upto(dir_fd, name, path, limit)
    if isinstance(data, int):
        raise CorruptRecord(f"{path} is over the limit of {limit} bytes: not read")
    return data


# -- writing --------------------------------------------------------------------------


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def discard(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _write_pieces(fd: int, pieces: Iterable[bytes], durable: bool) -> None:
    """Write each piece as it is made; with durable, start the disk on each large one at
    once, so that it writes while the next is made."""
    offset = 0
    for piece in pieces:
        write_all(fd, piece)
        if durable and _START_WRITEBACK is not None and len(piece) >= _WRITEBACK_BYTES:
            _START_WRITEBACK(fd, offset, len(piece), os.POSIX_FADV_DONTNEED)
        offset += len(piece)


def write_temp(dir_fd: int, data: Blob, durable: bool, points: str = "") -> str:
    """Write data to a new temporary file in dir_fd (fsynced if durable); its name. points
    names its failpoints. If making a blob's pieces raises, the file is removed."""
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
    """A decorator translating OSError at a folder store's boundary: StoreUnavailable for
    what may pass (a stale NFS handle), StoreError for the rest; store names it in messages."""

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
