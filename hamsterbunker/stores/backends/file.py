"""The file backend: the embedded default store's keys in a directory on one machine.

Layout under the root::

    kv/<segment>/.../<segment>   one file per key, each ``/`` segment a directory
    .lock                        flock held across each commit's compare and writes
    .redo                        a commit's writes, while they are being made (``file_tree``)
    tmp-hb-<hex>                 values written before the lock; renamed into kv/

A commit writes and fsyncs its values to temp files before it takes the lock
(so a large one never holds up the others), then, under the lock, finishes a
redo log a crash left, compares, makes its writes (through a redo log where
they are more than one key: a crash leaves the store as before or as after),
and reads. Readers take no lock, so they may see a commit's writes one by one.
Nothing below the root is trusted: see ``file_tree``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from ...blob import Blob, BlobPieces
from ...errors import CorruptRecord, StoreError, StoreUnavailable
from ...failpoints import failpoint
from ...limits import STALE_TEMP_AGE_S
from ...read_bounds import ReadBound
from ..backend import (
    Compare,
    DeleteRange,
    Get,
    Notice,
    Put,
    Scan,
    ScanResult,
    TooLarge,
    Txn,
    TxnResult,
    key_problem,
)
from ..base import StoreGuarantees
from ..file.fileio import (
    closing_fd,
    discard,
    log,
    make_subdir,
    open_regular,
    os_errors_as_store_errors,
    sweep_temps,
    write_temp,
)
from ..file.layout import is_sync_copy
from ..file.location import check_location, mount_of, open_root
from . import file_tree
from .file_tree import KV_NAME, Ops, keys_in, read_key, scan_tree

__all__ = ["GUARANTEES", "FileBackend"]

GUARANTEES = StoreGuarantees(
    mutual_exclusion="flock on the root's .lock, held across each commit's compare and writes: "
    "real between the processes of one machine; none on a synced folder (refused)",
    durability="values, the redo log and directories fsynced before a commit returns; a commit "
    "a crash cut short is finished by the next one",
    across_hosts="none: one machine's directory (flock over NFS is not relied on)",
)

_LOCK_NAME = ".lock"
# O_NONBLOCK: a FIFO planted there fails the open (ENXIO) instead of waiting for a writer.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LOCK_POLL_S = 0.002
_WATCH_RETRY_S = 0.5  # a watch waits this long for kv/ to be made
_os_errors = os_errors_as_store_errors("file backend")


class FileBackend:
    """Keys as files under ``<root>/kv/``; commits serialized by a lock file in the root."""

    guarantees = GUARANTEES
    capabilities: frozenset[str] = frozenset()  # readers may see a commit's writes one by one

    def __init__(self, root: str | Path, *, create: bool = True, lock_timeout: float = 2.0) -> None:
        """create: make the root if need be (a node), else use it only if it is there (a
        reader such as ``hb status``, which also leaves a crash's redo log to a writer)."""
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()
        self.lock_timeout = lock_timeout
        self._kv_path = self.root / KV_NAME
        self._swept_at: float | None = None
        open_root(self.root, create=create)  # ConfigError naming the path and the fix
        self.warnings: list[str] = check_location(self.root)  # StoreUnsafe in a synced folder
        if create:  # make kv/, finish what a crash left, sweep old temp files
            try:
                self.commit(Txn())
            except StoreError as exc:
                log.warning("could not tidy the store directory %s: %s", self.root, exc)

    @_os_errors
    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        _check_key(key)
        with self._kv() as kv_fd:
            return None if kv_fd is None else read_key(kv_fd, self._kv_path, key, max_bytes)

    @_os_errors
    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        _check_prefix(prefix)
        with self._kv() as kv_fd:
            if kv_fd is None:
                return ScanResult()
            return scan_tree(kv_fd, self._kv_path, Scan(prefix, bound, after))

    def commit(self, txn: Txn) -> TxnResult:
        _check_txn(txn)
        try:
            return self._commit(txn)
        except _MakerFailed as failed:  # the caller's own error, as it raised it
            raise failed.error from None

    @_os_errors
    def _commit(self, txn: Txn) -> TxnResult:
        with self._opened_root() as root_fd:
            temps: list[str] = []
            logged: set[str] = set()  # temps a redo log names: the log's, never discarded
            try:
                for write in txn.writes:
                    if isinstance(write, Put):
                        value = _maker_errors_kept(write.value)
                        points = "file_backend.commit"
                        temps.append(write_temp(root_fd, value, durable=True, points=points))
                failpoint("file_backend.commit.before_lock")
                with (
                    self._locked(root_fd),
                    closing_fd(make_subdir(root_fd, KV_NAME, self._kv_path)) as kv_fd,
                ):
                    file_tree.replay(root_fd, kv_fd, self.root)
                    self._sweep_now_and_then(root_fd)
                    succeeded = all(self._holds(kv_fd, compare) for compare in txn.compares)
                    if succeeded:
                        ops = self._plan(kv_fd, txn, temps)
                        self._write(root_fd, kv_fd, ops, logged)
                    reads = [self._read(kv_fd, read) for read in txn.reads]
                    return TxnResult(succeeded, reads)
            finally:
                for tmp in temps:
                    if tmp not in logged:
                        discard(root_fd, tmp)

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """Notices from watchfiles (inotify; polling on NFS) on the prefix's folder, or on the
        deepest folder of it there is until it is made. The watch moves when that folder is
        made, removed (a range delete that empties it) or replaced; once it is in place
        again (its first batch, or a second of quiet), a gap: Notice(None)."""
        import watchfiles  # only here: a node that never watches never loads it

        _check_prefix(prefix)
        folders = prefix.split("/")[:-1]
        polling = mount_of(self.root).fstype.startswith("nfs")
        gap = False
        while True:
            watched = self._deepest_folder(folders)
            if watched is None:  # no kv/ yet (a reader opened the store)
                gap = True
                await asyncio.sleep(_WATCH_RETRY_S)
                continue
            changes = watchfiles.awatch(
                watched[0], watch_filter=None, step=20, debounce=200, force_polling=polling,
                poll_delay_ms=100, rust_timeout=1000, yield_on_timeout=True,
            )  # fmt: skip
            with contextlib.suppress(FileNotFoundError):  # gone before it was watched
                async with contextlib.aclosing(changes) as batches:
                    async for batch in batches:
                        if gap:
                            gap = False
                            yield Notice(None)
                        keys = {self._key_of(path) for _change, path in batch}
                        for key in sorted(k for k in keys if k and k.startswith(prefix)):
                            yield Notice(key)
                        if self._deepest_folder(folders) != watched:
                            break
            gap = True

    def check(self) -> None:
        """StoreUnavailable unless the root is a directory this process can read."""
        with self._opened_root():
            pass

    def close(self) -> None:
        """Nothing to release: no descriptor outlives a call."""

    # -- helpers ---------------------------------------------------------------

    @contextlib.contextmanager
    def _opened_root(self) -> Iterator[int]:
        """The root, open; StoreUnavailable naming it if it is gone or unreadable (reads
        would take a missing root for an empty store)."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreUnavailable(f"store directory {self.root}: {exc.strerror}") from exc
        with closing_fd(fd):
            yield fd

    @contextlib.contextmanager
    def _kv(self) -> Iterator[int | None]:
        """kv/ for reading; None until the first commit makes it."""
        with self._opened_root() as root_fd:
            kv_fd = file_tree.open_folder(root_fd, self.root, [KV_NAME])
            if kv_fd is None:
                yield None
                return
            with closing_fd(kv_fd):
                yield kv_fd

    @contextlib.contextmanager
    def _locked(self, root_fd: int) -> Iterator[None]:
        """Hold the root's lock, waiting at most lock_timeout (then StoreUnavailable)."""
        path = self.root / _LOCK_NAME
        try:
            fd = open_regular(root_fd, _LOCK_NAME, path, _LOCK_FLAGS)
        except CorruptRecord as exc:  # planted: while it stood, no commit could ever lock
            aside = f"{_LOCK_NAME}.planted-{secrets.token_hex(4)}"
            os.rename(_LOCK_NAME, aside, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            log.warning("%s: moved aside as %s", exc, aside)
            fd = open_regular(root_fd, _LOCK_NAME, path, _LOCK_FLAGS)
        with closing_fd(fd):  # closing it releases the lock
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreUnavailable(
                            f"file backend {self.root}: {path} is locked by another writer "
                            f"for over {self.lock_timeout} s"
                        ) from None
                    time.sleep(_LOCK_POLL_S)
            yield

    def _sweep_now_and_then(self, root_fd: int) -> None:
        """Remove temp files a crashed writer left, every STALE_TEMP_AGE_S at most. Under the
        lock, with no redo log left: no temp file a log names is taken."""
        now = time.monotonic()
        if self._swept_at is not None and now - self._swept_at < STALE_TEMP_AGE_S:
            return
        self._swept_at = now
        try:
            sweep_temps(root_fd, self.root)
        except OSError as exc:  # housekeeping: a failure is only logged
            log.warning("could not remove old temporary files in %s: %s", self.root, exc)

    def _holds(self, kv_fd: int, compare: Compare) -> bool:
        expected = compare.value
        found = read_key(kv_fd, self._kv_path, compare.key, len(expected or b""))
        return found is None if expected is None else found == expected

    def _plan(self, kv_fd: int, txn: Txn, temps: list[str]) -> Ops:
        """Each written key's final state (one entry per key)."""
        final: dict[str, str | None] = {}
        made = iter(temps)
        for write in txn.writes:
            if isinstance(write, Put):
                final[write.key] = next(made)
                continue
            end = write.start + "\0" if write.end is None else write.end
            for key in [k for k in final if write.start <= k < end]:
                del final[key]  # written earlier in this commit: it is as on disk now
            for key in keys_in(kv_fd, self._kv_path, write.start, write.end):
                final[key] = None
        return list(final.items())

    def _write(self, root_fd: int, kv_fd: int, ops: Ops, logged: set[str]) -> None:
        """Apply ops; through a redo log where they are more than one key (one rename or
        removal is atomic by itself)."""
        file_tree.prepare(root_fd, kv_fd, self._kv_path, ops)
        if len(ops) > 1:
            logged.update(tmp for _key, tmp in ops if tmp is not None)
            file_tree.write_log(root_fd, ops)
            failpoint("file_backend.commit.after_log")
        file_tree.apply(root_fd, kv_fd, self._kv_path, ops)
        if len(ops) > 1:
            failpoint("file_backend.commit.before_log_removed")
            file_tree.remove_log(root_fd)

    def _read(self, kv_fd: int, read: Get | Scan) -> bytes | TooLarge | ScanResult | None:
        if isinstance(read, Get):
            return read_key(kv_fd, self._kv_path, read.key, read.max_bytes)
        return scan_tree(kv_fd, self._kv_path, read)

    def _deepest_folder(self, folders: list[str]) -> tuple[Path, int] | None:
        """The deepest of kv/, kv/folders[0], ... that is a directory, and its inode."""
        found = None
        paths = [self._kv_path]
        for name in folders:
            paths.append(paths[-1] / name)
        for path in paths:
            try:
                info = os.lstat(path)
            except OSError:
                break
            if not stat.S_ISDIR(info.st_mode):
                break
            found = (path, info.st_ino)
        return found

    def _key_of(self, path: str) -> str | None:
        """The key at path (in kv/), or None if it is not a key's name."""
        key = os.path.relpath(path, self._kv_path)
        return key if key_problem(key) is None else None


class _MakerFailed(Exception):
    """What a Put's blob maker raised, carried past the translation of our own OSErrors."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _maker_errors_kept(value: Blob) -> Blob:
    """value, with whatever its maker raises carried in _MakerFailed."""
    if not isinstance(value, BlobPieces):
        return value

    def pieces() -> Iterator[bytes]:
        made = iter(value)
        while True:
            try:
                piece = next(made)
            except StopIteration:
                return
            except Exception as exc:
                raise _MakerFailed(exc) from exc
            yield piece

    return BlobPieces(len(value), pieces())


def _check_key(key: str) -> None:
    """ValueError for a key that breaks the key rules: before anything touches the disk."""
    problem = key_problem(key)
    if problem is None and is_sync_copy(key):
        problem = f"key {key[:80]!r} is named as sync tools name their conflict copies"
    if problem is not None:
        raise ValueError(problem)


def _check_prefix(prefix: str) -> None:
    if prefix and not (prefix.endswith("/") and key_problem(prefix[:-1]) is None):
        raise ValueError(f"a prefix is '' or a key's folder ending in '/', not {prefix[:80]!r}")


def _check_txn(txn: Txn) -> None:
    for compare in txn.compares:
        _check_key(compare.key)
    for write in txn.writes:
        if isinstance(write, Put):
            _check_key(write.key)
        elif isinstance(write, DeleteRange) and write.end is None:
            _check_key(write.start)
    for read in txn.reads:
        if isinstance(read, Get):
            _check_key(read.key)
        else:
            _check_prefix(read.prefix)
