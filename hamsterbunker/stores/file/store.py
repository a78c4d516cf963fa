"""The file store: a directory on one machine or on NFS (the embedded default).

Layout under the root::

    cluster.json                         key material (created once, atomically)
    agents/<agent>/lease.json            the lease record
    agents/<agent>/lease.lock            POSIX lock held across read-check-write
    agents/<agent>/acceptance.json       a loss accepted with ``hb accept-loss``
    agents/<agent>/checkpoints/ckpt-<seq>-<epoch>.hbc
    agents/<agent>/effects/<seq>/<index>-<kind>.hbe   effect journal, a directory per step
    agents/<agent>/inbox/...             admissions and consumption (``stores.file.inbox``)
    agents/<agent>/heartbeats/<node>.json
    agents/<agent>/events/<node>.jsonl   (+ <node>.jsonl.1, the previous segment)

Compare-and-set is real: an open-file-description fcntl lock on ``lease.lock``
(which, unlike a classic POSIX lock, excludes other threads of one process
too) is held across read-check-write of the lease, across the fence check and
rename of a checkpoint or of an effect-journal record, and across every write
of the inbox (an admission; the consumption a checkpoint commits). Writes are
temp file in the same directory, fsync, rename, fsync of the directory; a directory
the store creates is fsynced in its parent. Once a checkpoint is durable, the
effect journal of its step and of older ones is removed.
Only names matching our own patterns are ever read, so editor backups and
sync-conflict copies are ignored.

Whoever can write the directory can plant anything in it (DESIGN.md invariant
10): every open, read, rename and listing goes through ``fileio``, which
follows no symlink below the root and reads only regular files, each within a
cap: ``MAX_RECORD_BYTES`` for a lease, cluster, heartbeat or acceptance
record, ``MAX_CHECKPOINT_BYTES`` for a checkpoint, ``MAX_EFFECT_BYTES`` for an
effect-journal record, the inbox's caps (``stores.file.inbox_records``) for its
records, the store's ``segment_cap`` (at most ``MAX_SEGMENT_BYTES``) for an
event segment. Something else under one of our
names is a CorruptRecord: raised where the caller needs that record (lease,
cluster, checkpoint), logged once and skipped where it reads many (heartbeats,
events, listings, a step's effect journal).

One module per part: ``layout`` (names and caps, shared with the tail
in ``tail``), ``tree`` (directories), ``lease`` (the lease and
its lock), ``checkpoints``, ``effects`` (the effect journal), ``inbox`` and
``inbox_records`` (admissions, and the consumption a checkpoint commits),
``logs`` (heartbeats and events), ``location`` (synced folders and NFS),
``fileio`` (untrusted files).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from ...blob import Blob
from ...errors import ConfigError, StoreError, StoreUnavailable
from ...limits import INBOX_REPLIES_KEPT, MAX_RECORD_BYTES
from ...records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord
from .._reported import ReportedOnce
from ..base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    Store,
    StoreGuarantees,
    StoreReport,
)
from .checkpoints import CheckpointFiles
from .effects import EffectFiles
from .fileio import (
    TMP_PREFIX,
    atomic_write,
    dir_entries,
    discard,
    os_errors_as_store_errors,
    read_file,
    write_temp,
)
from .inbox import InboxFiles
from .layout import MAX_SEGMENT_BYTES, agent_parts, is_sync_copy, log
from .lease import cas_lease_in, lease_in, replace_unreadable_in
from .lease_watch import is_lease_name, lease_changes, open_lease_watch, term_changes
from .location import check_location, mount_of, open_root
from .logs import EventLogs, HeartbeatFiles
from .rewrites import FileRewrites
from .tail import FileTail
from .tree import StoreTree

__all__ = ["GUARANTEES", "FileStore"]

# An agent id as agents/ names it (records.check_name's pattern), and the most
# entries of agents/ that list_agents reads, whatever was planted there.
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_AGENT_ENTRIES = 4 * MAX_LISTED_AGENTS

GUARANTEES = StoreGuarantees(
    mutual_exclusion="OFD fcntl locks: real on a local filesystem and on NFS with working lockd; "
    "none on a synced folder (refused). A node frozen while it holds the lock (about a "
    "millisecond per write) holds up the others until it resumes or dies",
    durability="file and directory fsync before a write is acknowledged",
    across_hosts="only through NFS mounted with noac (or actimeo=0) and lookupcache=none",
)


# OSError (disk full, permissions, a stale NFS handle) at the store boundary.
_os_errors_as_store_errors = os_errors_as_store_errors("file store")


class FileStore(Store):
    """A store in a local or NFS directory."""

    guarantees = GUARANTEES

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_checkpoints: int = 5,
        events_per_segment: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
        lock_timeout: float = 2.0,
        create: bool = True,
        in_synced_folder: bool = False,
    ) -> None:
        """in_synced_folder: this store is one node's subtree of a syncdir store (only that
        node writes it): the synced folder around it is expected, and retention keeps
        the newest checkpoints of each epoch rather than of all (what another term of
        this node left behind may be a branch kept aside, for the operator)."""
        if keep_checkpoints < 1 or events_per_segment < 1 or keep_replies < 1:
            raise ConfigError(
                "keep_checkpoints, events_per_segment and keep_replies must be at least 1"
            )
        self.root = Path(path).absolute()
        self.url = self.root.as_uri()
        self.keep_checkpoints = keep_checkpoints
        self.events_per_segment = events_per_segment
        self.keep_replies = keep_replies
        # The most read of one event segment (see MAX_SEGMENT_BYTES).
        self.segment_cap = min(events_per_segment * MAX_RECORD_BYTES, MAX_SEGMENT_BYTES)
        self.lock_timeout = lock_timeout
        self._tree = StoreTree(self.root, ReportedOnce(log))  # its report is the tail's too
        self._inbox = InboxFiles(self._tree, keep_replies=keep_replies, lock_timeout=lock_timeout)
        self._checkpoints = CheckpointFiles(
            self._tree,
            self._inbox,
            keep=keep_checkpoints,
            lock_timeout=lock_timeout,
            per_epoch=in_synced_folder,
        )
        self._effects = EffectFiles(self._tree, lock_timeout=lock_timeout)
        self._rewrites = FileRewrites(self._tree, lock_timeout=lock_timeout)
        self._heartbeats = HeartbeatFiles(self._tree)
        self._events = EventLogs(
            self._tree, events_per_segment=events_per_segment, segment_cap=self.segment_cap
        )
        # Made if need be, and usable by this node: else one line naming the path and fix.
        open_root(self.root, create=create)
        self.warnings: list[str] = check_location(self.root, in_synced_folder=in_synced_folder)
        if create:  # sweep the root's old temp files; a reader (hb status) removes nothing
            try:
                with self._tree.writing():
                    pass
            except (OSError, StoreError) as exc:
                log.warning("could not remove old temporary files in %s: %s", self.root, exc)

    def check(self) -> None:
        """StoreUnavailable if the store directory is gone: reads would take it for an empty one."""
        try:
            mode = os.stat(self.root).st_mode
        except OSError as exc:
            raise StoreUnavailable(f"store directory {self.root}: {exc.strerror}") from exc
        if not stat.S_ISDIR(mode):
            raise StoreUnavailable(f"store path {self.root} is not a directory")

    def report(self) -> StoreReport:
        # Its watch is a watchfiles thread woken by every write in the agent's directory.
        return StoreReport(cheap_watch=False)

    # -- cluster -----------------------------------------------------------

    @_os_errors_as_store_errors
    def read_cluster(self) -> ClusterRecord | None:
        with self._tree.reading() as root_fd:
            if root_fd is None:
                return None
            data = read_file(root_fd, "cluster.json", self.root / "cluster.json", MAX_RECORD_BYTES)
        return None if data is None else ClusterRecord.from_json(data)

    @_os_errors_as_store_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        with self._tree.writing() as root_fd:
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

    @_os_errors_as_store_errors
    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        return self._rewrites.replace_cluster(expected, new)

    @_os_errors_as_store_errors
    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_checkpoint(agent, info, old, new)

    @_os_errors_as_store_errors
    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        return self._rewrites.reseal_effect(agent, seq, index, kind, old, new)

    @_os_errors_as_store_errors
    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_submission(agent, number, old, new)

    @_os_errors_as_store_errors
    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        return self._inbox.read_replies(agent, after, limit)

    @_os_errors_as_store_errors
    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return self._inbox.reseal_reply(agent, number, old, new)

    @_os_errors_as_store_errors
    def list_agents(self) -> list[str]:
        # A bounded read of agents/: a name that is no agent id, or no plain directory, is skipped.
        with self._tree.reading("agents") as agents_fd:
            if agents_fd is None:
                return []
            entries = dir_entries(agents_fd, limit=MAX_AGENT_ENTRIES)
            names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        agents = (n for n in names if AGENT_NAME.fullmatch(n) and not is_sync_copy(n))
        return sorted(agents)[:MAX_LISTED_AGENTS]

    # -- lease -------------------------------------------------------------

    @_os_errors_as_store_errors
    def read_lease(self, agent: str) -> LeaseRecord | None:
        with self._tree.reading(*agent_parts(agent)) as agent_fd:
            return None if agent_fd is None else lease_in(agent_fd, self._tree.agent_dir(agent))

    @_os_errors_as_store_errors
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        with self._tree.writing(*agent_parts(agent)) as agent_fd:
            return cas_lease_in(
                agent_fd, self._tree.agent_dir(agent), agent, expected_version, new,
                self.lock_timeout,
            )  # fmt: skip

    @_os_errors_as_store_errors
    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        with self._tree.writing(*agent_parts(agent)) as agent_fd:
            return replace_unreadable_in(
                agent_fd, self._tree.agent_dir(agent), agent, found, new, self.lock_timeout
            )

    # -- checkpoints -------------------------------------------------------

    @_os_errors_as_store_errors
    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        info = self._checkpoints.put(agent, fence, seq, blob, consumed)
        # Only now that the checkpoint is durable, and outside the lease lock; never raises.
        self._effects.remove_through(agent, seq)
        return info

    @_os_errors_as_store_errors
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        return self._checkpoints.retained(agent)

    @_os_errors_as_store_errors
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        return self._checkpoints.read(agent, info)

    # -- effect journal ----------------------------------------------------

    @_os_errors_as_store_errors
    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        self._effects.put(agent, fence, seq, index, kind, blob)

    @_os_errors_as_store_errors
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        return self._effects.read(agent, seq)

    # -- inbox -------------------------------------------------------------

    @_os_errors_as_store_errors
    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        return self._inbox.admit(agent, request_id, number, blob)

    @_os_errors_as_store_errors
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        return self._inbox.read_inbox(agent, after)

    @_os_errors_as_store_errors
    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids the inbox keeps, at most most (``stores.migrate``)."""
        return self._inbox.request_ids(agent, most)

    @_os_errors_as_store_errors
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        return self._inbox.read_admission(agent, request_id)

    # -- loss acceptance ---------------------------------------------------

    @_os_errors_as_store_errors
    def read_acceptance(self, agent: str) -> bytes | None:
        path = self._tree.agent_dir(agent) / "acceptance.json"
        with self._tree.reading(*agent_parts(agent)) as agent_fd:
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
        with self._tree.writing(*agent_parts(agent)) as agent_fd:
            atomic_write(agent_fd, "acceptance.json", data, durable=True)

    # -- heartbeats and events ---------------------------------------------

    @_os_errors_as_store_errors
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        self._heartbeats.put(agent, heartbeat)

    @_os_errors_as_store_errors
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        return self._heartbeats.current(agent)

    @_os_errors_as_store_errors
    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._heartbeats.remove(agent, node)

    @_os_errors_as_store_errors
    def append_event(self, agent: str, event: Event) -> None:
        self._events.append(agent, event)

    @_os_errors_as_store_errors
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        return self._events.read(agent, after)

    @_os_errors_as_store_errors
    def forget_node(self, agent: str, node: str) -> None:
        self._events.forget(agent, node)
        self._heartbeats.forget(agent, node)

    # -- watch and tail ----------------------------------------------------

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[None]:
        # A watch only reads: it waits for a node to make the directory rather than
        # making it, so a monitor with a mistyped agent id creates nothing. A symlink
        # planted there is not a directory to watch (and readers refuse it).
        directory = self._tree.agent_dir(agent)
        on_nfs = mount_of(self.root).fstype.startswith("nfs")
        while True:
            while not _is_plain_dir(directory):
                await asyncio.sleep(0.5)
            # inotify sees nothing from other NFS clients: there the watch polls.
            lease_watch = None if on_nfs or not lease_only else open_lease_watch(directory)
            if lease_watch is None:
                break
            # Read after the watch is set: no change slips between the two.
            term_changed = term_changes(directory) if terms_only else None
            async with contextlib.aclosing(lease_changes(lease_watch, term_changed)) as changes:
                async for _ in changes:  # closed with this watch: its inotify watch too
                    yield None
            # The directory went away (or was replaced): watch it again once it is back,
            # and look then, for the lease may have changed meanwhile.
            while not _is_plain_dir(directory):
                await asyncio.sleep(0.5)
            yield None
        # The lease record lives in the agent directory itself; watching only that
        # directory (not its checkpoints, heartbeats and events) keeps a standby
        # from waking on every write of every node. Renewals wake it here even with
        # terms_only (a hint may be spurious): reading NFS on the event loop could hang.
        import watchfiles  # only here: a standby on a local disk never loads it

        async for _changes in watchfiles.awatch(
            directory,
            watch_filter=_is_lease_change if lease_only else _watch_filter,
            # Changes are yielded after `step` ms of quiet; watchfiles' thread also wakes
            # every `step` while idle (the lease watch uses inotify where it can).
            step=20,
            debounce=200,
            force_polling=on_nfs,
            poll_delay_ms=100,
            recursive=not lease_only,
        ):
            yield None

    def tail(self, agent: str) -> FileTail:
        """Follow the agent's events and heartbeats, reading only what changed."""
        return FileTail(self._tree, agent, segment_cap=self.segment_cap)

    def close(self) -> None:
        pass


def _is_plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _is_lease_change(_change: object, path: str) -> bool:
    return is_lease_name(os.path.basename(path))


def _watch_filter(_change: object, path: str) -> bool:
    name = os.path.basename(path)
    return not name.startswith(TMP_PREFIX) and name != "lease.lock"
