"""The file store: a directory on one machine or on NFS (the embedded default).

Layout under the root::

    cluster.json                         key material (created once, atomically)
    agents/<agent>/lease.json            the lease record
    agents/<agent>/lease.lock            POSIX lock held across read-check-write
    agents/<agent>/acceptance.json       a loss accepted with ``hb accept-loss``
    agents/<agent>/checkpoints/ckpt-<seq>-<epoch>.hbc
    agents/<agent>/heartbeats/<node>.json
    agents/<agent>/events/<node>.jsonl   (+ <node>.jsonl.1, the previous segment)

Compare-and-set is real: an open-file-description fcntl lock on ``lease.lock``
(which, unlike a classic POSIX lock, excludes other threads of one process
too) is held across read-check-write of the lease and across the fence check
and rename of a checkpoint. Writes are temp file in the same directory, fsync, rename, fsync
of the directory; a directory the store creates is fsynced in its parent.
Only names matching our own patterns are ever read, so editor backups and
sync-conflict copies are ignored.

Whoever can write the directory can plant anything in it (DESIGN.md invariant
10): every open, read, rename and listing goes through ``_fileio``, which
follows no symlink below the root and reads only regular files, each within a
cap: ``MAX_RECORD_BYTES`` for a lease, cluster, heartbeat or acceptance
record, ``MAX_CHECKPOINT_BYTES`` for a checkpoint, the store's ``segment_cap``
(at most ``MAX_SEGMENT_BYTES``) for an event segment. Something else under one
of our names is a CorruptRecord: raised where the caller needs that record
(lease, cluster, checkpoint), logged once and skipped where it reads many
(heartbeats, events, listings).
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
import stat
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ..errors import (
    ConfigError,
    CorruptRecord,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
    StoreUnsafe,
)
from ..failpoints import failpoint
from ..limits import MAX_CHECKPOINT_BYTES, MAX_RECORD_BYTES, check_checkpoint_bounds
from ..records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from ._fileio import (
    TMP_PREFIX,
    atomic_write,
    closing_fd,
    dir_entries,
    discard,
    file_kind,
    make_subdir,
    open_regular,
    opened_dir,
    read_file,
    sweep_temps,
    write_all,
    write_temp,
)
from ._reported import ReportedOnce, readable
from .base import Fence, Store, StoreGuarantees, check_fence, check_own_epoch

if TYPE_CHECKING:
    from .file_tail import FileTail

__all__ = ["MAX_SEGMENT_BYTES", "FileStore", "Mount", "mount_of"]

log = logging.getLogger(__name__)

# Any digits are matched, so that a name with numbers we would never write is
# reported rather than silently passed over; only 20 + 10 digits in range count.
_CHECKPOINT = re.compile(r"ckpt-(\d+)-(\d+)\.hbc")
_HEARTBEAT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.json")
_EVENTS = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.jsonl")
# struct flock for F_OFD_SETLK: whole file, write lock, l_pid 0 (Linux, 64-bit off_t).
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_SYNC_MARKERS = (".stfolder", ".dropbox", ".dropbox.cache", ".sync", ".nextcloudsync.log")

# The most read of one event segment, by read_events, by append_event counting
# its lines, and by the tail per file per call. A store's own cap is
# events_per_segment * MAX_RECORD_BYTES (no segment of whole events is longer),
# but never above this: 16 MiB is a thousand events of 16 KiB each, while ours
# are a few hundred bytes.
MAX_SEGMENT_BYTES = 16 * 1024 * 1024
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted there fails the open (ENXIO) instead of waiting for a reader.
_APPEND_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)

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


class FileStore(Store):
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
        if keep_checkpoints < 1 or events_per_segment < 1:
            raise ConfigError("keep_checkpoints and events_per_segment must be at least 1")
        self.root = Path(path).absolute()
        self.url = self.root.as_uri()
        self.keep_checkpoints = keep_checkpoints
        self.events_per_segment = events_per_segment
        # The most read of one event segment (see MAX_SEGMENT_BYTES).
        self.segment_cap = min(events_per_segment * MAX_RECORD_BYTES, MAX_SEGMENT_BYTES)
        self.lock_timeout = lock_timeout
        self.warnings: list[str] = []
        self._event_counts: dict[tuple[str, str], int] = {}
        self._swept: set[tuple[str, ...]] = set()  # directories written through, and swept
        self._report = ReportedOnce(log)
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
        if create:  # sweep the root's old temp files; a reader (hb status) removes nothing
            try:
                with self._writing():
                    pass
            except (OSError, StoreError) as exc:
                log.warning("could not remove old temporary files in %s: %s", self.root, exc)

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

    # -- directories -------------------------------------------------------

    @staticmethod
    def _agent_parts(agent: str, *sub: str) -> tuple[str, ...]:
        return ("agents", check_name("agent id", agent), *sub)

    def _agent_dir(self, agent: str) -> Path:
        """The agent's directory, for messages and the watch: it may not exist yet."""
        return self.root.joinpath(*self._agent_parts(agent))

    def _reading(self, *parts: str) -> contextlib.AbstractContextManager[int | None]:
        """A descriptor of root/parts for reading; None if absent (reads never create)."""
        return opened_dir(self.root, parts)

    @contextlib.contextmanager
    def _writing(self, *parts: str) -> Iterator[int]:
        """A descriptor of root/parts for writing, made (durably) where absent.

        Only the directories a write needs are made, so that junk planted in
        place of one (say events/) stops only the writes that go there. The
        first write through a directory (per store object) sweeps its old temp files.
        """
        with opened_dir(self.root, parts, create=True) as fd:
            if fd is None:
                raise StoreError(f"store directory {self.root} does not exist (any longer)")
            self._sweep_once(parts, fd)
            yield fd

    def _writable_dir(self, agent: str) -> Path:
        """The agent's directory, made if absent (its path, for tools that watch it)."""
        with self._writing(*self._agent_parts(agent)):
            return self._agent_dir(agent)

    def _sweep_once(self, parts: tuple[str, ...], fd: int) -> None:
        """Remove old temp files in root/parts (open as fd), the first time it is written."""
        if parts in self._swept:
            return
        path = self.root.joinpath(*parts)
        try:
            sweep_temps(fd, path)
        except OSError as exc:  # housekeeping: a failure is only logged
            log.warning("could not remove old temporary files in %s: %s", path, exc)
        self._swept.add(parts)

    def _read_or_skip(self, dir_fd: int, name: str, path: Path, limit: int) -> bytes | None:
        """read_file, reporting (once) and skipping what is not a regular file within limit."""
        try:
            return read_file(dir_fd, name, path, limit)
        except CorruptRecord as exc:
            self._report(f"skipped: {exc}")
            return None

    @contextlib.contextmanager
    def _locked(self, agent_fd: int, agent: str) -> Iterator[None]:
        """Hold the agent's lease lock: an open-file-description (OFD) POSIX lock.

        OFD locks belong to the open file, not the process, so they exclude
        other threads and other FileStore objects of this process as well as
        other processes and (through lockd) other NFS clients. Classic POSIX
        locks would not: every fd of one process shares one lock.
        """
        path = self._agent_dir(agent) / "lease.lock"
        fd = open_regular(agent_fd, "lease.lock", path, _LOCK_FLAGS)
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EAGAIN):
                        raise StoreUnavailable(f"cannot lock {path}: {exc.strerror}") from exc
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"lease lock of {agent!r} held elsewhere for {self.lock_timeout} s"
                        ) from exc
                    time.sleep(0.002)
            yield
        finally:
            os.close(fd)  # closing the description releases its lock

    # -- cluster -----------------------------------------------------------

    @_os_errors_as_store_errors
    def read_cluster(self) -> ClusterRecord | None:
        with self._reading() as root_fd:
            if root_fd is None:
                return None
            data = read_file(root_fd, "cluster.json", self.root / "cluster.json", MAX_RECORD_BYTES)
        return None if data is None else ClusterRecord.from_json(data)

    @_os_errors_as_store_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        with self._writing() as root_fd:
            tmp = write_temp(root_fd, record.to_json(), durable=True)
            try:
                # Fails if the name exists: atomic create-if-absent, NFS included.
                os.link(
                    tmp, "cluster.json", src_dir_fd=root_fd, dst_dir_fd=root_fd,
                    follow_symlinks=False,
                )  # fmt: skip
                os.fsync(root_fd)
            except FileExistsError:
                pass
            finally:
                discard(root_fd, tmp)
        stored = self.read_cluster()
        if stored is None:
            raise StoreError(f"cluster record vanished from {self.root}")
        return stored

    # -- lease -------------------------------------------------------------

    def _lease_in(self, agent_fd: int, agent: str) -> LeaseRecord | None:
        path = self._agent_dir(agent) / "lease.json"
        data = read_file(agent_fd, "lease.json", path, MAX_RECORD_BYTES)
        return None if data is None else LeaseRecord.from_json(data)

    @_os_errors_as_store_errors
    def read_lease(self, agent: str) -> LeaseRecord | None:
        with self._reading(*self._agent_parts(agent)) as agent_fd:
            return None if agent_fd is None else self._lease_in(agent_fd, agent)

    @_os_errors_as_store_errors
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        stored = replace(new, version=(expected_version or 0) + 1)
        with self._writing(*self._agent_parts(agent)) as agent_fd:
            # Written and synced before the lock: the lock is held only for
            # read-compare-rename, so a node paused or slowed in here holds up
            # the others as briefly as possible.
            tmp = write_temp(agent_fd, stored.to_json(), durable=True)
            try:
                with self._locked(agent_fd, agent):
                    current = self._lease_in(agent_fd, agent)
                    current_version = None if current is None else current.version
                    if current_version != expected_version:
                        raise LeaseConflict(
                            f"lease of {agent!r} is at version {current_version}, "
                            f"not {expected_version}"
                        )
                    os.replace(tmp, "lease.json", src_dir_fd=agent_fd, dst_dir_fd=agent_fd)
                    os.fsync(agent_fd)
                    return stored
            finally:
                discard(agent_fd, tmp)

    # -- checkpoints -------------------------------------------------------

    @_os_errors_as_store_errors
    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: bytes) -> CheckpointInfo:
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob))
        if problem is not None:
            raise StoreError(problem)  # before anything is written
        path = self._agent_dir(agent) / "checkpoints"
        with (
            self._writing(*self._agent_parts(agent)) as agent_fd,
            closing_fd(make_subdir(agent_fd, "checkpoints", path)) as directory,
        ):
            self._sweep_once(self._agent_parts(agent, "checkpoints"), directory)
            # The bytes are written and synced before taking the lock, so a large
            # checkpoint never holds up lease renewals; only check + rename are locked.
            tmp = write_temp(directory, blob, durable=True, points="checkpoint")
            try:
                failpoint("checkpoint.before_commit")
                with self._locked(agent_fd, agent):
                    check_fence(self._lease_in(agent_fd, agent), fence, seq)
                    existing = self._scan_checkpoints(directory, path)
                    check_own_epoch(existing, fence.epoch, seq)
                    os.replace(
                        tmp, _checkpoint_name(seq, fence.epoch),
                        src_dir_fd=directory, dst_dir_fd=directory,
                    )  # fmt: skip
                    failpoint("checkpoint.after_rename")
                    os.fsync(directory)
                    failpoint("checkpoint.after_dir_fsync")
                    self._prune(directory, existing, seq)
                    return CheckpointInfo(
                        epoch=fence.epoch, seq=seq, size=len(blob), written=time.time()
                    )
            finally:
                discard(directory, tmp)

    def _prune(self, directory: int, existing: list[CheckpointInfo], seq: int) -> None:
        """Keep the new checkpoint and the newest keep_checkpoints - 1 others at or below seq.

        Nothing above seq is removed: it is junk, or a damaged checkpoint the
        caller skipped, and either is the runtime's to judge and report.
        """
        below = [info for info in existing if info.seq <= seq]
        for old in below[self.keep_checkpoints - 1 :]:
            discard(directory, _checkpoint_name(old.seq, old.epoch))

    def _scan_checkpoints(self, directory: int, path: Path) -> list[CheckpointInfo]:
        """The regular files under checkpoint names in range, newest first by (seq, epoch)."""
        found = []
        for entry in dir_entries(directory):
            match = _CHECKPOINT.fullmatch(entry.name)
            if not match:
                continue
            problem = _checkpoint_name_problem(match)
            if problem is not None:
                self._report(f"ignoring {path / entry.name}: {problem}")
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # pruned by the writer while we listed
            kind = file_kind(st.st_mode)
            if kind is not None:
                self._report(f"ignoring {path / entry.name}: {kind}, not a regular file")
                continue
            seq, epoch = int(match[1]), int(match[2])
            found.append(CheckpointInfo(epoch=epoch, seq=seq, size=st.st_size, written=st.st_mtime))
        return sorted(found, key=lambda info: (info.seq, info.epoch), reverse=True)

    @_os_errors_as_store_errors
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        with self._reading(*self._agent_parts(agent, "checkpoints")) as directory:
            if directory is None:
                return []
            return self._scan_checkpoints(directory, self._agent_dir(agent) / "checkpoints")

    @_os_errors_as_store_errors
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        name = _checkpoint_name(info.seq, info.epoch)
        path = self._agent_dir(agent) / "checkpoints" / name
        with self._reading(*self._agent_parts(agent, "checkpoints")) as directory:
            data = None if directory is None else read_file(
                directory, name, path, MAX_CHECKPOINT_BYTES
            )  # fmt: skip
        if data is None:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        return data

    # -- loss acceptance ---------------------------------------------------

    @_os_errors_as_store_errors
    def read_acceptance(self, agent: str) -> bytes | None:
        path = self._agent_dir(agent) / "acceptance.json"
        with self._reading(*self._agent_parts(agent)) as agent_fd:
            if agent_fd is None:
                return None
            return read_file(agent_fd, "acceptance.json", path, MAX_RECORD_BYTES)

    @_os_errors_as_store_errors
    def put_acceptance(self, agent: str, data: bytes) -> None:
        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(
                f"loss-acceptance record of {len(data)} bytes is above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        with self._writing(*self._agent_parts(agent)) as agent_fd:
            atomic_write(agent_fd, "acceptance.json", data, durable=True)

    # -- heartbeats --------------------------------------------------------

    @_os_errors_as_store_errors
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        check_name("node id", heartbeat.node)
        with self._writing(*self._agent_parts(agent, "heartbeats")) as directory:
            # Atomic but not fsynced: a heartbeat lost in a crash is rewritten next tick.
            atomic_write(directory, f"{heartbeat.node}.json", heartbeat.to_json(), durable=False)

    @_os_errors_as_store_errors
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        path = self._agent_dir(agent) / "heartbeats"
        stored: list[tuple[str, bytes]] = []
        with self._reading(*self._agent_parts(agent, "heartbeats")) as directory:
            if directory is None:
                return []
            for name in sorted(entry.name for entry in dir_entries(directory)):
                match = _HEARTBEAT.fullmatch(name)
                if not match or _is_sync_copy(name):
                    continue
                data = self._read_or_skip(directory, name, path / name, MAX_RECORD_BYTES)
                if data is not None:
                    stored.append((match[1], data))

        def report(node: str, _data: bytes, exc: Exception) -> None:
            self._report(f"ignoring unreadable heartbeat {path / f'{node}.json'}: {exc}")

        return list(readable(stored, Heartbeat.from_json, report))

    @_os_errors_as_store_errors
    def remove_heartbeat(self, agent: str, node: str) -> None:
        check_name("node id", node)
        with self._reading(*self._agent_parts(agent, "heartbeats")) as directory:
            if directory is not None:
                discard(directory, f"{node}.json")

    # -- events ------------------------------------------------------------

    @_os_errors_as_store_errors
    def append_event(self, agent: str, event: Event) -> None:
        check_name("node id", event.node)
        record = event.to_json()
        if len(record) > MAX_RECORD_BYTES:  # no reader would take it
            raise StoreError(
                f"event {event.type} of {len(record)} bytes is above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        path = self._agent_dir(agent) / "events"
        name = f"{event.node}.jsonl"
        key = (agent, event.node)
        with self._writing(*self._agent_parts(agent, "events")) as directory:
            if key not in self._event_counts:
                self._event_counts[key] = self._segment_events(directory, name, path / name)
            if self._event_counts[key] >= self.events_per_segment:
                # Bounded: the previous segment is replaced, so at most two remain.
                with contextlib.suppress(FileNotFoundError):  # removed by hand: nothing to move
                    os.replace(name, f"{name}.1", src_dir_fd=directory, dst_dir_fd=directory)
                self._event_counts[key] = 0
            # Only this node appends to this file (NFS has no atomic append across clients).
            try:
                out = open_regular(directory, name, path / name, _APPEND_FLAGS, 0o666)
            except CorruptRecord:
                self._event_counts.pop(key)  # counted again next time, and so moved aside
                raise
            with closing_fd(out):
                write_all(out, record + b"\n")
        self._event_counts[key] += 1

    def _segment_events(self, directory: int, name: str, path: Path) -> int:
        """The events in a node's current segment. Something there that is not a regular
        file within segment_cap counts as full, so that it is rotated away, never written."""
        try:
            data = read_file(directory, name, path, self.segment_cap)
        except CorruptRecord as exc:
            self._report(f"moving aside: {exc}")
            return self.events_per_segment
        return 0 if data is None else data.count(b"\n")

    @_os_errors_as_store_errors
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        path = self._agent_dir(agent) / "events"
        events: list[Event] = []

        def report(node: str, line: bytes, exc: Exception) -> None:
            self._report(f"ignoring an unreadable event in {path / node}.jsonl: {exc}")

        with self._reading(*self._agent_parts(agent, "events")) as directory:
            if directory is None:
                return []
            for name in sorted(entry.name for entry in dir_entries(directory)):
                match = _EVENTS.fullmatch(name)
                if not match or _is_sync_copy(name):
                    continue
                node = match[1]
                lines: list[tuple[str, bytes]] = []
                # Current segment first, then the previous one: if the writer rotates
                # between the two reads, the rotated events are still found.
                for segment in (name, f"{name}.1"):
                    data = self._read_or_skip(directory, segment, path / segment, self.segment_cap)
                    # A line not ending in "}" is still being appended.
                    lines += [
                        (node, line) for line in (data or b"").splitlines() if line.endswith(b"}")
                    ]
                found: dict[int, Event] = {}
                for event in readable(lines, Event.from_json, report):
                    if event.n > after.get(node, 0):
                        found.setdefault(event.n, event)
                events.extend(found[n] for n in sorted(found))
        return events

    # -- watch -------------------------------------------------------------

    async def watch(self, agent: str, *, lease_only: bool = False) -> AsyncIterator[None]:
        import watchfiles

        # A watch only reads: it waits for a node to make the directory rather than
        # making it, so a monitor with a mistyped agent id creates nothing. A symlink
        # planted there is not a directory to watch (and readers refuse it).
        directory = self._agent_dir(agent)
        while not _is_plain_dir(directory):
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

        check_name("agent id", agent)
        return FileTail(self.root, agent, segment_cap=self.segment_cap, report=self._report)

    def check(self) -> None:
        """StoreUnavailable if the store directory is gone: reads would take it for an empty one."""
        try:
            mode = os.stat(self.root).st_mode
        except OSError as exc:
            raise StoreUnavailable(f"store directory {self.root}: {exc.strerror}") from exc
        if not stat.S_ISDIR(mode):
            raise StoreUnavailable(f"store path {self.root} is not a directory")

    def close(self) -> None:
        pass


def _is_plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _is_sync_copy(name: str) -> bool:
    """Syncthing, Dropbox and Nextcloud conflict copies: never one of our records."""
    return ".sync-conflict-" in name or "conflicted copy" in name or "(conflict" in name


def _is_lease_change(_change: object, path: str) -> bool:
    return os.path.basename(path) == "lease.json"


def _watch_filter(_change: object, path: str) -> bool:
    name = os.path.basename(path)
    return not name.startswith(TMP_PREFIX) and name != "lease.lock"


def _checkpoint_name(seq: int, epoch: int) -> str:
    return f"ckpt-{seq:020d}-{epoch:010d}.hbc"


def _checkpoint_name_problem(match: re.Match[str]) -> str | None:
    """Why a name matching _CHECKPOINT is not one we could have written, or None."""
    seq_digits, epoch_digits = match[1], match[2]
    if (len(seq_digits), len(epoch_digits)) != (20, 10):
        return "a checkpoint name with other than 20 seq and 10 epoch digits"
    return check_checkpoint_bounds(int(seq_digits), int(epoch_digits), 0)
