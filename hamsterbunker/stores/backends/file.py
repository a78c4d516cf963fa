"""The file backend: the embedded default store's keys in a directory on one machine.

Layout under the root::

    kv/<segment>/.../<segment>   one file per key, each ``/`` segment a directory
    .lock                        locked (OFD fcntl) across each commit's compare and writes
    .redo                        a commit's writes while they are made (``file_redo``)
    tmp-hb-<hex>                 values written and synced before the lock is taken

Readers take no lock. How a commit is made durable and whole: docs/design.md, "The file
backend"; how a watch follows its folder: "The file backend's watch".
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import stat
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path

from ...core.blob import Blob, BlobPieces
from ...core.errors import CorruptRecord, StoreError, StoreUnavailable
from ...core.failpoints import failpoint, not_stopped_inside
from ...core.limits import STALE_TEMP_AGE_S
from ...core.read_bounds import ReadBound
from ..backend import Get, Notice, Put, Scan, ScanResult, TooLarge, Txn, TxnResult, key_problem
from ..base import StoreGuarantees
from ..dirs import fileio
from ..dirs.lease_watch import open_lease_watch
from ..dirs.location import check_location, is_sync_copy, mount_of, open_root
from .earlier import earlier_store
from .file_redo import INLINE_BYTES, Ops, log_pending
from .file_tree import KV_NAME, KeyTree, set_aside

__all__ = ["GUARANTEES", "FileBackend", "earlier_layout"]

GUARANTEES = StoreGuarantees(
    mutual_exclusion="an OFD fcntl lock on the root's .lock, held across each commit's compare "
    "and writes: real on a local filesystem and on NFS with working lockd; none on a synced "
    "folder (refused)",
    durability="a commit of one key: its value and folder fsynced before it returns; of more: "
    "their redo log fdatasynced, then the file system synced (syncfs) before it returns; a "
    "commit a crash cut short is finished by the next one",
    across_hosts="only through NFS mounted with noac (or actimeo=0) and lookupcache=none",
)

_LOCK_NAME = ".lock"
# struct flock for F_OFD_SETLK: whole file, write lock, l_pid 0 (Linux, 64-bit off_t), the
# lock the earlier file store took: NFS takes it to the server (lockd).
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
# O_NONBLOCK: a FIFO planted there fails the open (ENXIO) instead of waiting for a writer.
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LOCK_POLL_S = 0.002
_WATCH_RETRY_S = 0.5  # how often a watch looks for kv/ until it is made
_os_errors = fileio.os_errors_as_store_errors("file backend")
_EARLIER_NAMES = ("cluster.json", "agents")  # the earlier file store's, at the root


class FileBackend:
    """Keys as files under ``<root>/kv/``; commits serialized by a lock file in the root."""

    guarantees = GUARANTEES
    capabilities: frozenset[str] = frozenset()  # readers may see a commit's writes one by one

    def __init__(
        self,
        root: str | Path,
        *,
        create: bool = True,
        lock_timeout: float = 2.0,
        in_synced_folder: bool = False,
        read_only: bool = False,
    ) -> None:
        """create: make the root if need be and tidy it (a node), else it must be there (a
        reader such as ``hb status``); in_synced_folder: the root is a syncdir node's subtree
        (a synced folder is otherwise refused); read_only: commits that write are refused."""
        if create and read_only:
            raise ValueError("a file backend opened read_only creates nothing")
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()
        self.lock_timeout = lock_timeout
        self.read_only = read_only
        self._next_sweep = 0.0  # monotonic
        open_root(self.root, create=create)  # ConfigError naming the path and the fix
        if (found := earlier_layout(self.root)) is not None:
            raise earlier_store(f"store directory {self.root}", found)
        # StoreUnsafe in a synced folder, unless it is a syncdir node's subtree.
        self.warnings: list[str] = check_location(self.root, in_synced_folder=in_synced_folder)
        if create:  # make kv/, finish a crash's redo log, sweep old temp files
            try:
                self.commit(Txn())
            except StoreError as exc:
                fileio.log.warning("could not tidy the store directory %s: %s", self.root, exc)

    @_os_errors
    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        _check_key(key)
        with self._opened_root() as root_fd:
            return KeyTree(root_fd, self.root).read(key, max_bytes)

    @_os_errors
    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        _check_prefix(prefix)
        with self._opened_root() as root_fd:
            return KeyTree(root_fd, self.root).scan(Scan(prefix, bound, after))

    def commit(self, txn: Txn) -> TxnResult:
        _check_txn(txn)
        if self.read_only and txn.all_writes:
            raise StoreError(f"file backend {self.root} was opened to read: it writes nothing")
        try:
            return self._commit(txn)
        except _MakerFailed as failed:  # the caller's own error, as its blob raised it
            raise failed.args[0] from None

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """Notices from the prefix's folder, or the deepest of it there is, with a gap
        (Notice(None)) each time the watch moved (docs/design.md, "The file backend's watch")."""
        _check_prefix(prefix)
        folders = prefix.split("/")[:-1]
        gap = False
        while True:
            watched = self._deepest_folder(folders)
            if watched is None:  # no kv/ yet (a reader opened the store)
                gap = True
                await asyncio.sleep(_WATCH_RETRY_S)
                continue
            async with contextlib.aclosing(self._changes(prefix, watched)) as batches:
                async for keys in batches:
                    if gap:
                        gap = False
                        yield Notice(None)
                    for key in keys:
                        yield Notice(key)
            gap = True

    async def _changes(self, prefix: str, watched: tuple[Path, int]) -> AsyncGenerator[list[str]]:
        """The keys under prefix changed, batch by batch (the first may be empty), while the
        folder watched stays the deepest of prefix's there is."""
        import watchfiles  # only here: a node that never watches never loads it

        folders, kv = prefix.split("/")[:-1], self.root / KV_NAME
        name_start = prefix.rsplit("/", 1)[-1]  # "" for a folder
        names = None
        if name_start and watched[0] == kv.joinpath(*folders):
            names = open_lease_watch(watched[0], lambda name: name.startswith(name_start))
        if names is not None:
            async with contextlib.aclosing(names):  # closed even if never iterated
                yield []
                async for _ in names:  # ends when the folder goes
                    yield [prefix]
            return
        polling = mount_of(self.root).fstype.startswith("nfs")
        changes = watchfiles.awatch(
            watched[0], watch_filter=None, step=20, debounce=200, force_polling=polling,
            poll_delay_ms=100, rust_timeout=1000, yield_on_timeout=True,
        )  # fmt: skip
        with contextlib.suppress(FileNotFoundError):  # gone before it was watched
            async with contextlib.aclosing(changes) as batches:
                async for batch in batches:
                    keys = {os.path.relpath(path, kv) for _change, path in batch}
                    yield sorted(k for k in keys if k.startswith(prefix) and not key_problem(k))
                    if self._deepest_folder(folders) != watched:
                        return

    def check(self) -> None:
        """StoreUnavailable unless the root is a directory this process can read."""
        with self._opened_root():
            pass

    def close(self) -> None:
        """Nothing to release: no descriptor outlives a call."""

    @_os_errors
    def _commit(self, txn: Txn) -> TxnResult:
        with self._opened_root() as root_fd:
            tree = KeyTree(root_fd, self.root)
            if self.read_only:  # no lock; a redo log is left to the machine that wrote it
                return TxnResult(_compared(tree, txn), _reads(tree, txn))
            values: list[str | bytes] = []  # each Put's: a temp file, or its value inline
            several = len(txn.writes) > 1  # then small values go in the redo log
            try:
                for put in [write for write in txn.writes if isinstance(write, Put)]:
                    if several and isinstance(put.value, bytes) and len(put.value) <= INLINE_BYTES:
                        values.append(put.value)
                    else:
                        value = _maker_errors_kept(put.value)
                        values.append(
                            fileio.write_temp(root_fd, value, True, "file_backend.commit")
                        )
                failpoint("file_backend.commit.before_lock")
                # A node stopped at a failpoint must not hold the lock: see failpoints.
                with not_stopped_inside(), self._locked(root_fd):
                    os.close(fileio.make_subdir(root_fd, KV_NAME, self.root / KV_NAME))
                    tree.replay()
                    self._sweep_now_and_then(root_fd)
                    succeeded = _compared(tree, txn)
                    if succeeded:
                        tree.write(_plan(tree, txn, values))
                        try:
                            _tidy(tree, txn)
                        except (OSError, StoreError) as exc:  # made: only the tidy-up is not
                            fileio.log.warning("a tidy-up in %s left undone: %s", self.root, exc)
                    return TxnResult(succeeded, _reads(tree, txn))
            finally:
                # The temps left (the commit failed, or wrote others over them) go, unless a
                # redo log is left, which may name them. One gone is renamed, or never was.
                if not log_pending(self.root):
                    for tmp in [value for value in values if isinstance(value, str)]:
                        fileio.discard(root_fd, tmp)

    @contextlib.contextmanager
    def _opened_root(self) -> Iterator[int]:
        """The root, open; StoreUnavailable naming it if gone or unreadable (no empty store)."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreUnavailable(f"store directory {self.root}: {exc.strerror}") from exc
        with fileio.closing_fd(fd):
            yield fd

    @contextlib.contextmanager
    def _locked(self, root_fd: int) -> Iterator[None]:
        """Hold the root's lock, waiting at most lock_timeout (then StoreUnavailable)."""
        path = self.root / _LOCK_NAME
        try:
            fd = fileio.open_regular(root_fd, _LOCK_NAME, path, _LOCK_FLAGS)
        except CorruptRecord as exc:  # planted: while it stood, no commit could ever lock
            set_aside(root_fd, _LOCK_NAME, str(exc))
            fd = fileio.open_regular(root_fd, _LOCK_NAME, path, _LOCK_FLAGS)
        with fileio.closing_fd(fd):  # closing it releases the lock
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EAGAIN):
                        raise StoreUnavailable(f"cannot lock {path}: {exc.strerror}") from exc
                    if time.monotonic() >= deadline:
                        raise StoreUnavailable(
                            f"file backend {self.root}: {path} is locked by another writer "
                            f"for over {self.lock_timeout} s"
                        ) from None
                    time.sleep(_LOCK_POLL_S)
            yield

    def _sweep_now_and_then(self, root_fd: int) -> None:
        """Remove the temp files crashed writers left, every STALE_TEMP_AGE_S at most."""
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + STALE_TEMP_AGE_S
        try:
            fileio.sweep_temps(root_fd, self.root)
        except OSError as exc:  # housekeeping: a failure is only logged
            fileio.log.warning("could not remove old temp files in %s: %s", self.root, exc)

    def _deepest_folder(self, folders: list[str]) -> tuple[Path, int] | None:
        """The deepest of kv/, kv/folders[0], ... that is a directory, and its inode."""
        found, path = None, self.root
        for name in (KV_NAME, *folders):
            path /= name
            try:
                info = os.lstat(path)
            except OSError:
                break
            if not stat.S_ISDIR(info.st_mode):
                break
            found = (path, info.st_ino)
        return found


