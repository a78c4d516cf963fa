"""The file store: a directory on one machine or on NFS (the embedded default).

Layout under the root::

    cluster.json                         key material (created once, atomically)
    agents/<agent>/lease.json            the lease record
    agents/<agent>/lease.lock            POSIX lock held across read-check-write
    agents/<agent>/checkpoints/ckpt-<seq>-<epoch>.hbc
    agents/<agent>/heartbeats/<node>.json
    agents/<agent>/events/<node>.jsonl   (+ <node>.jsonl.1, the previous segment)

Compare-and-set is real: an fcntl lock on ``lease.lock`` (plus a thread lock,
since POSIX locks do not exclude threads of one process) is held across
read-check-write of the lease and across the fence check and rename of a
checkpoint. Writes are temp file in the same directory, fsync, rename, fsync
of the directory. Only names matching our own patterns are ever read, so
editor backups and sync-conflict copies are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import re
import secrets
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ..errors import (
    ConfigError,
    CorruptRecord,
    Fenced,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
    StoreUnsafe,
)
from ..failpoints import failpoint
from ..records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from .base import Fence, StoreGuarantees

if TYPE_CHECKING:
    from .file_tail import FileTail

__all__ = ["FileStore", "Mount", "mount_of"]

log = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"ckpt-(\d{20})-(\d{10})\.hbc")
_HEARTBEAT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.json")
_EVENTS = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.jsonl")
# Temporary names start with "tmp-hb-": no editor or sync tool uses that shape,
# and no reader pattern above matches it.
_TMP_PREFIX = "tmp-hb-"
# struct flock for F_OFD_SETLK: whole file, write lock, l_pid 0 (Linux, 64-bit off_t).
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_SYNC_MARKERS = (".stfolder", ".dropbox", ".dropbox.cache", ".sync", ".nextcloudsync.log")

GUARANTEES = StoreGuarantees(
    mutual_exclusion="OFD fcntl locks: real on a local filesystem and on NFS with working lockd; "
    "none on a synced folder (refused). A node frozen while it holds the lock (about a "
    "millisecond per write) holds up the others until it resumes or dies",
    durability="file and directory fsync before a write is acknowledged",
    across_hosts="only through NFS mounted with noac (or actimeo=0) and lookupcache=none",
)


_UNAVAILABLE = {errno.ETIMEDOUT, errno.ESTALE, errno.EIO, errno.ENOTCONN, errno.EHOSTDOWN}
P = ParamSpec("P")
R = TypeVar("R")


def _os_errors_as_store_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Translate OSError (disk full, permissions, a stale NFS handle) at the store boundary."""

    @functools.wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            message = f"file store {method.__name__}: {exc.strerror or exc}{where}"
            error = StoreUnavailable if exc.errno in _UNAVAILABLE else StoreError
            raise error(message) from exc

    return translated


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, data: bytes, durable: bool, points: str = "") -> Path:
    """Write data to a new temporary file in directory; points names its failpoints."""
    tmp = directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if points:
            failpoint(f"{points}.after_temp_write")
        if durable:
            os.fsync(fd)
        if points:
            failpoint(f"{points}.after_temp_fsync")
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def _atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    tmp = _write_temp(path.parent, data, durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class Mount:
    fstype: str
    source: str
    point: str
    options: str  # per-mount and superblock options, comma-separated


def mount_of(path: Path) -> Mount:
    """The mount holding path (the longest matching mount point in /proc/self/mountinfo)."""
    best = Mount("", "", "", "")
    target = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or len(rfields) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.point):
            best = Mount(rfields[0], rfields[1], point, fields[5] + "," + rfields[2])
    return best


