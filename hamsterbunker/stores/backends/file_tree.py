"""The file backend's keys on disk, and the redo log that makes a commit atomic (``backends.file``).

Keys live under ``<root>/kv/``: each ``/`` segment a directory, the last a
file. Nothing below the root is trusted (DESIGN.md invariant 10): a directory
is opened one at a time without following a symlink, only a regular file whose
name is a key segment is read, never past the bytes asked (its size is taken
with fstat before it is read), and one walk looks at no more than
``WALK_ENTRIES`` directory entries in all.

A commit's writes come down to one final state per key (a temp file renamed
onto it, or its removal). Where that is more than one key, a redo log
(``<root>/.redo``) lists them all and is made durable before the first is
applied, and removed, durably, after the last; whoever takes the lock next
applies a log it finds first. Applying one again is harmless: a rename whose
temp file is gone was made, a removal of a key that is absent was made, and
each key is in the log once, so no later write of it can be undone.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path

from ...errors import CorruptRecord, StoreError
from ...failpoints import failpoint
from ..backend import MAX_KEY_CHARS, Scan, ScanResult, ScanTaker, TooLarge, key_problem, prefix_end
from ..file.fileio import (
    TMP_PREFIX,
    atomic_write,
    closing_fd,
    dir_entries,
    log,
    make_subdir,
    open_regular,
    pread_upto,
    read_file,
)
from ..file.layout import is_sync_copy

__all__ = [
    "KV_NAME",
    "LOG_NAME",
    "WALK_ENTRIES",
    "Ops",
    "apply",
    "keys_in",
    "open_folder",
    "prepare",
    "read_key",
    "remove_log",
    "replay",
    "scan_tree",
    "write_log",
]

# The most directory entries one walk (a scan, or the keys of a range delete) looks at:
# far above what the record layer keeps in one folder, so that only planted junk
# reaches it, and then the walk fails rather than list millions of names.
WALK_ENTRIES = 1 << 17
KV_NAME = "kv"  # the folder of the keys, in the root
LOG_NAME = ".redo"
_MAX_LOG_BYTES = 64 * 1024 * 1024
_TEMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"[0-9a-f]{12}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_END = "\x7f"  # after every key: keys are plain ASCII

# Each key's final state in a commit: the temp file (in the root) renamed onto it, or None.
Ops = list[tuple[str, str | None]]


# -- reading -------------------------------------------------------------------------


def open_folder(
    kv_fd: int, kv_path: Path, folders: Sequence[str], create: bool = False
) -> int | None:
    """kv/folders/... opened without following a symlink; None where a part is absent or
    not a directory. With create, made where absent (durably); CorruptRecord if not a
    directory."""
    fd = os.dup(kv_fd)
    for depth, name in enumerate(folders, 1):
        try:
            if create:
                child: int | None = make_subdir(fd, name, kv_path.joinpath(*folders[:depth]))
            else:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
            child = None
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _read_upto(dir_fd: int, name: str, path: Path, max_bytes: int) -> bytes | int | None:
    """The file's bytes if at most max_bytes; else its size (unread, or what was read once it
    grew past); None if absent or not a regular file."""
    try:
        fd = open_regular(dir_fd, name, path)
    except (FileNotFoundError, CorruptRecord):
        return None
    with closing_fd(fd):
        size = os.fstat(fd).st_size
        if size > max_bytes:
            return size
        data = pread_upto(fd, 0, size + 1)  # + 1: to see whether it grew since
        if len(data) > size:  # it did: read on, never past max_bytes + 1
            data += pread_upto(fd, len(data), max_bytes + 1 - len(data))
    return len(data) if len(data) > max_bytes else data


def read_key(kv_fd: int, kv_path: Path, key: str, max_bytes: int) -> bytes | TooLarge | None:
    *folders, name = key.split("/")
    dir_fd = open_folder(kv_fd, kv_path, folders)
    if dir_fd is None:
        return None
    with closing_fd(dir_fd):
        value = _read_upto(dir_fd, name, kv_path / key, max_bytes)
    return TooLarge(key, value) if isinstance(value, int) else value


class _Listing:
    """The directory entries one walk may still look at."""

    def __init__(self) -> None:
        self.left = WALK_ENTRIES

    def entries(self, dir_fd: int, path: Path) -> list[os.DirEntry[str]]:
        found = dir_entries(dir_fd, self.left + 1)
        if len(found) > self.left:
            raise StoreError(
                f"{path}: more than {WALK_ENTRIES} directory entries in one walk "
                "(planted junk?): not listed"
            )
        self.left -= len(found)
        return found


def _walk(
    dir_fd: int, folder: str, lo: str, hi: str, listing: _Listing, path: Path
) -> Iterator[tuple[str, int, str]]:
    """(key, directory fd, file name) of each key with lo <= key < hi in the folder open as
    dir_fd (``folder``: "" or "/"-terminated), in key order."""
    names = []
    for entry in listing.entries(dir_fd, path):
        if key_problem(entry.name) is not None or is_sync_copy(entry.name):
            continue  # not a key's name: ours, a sync tool's or planted
        if entry.is_dir(follow_symlinks=False):
            names.append(entry.name + "/")  # so that "b-x" sorts before the keys in "b/"
        elif entry.is_file(follow_symlinks=False):
            names.append(entry.name)
    for name in sorted(names):
        key = folder + name
        if key >= hi:
            return
        if not name.endswith("/"):
            if key >= lo and len(key) <= MAX_KEY_CHARS:
                yield key, dir_fd, name
        elif prefix_end(key) > lo and len(key) < MAX_KEY_CHARS:
            child = open_folder(dir_fd, path, [name[:-1]])
            if child is not None:  # else replaced since it was listed
                with closing_fd(child):
                    yield from _walk(child, key, lo, hi, listing, path / name[:-1])


def _walk_range(
    kv_fd: int, kv_path: Path, folder: str, lo: str, hi: str
) -> Iterator[tuple[str, int, str]]:
    """_walk of the keys lo <= key < hi in folder ("" or "/"-terminated), which holds them all."""
    folders = folder.split("/")[:-1]
    if lo >= hi or (folder and key_problem(folder[:-1]) is not None):
        return  # no key there
    dir_fd = open_folder(kv_fd, kv_path, folders)
    if dir_fd is not None:
        with closing_fd(dir_fd):
            yield from _walk(dir_fd, folder, lo, hi, _Listing(), kv_path.joinpath(*folders))


def keys_in(kv_fd: int, kv_path: Path, start: str, end: str | None) -> list[str]:
    """The keys k with start <= k < end (end None: start alone, if it is a key)."""
    hi = start + "\0" if end is None else end  # nothing sorts between a key and key + NUL
    same = next(
        (at for at, (a, b) in enumerate(zip(start, hi, strict=False)) if a != b), len(start)
    )
    folder = start[: start.rfind("/", 0, same) + 1]  # the deepest that holds the whole range
    return [key for key, _fd, _name in _walk_range(kv_fd, kv_path, folder, start, hi)]


def scan_tree(kv_fd: int, kv_path: Path, scan: Scan) -> ScanResult:
    """Backend.scan in the tree: each value measured before it is read."""
    taker = ScanTaker(scan.bound)
    lo = max(scan.prefix, scan.after + "\0")  # after `after`, from the prefix on
    hi = prefix_end(scan.prefix) if scan.prefix else _END
    for key, dir_fd, name in _walk_range(kv_fd, kv_path, scan.prefix, lo, hi):
        if taker.full:
            return taker.result(more=True)
        value = _read_upto(dir_fd, name, kv_path / key, scan.bound.entry_bytes)
        if isinstance(value, int):
            taker.left_out(key, value)
        elif value is not None:
            taker.take(key, value)
    return taker.result()


# -- writing: under the lock -------------------------------------------------------


def _clear_folder_at(dir_fd: int, name: str, path: Path) -> None:
    """Remove an empty directory where a key's file goes (a rename cannot replace one)."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise StoreError(f"{path} is a folder with something in it: remove it") from exc
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # absent, or a file: as it should be
            raise