def earlier_layout(root: Path) -> str | None:
    """What marks root as the earlier file store's (its records, and no keys), or None."""
    if os.path.lexists(root / KV_NAME):
        return None
    found = [name for name in _EARLIER_NAMES if os.path.lexists(root / name)]
    return " and ".join(found) + " at its root" if found else None


def _compared(tree: KeyTree, txn: Txn) -> bool:
    """Whether every compare of txn holds (read no further than its value: TooLarge differs)."""
    return all(tree.read(c.key, len(c.value or b"")) == c.value for c in txn.compares)


def _reads(tree: KeyTree, txn: Txn) -> list[bytes | TooLarge | ScanResult | None]:
    return [
        tree.read(r.key, r.max_bytes) if isinstance(r, Get) else tree.scan(r) for r in txn.reads
    ]


def _tidy(tree: KeyTree, txn: Txn) -> None:
    """Remove what txn's tidy-up covers, unsynced: a crash may leave it (``Txn.tidy``)."""
    if txn.tidy:
        failpoint("file_backend.commit.before_tidy")
    for removal in txn.tidy:
        for key in tree.keys_in(removal.start, removal.end):
            tree.remove(key)


def _plan(tree: KeyTree, txn: Txn, values: list[str | bytes]) -> Ops:
    """Each key's final state after txn's writes (one entry per key)."""
    final: dict[str, str | bytes | None] = {}
    made = iter(values)
    for write in txn.writes:
        if isinstance(write, Put):
            final[write.key] = next(made)
            continue
        end = write.start + "\0" if write.end is None else write.end
        for key in [k for k in final if write.start <= k < end]:
            del final[key]  # written earlier in this commit: as on disk again
        final.update((key, None) for key in tree.keys_in(write.start, write.end))
    return list(final.items())