class FileStore:
    """A store in a local or NFS directory."""

    guarantees = GUARANTEES

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_checkpoints: int = 5,
        events_per_segment: int = 1000,
        lock_timeout: float = 2.0,
        create: bool = True,
    ) -> None:
        self.root = Path(path).absolute()
        self.url = self.root.as_uri()
        self.keep_checkpoints = keep_checkpoints
        self.events_per_segment = events_per_segment
        self.lock_timeout = lock_timeout
        self.warnings: list[str] = []
        self._event_counts: dict[tuple[str, str], int] = {}
        self._ready_agents: set[str] = set()
        if create:
            try:
                self.root.mkdir(exist_ok=True)
            except FileNotFoundError as exc:
                raise ConfigError(
                    f"store directory {self.root}: its parent does not exist"
                ) from exc
            except OSError as exc:
                raise StoreUnavailable(f"store directory {self.root}: {exc.strerror}") from exc
        elif not self.root.exists():
            raise ConfigError(f"store directory {self.root} does not exist")
        if not self.root.is_dir():
            raise ConfigError(f"store path {self.root} is not a directory")
        self._check_location()

    def _check_location(self) -> None:
        for folder in (self.root, *self.root.parents):
            for marker in _SYNC_MARKERS:
                if (folder / marker).exists():
                    raise StoreUnsafe(
                        f"store directory {self.root} is inside a synced folder ({folder / marker} "
                        "found): sync tools give no mutual exclusion, so two nodes could both "
                        "lead. Use a local directory, NFS, etcd or Redis."
                    )
        mount = mount_of(self.root)
        if mount.fstype.startswith("nfs"):
            opts = set(mount.options.split(","))
            if not ({"noac", "actimeo=0"} & opts and "lookupcache=none" in opts):
                self.warnings.append(
                    f"store directory {self.root} is on NFS without noac (or actimeo=0) and "
                    "lookupcache=none: attribute caching can hide lease renewals for seconds. "
                    "Mount it with -o noac,lookupcache=none."
                )

    # -- paths -------------------------------------------------------------

    def _agent_dir(self, agent: str) -> Path:
        """The agent's directory, for reading: it may not exist yet."""
        return self.root / "agents" / check_name("agent id", agent)

    def _writable_dir(self, agent: str) -> Path:
        """The agent's directory, created on the first write (reads never create it)."""
        directory = self._agent_dir(agent)
        if agent not in self._ready_agents:
            for sub in ("checkpoints", "heartbeats", "events"):
                (directory / sub).mkdir(parents=True, exist_ok=True)
            self._ready_agents.add(agent)
        return directory

    @contextlib.contextmanager
    def _locked(self, agent: str) -> Iterator[Path]:
        """Hold the agent's lease lock: an open-file-description (OFD) POSIX lock.

        OFD locks belong to the open file, not the process, so they exclude
        other threads and other FileStore objects of this process as well as
        other processes and (through lockd) other NFS clients. Classic POSIX
        locks would not: every fd of one process shares one lock.
        """
        directory = self._writable_dir(agent)
        fd = os.open(directory / "lease.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EAGAIN):
                        raise StoreUnavailable(f"cannot lock {directory}: {exc.strerror}") from exc
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"lease lock of {agent!r} held elsewhere for {self.lock_timeout} s"
                        ) from exc
                    time.sleep(0.002)
            yield directory
        finally:
            os.close(fd)  # closing the description releases its lock

    # -- cluster -----------------------------------------------------------

    @_os_errors_as_store_errors
    def read_cluster(self) -> ClusterRecord | None:
        data = _read(self.root / "cluster.json")
        return None if data is None else ClusterRecord.from_json(data)

    @_os_errors_as_store_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        target = self.root / "cluster.json"
        tmp = _write_temp(self.root, record.to_json(), durable=True)
        try:
            os.link(tmp, target)  # fails if it exists: atomic create-if-absent, NFS included
            _fsync_dir(self.root)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        stored = self.read_cluster()
        if stored is None:
            raise StoreError(f"cluster record vanished from {self.root}")
        return stored

    # -- lease -------------------------------------------------------------

    @_os_errors_as_store_errors
    def read_lease(self, agent: str) -> LeaseRecord | None:
        data = _read(self._agent_dir(agent) / "lease.json")
        return None if data is None else LeaseRecord.from_json(data)

    @_os_errors_as_store_errors
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        directory = self._writable_dir(agent)
        stored = replace(new, version=(expected_version or 0) + 1)
        # Written and synced before the lock: the lock is held only for
        # read-compare-rename, so a node paused or slowed in here holds up
        # the others as briefly as possible.
        tmp = _write_temp(directory, stored.to_json(), durable=True)
        try:
            with self._locked(agent):
                data = _read(directory / "lease.json")
                current = None if data is None else LeaseRecord.from_json(data)
                current_version = None if current is None else current.version
                if current_version != expected_version:
                    raise LeaseConflict(
                        f"lease of {agent!r} is at version {current_version}, "
                        f"not {expected_version}"
                    )
                os.replace(tmp, directory / "lease.json")
                _fsync_dir(directory)
                return stored
        finally:
            tmp.unlink(missing_ok=True)

    # -- checkpoints -------------------------------------------------------

    @_os_errors_as_store_errors
    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: bytes) -> CheckpointInfo:
        directory = self._writable_dir(agent) / "checkpoints"
        # The bytes are written and synced before taking the lock, so a large
        # checkpoint never holds up lease renewals; only check + rename are locked.
        tmp = _write_temp(directory, blob, durable=True, points="checkpoint")
        try:
            failpoint("checkpoint.before_commit")
            with self._locked(agent) as agent_dir:
                data = _read(agent_dir / "lease.json")
                lease = None if data is None else LeaseRecord.from_json(data)
                if lease is None or (lease.holder, lease.session, lease.epoch) != (
                    fence.holder,
                    fence.session,
                    fence.epoch,
                ):
                    now = (
                        "no lease"
                        if lease is None
                        else f"epoch {lease.epoch} held by {lease.holder}"
                    )
                    raise Fenced(
                        f"checkpoint {seq} of {fence.holder} under epoch {fence.epoch} refused: "
                        f"the lease is now {now}"
                    )
                existing = self._scan_checkpoints(directory)
                if existing and existing[0].seq >= seq:
                    raise StoreError(
                        f"checkpoint sequence must increase: {seq} is not above {existing[0].seq}"
                    )
                final = directory / f"ckpt-{seq:020d}-{fence.epoch:010d}.hbc"
                os.replace(tmp, final)
                failpoint("checkpoint.after_rename")
                _fsync_dir(directory)
                failpoint("checkpoint.after_dir_fsync")
                for old in existing[self.keep_checkpoints - 1 :]:
                    (directory / _checkpoint_name(old)).unlink(missing_ok=True)
                return CheckpointInfo(
                    epoch=fence.epoch, seq=seq, size=len(blob), written=time.time()
                )
        finally:
            tmp.unlink(missing_ok=True)

    def _scan_checkpoints(self, directory: Path) -> list[CheckpointInfo]:
        found = []
        for entry in _entries(directory):
            match = _CHECKPOINT.fullmatch(entry.name)
            if not match:
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # pruned by the writer while we listed
            found.append(
                CheckpointInfo(
                    epoch=int(match[2]), seq=int(match[1]), size=st.st_size, written=st.st_mtime
                )
            )
        return sorted(found, key=lambda info: info.seq, reverse=True)

    @_os_errors_as_store_errors
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        return self._scan_checkpoints(self._agent_dir(agent) / "checkpoints")

    @_os_errors_as_store_errors
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        path = self._agent_dir(agent) / "checkpoints" / _checkpoint_name(info)
        data = _read(path)
        if data is None:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        return data

    # -- heartbeats --------------------------------------------------------

    @_os_errors_as_store_errors
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        check_name("node id", heartbeat.node)
        path = self._writable_dir(agent) / "heartbeats" / f"{heartbeat.node}.json"
        # Atomic but not fsynced: a heartbeat lost in a crash is rewritten next tick.
        _atomic_write(path, heartbeat.to_json(), durable=False)

    @_os_errors_as_store_errors
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        directory = self._agent_dir(agent) / "heartbeats"
        beats = []
        for name in sorted(entry.name for entry in _entries(directory)):
            match = _HEARTBEAT.fullmatch(name)
            if not match or _is_sync_copy(name) or (data := _read(directory / name)) is None:
                continue
            try:
                beat = Heartbeat.from_json(data)
            except CorruptRecord as exc:
                log.warning("ignoring unreadable heartbeat %s: %s", directory / name, exc)
                continue
            if beat.node == match[1]:  # a copy under another name is not that node's
                beats.append(beat)
        return beats

    @_os_errors_as_store_errors
    def remove_heartbeat(self, agent: str, node: str) -> None:
        check_name("node id", node)
        (self._agent_dir(agent) / "heartbeats" / f"{node}.json").unlink(missing_ok=True)

    # -- events ------------------------------------------------------------

    @_os_errors_as_store_errors
    def append_event(self, agent: str, event: Event) -> None:
        check_name("node id", event.node)
        directory = self._writable_dir(agent) / "events"
        current = directory / f"{event.node}.jsonl"
        key = (agent, event.node)
        if key not in self._event_counts:
            data = _read(current)
            self._event_counts[key] = 0 if data is None else data.count(b"\n")
        if self._event_counts[key] >= self.events_per_segment:
            # Bounded: the previous segment is replaced, so at most two remain.
            os.replace(current, directory / f"{event.node}.jsonl.1")
            self._event_counts[key] = 0
        # Only this node appends to this file (NFS has no atomic append across clients).
        with open(current, "ab") as out:
            out.write(event.to_json() + b"\n")
        self._event_counts[key] += 1

    @_os_errors_as_store_errors
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        directory = self._agent_dir(agent) / "events"
        events: list[Event] = []
        for name in sorted(entry.name for entry in _entries(directory)):
            match = _EVENTS.fullmatch(name)
            if not match or _is_sync_copy(name):
                continue
            node = match[1]
            found: dict[int, Event] = {}
            # Current segment first, then the previous one: if the writer rotates
            # between the two reads, the rotated events are still found.
            for segment in (name, f"{name}.1"):
                data = _read(directory / segment) or b""
                for line in data.splitlines():
                    if not line.endswith(b"}"):
                        continue  # a line still being appended
                    try:
                        event = Event.from_json(line)
                    except CorruptRecord:
                        continue
                    if event.node == node and event.n > after.get(node, 0):
                        found.setdefault(event.n, event)
            events.extend(found[n] for n in sorted(found))
        return events

    # -- watch -------------------------------------------------------------

    async def watch(self, agent: str, *, lease_only: bool = False) -> AsyncIterator[None]:
        import watchfiles

        # A watch only reads: it waits for a node to make the directory rather than
        # making it, so a monitor with a mistyped agent id creates nothing.
        directory = self._agent_dir(agent)
        while not directory.is_dir():
            await asyncio.sleep(0.5)
        on_nfs = mount_of(self.root).fstype.startswith("nfs")
        # The lease record lives in the agent directory itself; watching only that
        # directory (not its checkpoints, heartbeats and events) keeps a standby
        # from waking on every write of every node.
        async for _changes in watchfiles.awatch(
            directory,
            watch_filter=_is_lease_change if lease_only else _watch_filter,
            step=20,
            debounce=200,
            force_polling=on_nfs,  # inotify sees nothing from other NFS clients
            poll_delay_ms=100,
            recursive=not lease_only,
        ):
            yield None

    def tail(self, agent: str) -> FileTail:
        """Follow the agent's events and heartbeats, reading only what changed."""
        from .file_tail import FileTail

        return FileTail(self._agent_dir(agent))

    def close(self) -> None:
        pass


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    """The directory's entries; none if it does not exist (yet)."""
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except FileNotFoundError:
        return []


def _is_sync_copy(name: str) -> bool:
    """Syncthing, Dropbox and Nextcloud conflict copies: never one of our records."""
    return ".sync-conflict-" in name or "conflicted copy" in name or "(conflict" in name


def _is_lease_change(_change: object, path: str) -> bool:
    return os.path.basename(path) == "lease.json"


def _watch_filter(_change: object, path: str) -> bool:
    name = os.path.basename(path)
    return not name.startswith(_TMP_PREFIX) and name != "lease.lock"


def _checkpoint_name(info: CheckpointInfo) -> str:
    return f"ckpt-{info.seq:020d}-{info.epoch:010d}.hbc"