def prepare(root_fd: int, kv_fd: int, kv_path: Path, ops: Ops) -> None:
    """Check that ops can be applied, before anything is: each temp file is there, and each
    key's folder is (made) a directory with no folder in place of its file."""
    written = [key for key, tmp in ops if tmp is not None]
    parents = {key[:at] for key in written for at, char in enumerate(key) if char == "/"}
    if clash := parents.intersection(written):
        raise ValueError(f"key {min(clash)!r} is another key's folder in the same commit")
    for key, tmp in ops:
        if tmp is None:
            continue
        try:
            os.stat(tmp, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise StoreError(
                f"temporary file {tmp} vanished before its commit (swept as stale?)"
            ) from exc
        *folders, name = key.split("/")
        dir_fd = open_folder(kv_fd, kv_path, folders, create=True)
        assert dir_fd is not None  # create: made, or CorruptRecord
        with closing_fd(dir_fd):
            _clear_folder_at(dir_fd, name, kv_path / key)


def _put(root_fd: int, kv_fd: int, kv_path: Path, key: str, tmp: str) -> None:
    *folders, name = key.split("/")
    dir_fd = open_folder(kv_fd, kv_path, folders, create=True)
    assert dir_fd is not None
    with closing_fd(dir_fd):
        try:
            os.replace(tmp, name, src_dir_fd=root_fd, dst_dir_fd=dir_fd)
        except FileNotFoundError:
            return  # renamed already: this is a replay
        except IsADirectoryError:  # planted since prepare: an empty one goes
            _clear_folder_at(dir_fd, name, kv_path / key)
            os.replace(tmp, name, src_dir_fd=root_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)


def _remove(kv_fd: int, kv_path: Path, key: str) -> None:
    """Remove key's file, and the folders that leaves empty (no folder is a key)."""
    *folders, name = key.split("/")
    fds = [os.dup(kv_fd)]
    try:
        for folder in folders:
            child = open_folder(fds[-1], kv_path, [folder])
            if child is None:
                return  # removed already
            fds.append(child)
        try:
            os.unlink(name, dir_fd=fds[-1])
            os.fsync(fds[-1])
        except FileNotFoundError:
            pass  # removed already; its folders may not be yet
        for depth in range(len(folders), 0, -1):
            try:
                os.rmdir(folders[depth - 1], dir_fd=fds[depth - 1])
            except OSError:
                break  # not empty
            os.fsync(fds[depth - 1])
    finally:
        for fd in fds:
            os.close(fd)


def apply(root_fd: int, kv_fd: int, kv_path: Path, ops: Ops) -> None:
    """Make each key's final state; as harmless to repeat as to do once."""
    for key, tmp in ops:
        if tmp is None:
            _remove(kv_fd, kv_path, key)
        else:
            _put(root_fd, kv_fd, kv_path, key, tmp)
        failpoint("file_backend.commit.after_op")


def write_log(root_fd: int, ops: Ops) -> None:
    data = json.dumps(ops, separators=(",", ":")).encode()
    if len(data) > _MAX_LOG_BYTES:
        raise StoreError(f"a commit of {len(ops)} writes is more than one redo log takes")
    atomic_write(root_fd, LOG_NAME, data)


def remove_log(root_fd: int) -> None:
    # Durably: a log replayed after a later commit would remove that commit's keys.
    os.unlink(LOG_NAME, dir_fd=root_fd)
    os.fsync(root_fd)


def _parse_log(data: bytes) -> Ops | None:
    """The ops of a redo log we wrote, or None for anything else."""
    try:
        ops = json.loads(data)
    except ValueError:
        return None
    good = isinstance(ops, list) and all(
        isinstance(op, list)
        and len(op) == 2
        and isinstance(op[0], str)
        and key_problem(op[0]) is None
        and (op[1] is None or (isinstance(op[1], str) and _TEMP_NAME.fullmatch(op[1])))
        for op in ops
    )
    return [(key, tmp) for key, tmp in ops] if good else None


def replay(root_fd: int, kv_fd: int, root: Path) -> None:
    """Finish the commit a redo log left in the root says (a crash cut it short)."""
    path = root / LOG_NAME
    try:
        data = read_file(root_fd, LOG_NAME, path, _MAX_LOG_BYTES)
        ops = None if data is None else _parse_log(data)
    except CorruptRecord:
        data, ops = b"", None
    if data is None:
        return
    if ops is None:  # never ours (ours are renamed into place whole): set it aside
        aside = f"{LOG_NAME}.unreadable-{secrets.token_hex(4)}"
        os.rename(LOG_NAME, aside, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        log.error("%s is no redo log of ours: moved aside as %s", path, aside)
        return
    log.warning("finishing a commit cut short (%d writes, %s)", len(ops), path)
    apply(root_fd, kv_fd, root / KV_NAME, ops)
    remove_log(root_fd)