class _MakerFailed(Exception):
    """What a Put's blob maker raised (args[0]), carried past _os_errors."""


def _maker_errors_kept(value: Blob) -> Blob:
    """value, with what making its pieces raises carried as _MakerFailed."""
    if not isinstance(value, BlobPieces):
        return value

    def pieces() -> Iterator[bytes]:
        try:
            yield from value
        except Exception as exc:
            raise _MakerFailed(exc) from exc

    return BlobPieces(len(value), pieces())


def _check_key(key: str) -> None:
    """ValueError for a key that breaks the key rules: before anything touches the disk."""
    problem = key_problem(key)
    if problem is None and is_sync_copy(key):
        problem = f"key {key[:80]!r} is named as sync tools name their conflict copies"
    if problem is not None:
        raise ValueError(problem)


def _check_prefix(prefix: str) -> None:
    """ValueError unless prefix is "", a key's folder ("/"-terminated) or a key's start."""
    if prefix and key_problem(prefix.removesuffix("/")) is not None:
        raise ValueError(f"a prefix is '', a folder or the start of a key, not {prefix[:80]!r}")


def _check_txn(txn: Txn) -> None:
    one_key = [w for w in txn.all_writes if isinstance(w, Put) or w.end is None]
    keys = [w.key if isinstance(w, Put) else w.start for w in one_key]
    keys += [c.key for c in txn.compares] + [r.key for r in txn.reads if isinstance(r, Get)]
    for key in keys:
        _check_key(key)
    for read in txn.reads:
        if isinstance(read, Scan):
            _check_prefix(read.prefix)
