"""The file backend's keys on disk, under ``<root>/kv/``: read trusting nothing below the
root, written through the redo log (``file_redo``) when a commit makes more than one key."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

from ...core.errors import CorruptRecord, StoreError, StoreUnavailable
from ...core.failpoints import failpoint
from ..backend import MAX_KEY_CHARS, Scan, ScanResult, ScanTaker, TooLarge, key_problem, prefix_end
from ..dirs import fileio
from ..dirs.location import is_sync_copy
from . import file_redo as redo
from .file_redo import Ops

__all__ = ["KV_NAME", "WALK_ENTRIES", "KeyTree", "set_aside"]

# How many times a lock-free scan lists again when a name it read is gone before its read.
SCAN_TRIES = 5
# The most directory entries one walk (a scan, the keys of a range delete) looks at: far
# above what the record layer keeps in one folder, so only planted junk reaches it.
WALK_ENTRIES = 1 << 17
KV_NAME = "kv"


class _Vanished(Exception):
    """A name a scan listed was gone when it came to read it."""


def set_aside(root_fd: int, name: str, why: str) -> None:
    """Rename what is at name in the root to a name nothing reads, for a person to look at."""
    aside = f"{name}.planted-{secrets.token_hex(4)}"
    os.rename(name, aside, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    fileio.log.error("%s: moved aside as %s", why, aside)


def _open_folder(dir_fd: int, path: Path, folders: Sequence[str]) -> int | None:
    """dir_fd's folders/... (dir_fd at path): None where one is absent or no directory (a
    symlink, a file)."""
    with contextlib.suppress(CorruptRecord):
        return fileio.open_dirs(dir_fd, path, folders)
    return None


def _read(dir_fd: int, name: str, path: Path, most: int) -> bytes | int | None:
    """fileio.read_upto, with what is no regular file (planted) read as no key."""
    with contextlib.suppress(CorruptRecord):
        return fileio.read_upto(dir_fd, name, path, most)
    return None


class KeyTree:
    """The keys under the root's kv/ (the root open as root_fd), read and written."""

    def __init__(self, root_fd: int, root: Path) -> None:
        self.root_fd, self.root, self.path = root_fd, root, root / KV_NAME

    def read(self, key: str, most: int) -> bytes | TooLarge | None:
        *folders, name = key.split("/")
        dir_fd = self._folder(folders)
        if dir_fd is None:
            return None
        with fileio.closing_fd(dir_fd):
            value = _read(dir_fd, name, self.path / key, most)
        return TooLarge(key, value) if isinstance(value, int) else value

    def scan(self, scan: Scan) -> ScanResult:
        """The keys as each folder's names were read, listed again where a name read is gone
        when its file is opened (a lock-free reader held up while commits went on);
        StoreUnavailable if that happens in each of SCAN_TRIES listings."""
        for _try in range(SCAN_TRIES):
            with contextlib.suppress(_Vanished):
                return self._scan_once(scan)
        raise StoreUnavailable(f"{self.path}: changed under each of {SCAN_TRIES} listings")

    def _scan_once(self, scan: Scan) -> ScanResult:
        taker = ScanTaker(scan.bound)
        lo = max(scan.prefix, scan.after + "\0")  # after `after`, from the prefix on
        hi = prefix_end(scan.prefix) if scan.prefix else "\x7f"  # keys are plain ASCII
        folder = scan.prefix[: scan.prefix.rfind("/") + 1]  # the prefix's, if it is no folder
        with contextlib.closing(self._walk(folder, lo, hi, strict=True)) as walk:
            for key, dir_fd, name in walk:
                if taker.full:
                    return taker.result(more=True)
                try:
                    value = fileio.read_upto(dir_fd, name, self.path / key, scan.bound.entry_bytes)
                except CorruptRecord:
                    continue  # no regular file (planted): no key, and no reason to list again
                if value is None:
                    raise _Vanished
                if isinstance(value, int):
                    taker.left_out(key, value)
                else:
                    taker.take(key, value)
        return taker.result()

    def keys_in(self, start: str, end: str | None) -> list[str]:
        """The keys k with start <= k < end (end None: start alone, if it is a key)."""
        if end is None:  # looked at alone, not listed with its folder
            return [] if self.read(start, 0) is None else [start]
        pairs = enumerate(zip(start, end, strict=False))
        same = next((at for at, (a, b) in pairs if a != b), len(start))
        folder = start[: start.rfind("/", 0, same) + 1]  # the deepest that holds the range
        return [key for key, _fd, _name in self._walk(folder, start, end)]

    def _walk(
        self, folder: str, lo: str, hi: str, strict: bool = False
    ) -> Generator[tuple[str, int, str]]:
        """(key, its folder open, file name) of each key lo <= key < hi below folder ("" or
        "/"-terminated), in key order; StoreError past WALK_ENTRIES directory entries.
        strict: _Vanished where a folder listed is gone when opened."""
        left = WALK_ENTRIES

        def walk(dir_fd: int, folder: str, path: Path) -> Iterator[tuple[str, int, str]]:
            nonlocal left
            found = fileio.dir_entries(dir_fd, left + 1)
            if len(found) > left:
                raise StoreError(f"{path}: more than {WALK_ENTRIES} directory entries in one walk")
            left -= len(found)
            names = []
            for entry in found:
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
                    child = _open_folder(dir_fd, path, [name[:-1]])
                    if child is None and strict:
                        raise _Vanished
                    if child is not None:  # else replaced since it was listed
                        with fileio.closing_fd(child):
                            yield from walk(child, key, path / name[:-1])

        folders = folder.split("/")[:-1]
        if lo >= hi or (folder and key_problem(folder[:-1]) is not None):
            return  # no key there
        dir_fd = self._folder(folders)
        if dir_fd is not None:
            with fileio.closing_fd(dir_fd):
                yield from walk(dir_fd, folder, self.path.joinpath(*folders))

    def _folder(self, folders: Sequence[str]) -> int | None:
        return _open_folder(self.root_fd, self.root, [KV_NAME, *folders])

    def _prepare(self, ops: Ops) -> None:
        """Fail now, before anything is written, where ops could not all be made: a temp file
        gone, a key's folder that is no directory, a folder where a key's file goes."""
        written = {key: op for key, op in ops if op is not None}
        parents = {key[:at] for key in written for at, char in enumerate(key) if char == "/"}
        if clash := parents.intersection(written):
            raise ValueError(f"key {min(clash)!r} is another key's folder in the same commit")
        for key, op in written.items():
            if isinstance(op, str):
                try:
                    os.stat(op, dir_fd=self.root_fd, follow_symlinks=False)
                except FileNotFoundError as exc:
                    raise StoreError(f"temporary file {op} is gone before its commit") from exc
            os.close(self._put_folder(key))

    def _apply(self, ops: Ops, durable: bool) -> None:
        """Make each key's final state, as harmless to repeat as to do once; durable (one op):
        its value and the folders changed fsynced, else left to the caller's syncfs."""
        changed: set[tuple[str, ...]] = set()
        for key, op in ops:
            if op is None:
                changed.update(self.remove(key))
            else:
                *folders, name = key.split("/")
                tmp = fileio.write_temp(self.root_fd, op, durable) if isinstance(op, bytes) else op
                with (
                    fileio.closing_fd(self._put_folder(key)) as dir_fd,
                    contextlib.suppress(FileNotFoundError),  # renamed already: a replay
                ):
                    os.replace(tmp, name, src_dir_fd=self.root_fd, dst_dir_fd=dir_fd)
                changed.add(tuple(folders))
            failpoint("file_backend.commit.after_op")
        for folder in changed if durable else ():
            opened = self._folder(folder)
            if opened is not None:  # else removed: the fsync of its parent keeps that
                with fileio.closing_fd(opened):
                    os.fsync(opened)

    def _put_folder(self, key: str) -> int:
        """The key's folder (open), made where absent, with no directory at the key's name (an
        empty one is removed: a rename cannot replace it)."""
        *folders, name = key.split("/")
        dir_fd = fileio.open_dirs(self.root_fd, self.root, [KV_NAME, *folders], create=True)
        assert dir_fd is not None  # with create: made, or CorruptRecord
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # no folder there: as it should be
                os.close(dir_fd)
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise StoreError(f"{self.path / key} is a folder with keys in it") from exc
                raise
        return dir_fd

    def remove(self, key: str) -> set[tuple[str, ...]]:
        """Remove key's file, then its folder if that leaves it empty, not the folders above
        (docs/design.md). The folders changed (not yet fsynced)."""
        *folders, name = key.split("/")
        changed: set[tuple[str, ...]] = set()
        for remove in (os.unlink, os.rmdir)[: 1 + bool(folders)]:
            dir_fd = self._folder(folders)
            if dir_fd is None:
                return changed  # removed already
            with fileio.closing_fd(dir_fd):
                try:
                    remove(name, dir_fd=dir_fd)
                    changed.add(tuple(folders))
                except FileNotFoundError:
                    pass  # removed already (a replay): its folder may not be
                except OSError as exc:
                    if remove is os.unlink or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    return changed  # a folder with something in it stays
            if folders:
                name = folders.pop()
        return changed

    def write(self, ops: Ops) -> None:
        """Make ops, through the redo log if they are more than one (one is atomic itself)."""
        self._prepare(ops)
        if len(ops) <= 1:
            self._apply(ops, durable=True)
            return
        if any(isinstance(op, str) for _key, op in ops):
            os.fsync(self.root_fd)  # the temp files' names, before a log that names them
        redo.write_log(self.root_fd, self.root, redo.encode(ops))
        failpoint("file_backend.commit.after_log")
        self._apply(ops, durable=False)
        redo.syncfs(self.root_fd)  # every key and folder at once, before the log goes
        failpoint("file_backend.commit.before_log_removed")
        redo.clear_log(self.root_fd, self.root)

    def replay(self) -> None:
        """Finish the commit a redo log in the root lists (a crash cut it short); set one
        aside, unapplied, that is no whole log of ours (cut short as written, or planted)."""
        path = self.root / redo.LOG_NAME
        try:
            data = fileio.read_file(self.root_fd, redo.LOG_NAME, path, redo.MAX_LOG_BYTES)
            ops = redo.decode(data) if data else None
            if data and ops is None:
                raise CorruptRecord(f"{path} is no whole redo log")
        except CorruptRecord as exc:
            set_aside(self.root_fd, redo.LOG_NAME, str(exc))
            return
        if ops is not None:
            fileio.log.warning("finishing a commit cut short (%d writes, %s)", len(ops), path)
            self._apply(ops, durable=False)
            redo.syncfs(self.root_fd)
            redo.clear_log(self.root_fd, self.root)
