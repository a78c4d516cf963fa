"""Reading a store the earlier file store wrote, for ``hb migrate-store``: reads only.

Layout under the root, as that store wrote it::

    cluster.json                                          the cluster record
    agents/<agent>/lease.json, acceptance.json            the lease, a loss accepted
    agents/<agent>/checkpoints/ckpt-<seq:020>-<epoch:010>.hbc
    agents/<agent>/effects/<seq:020>/<index:04>-<kind>.hbe   a step's effect journal
    agents/<agent>/heartbeats/<node>.json
    agents/<agent>/inbox/...                              (``earlier.file_inbox``)

Each read answers as that store's did for the same files, bounded as it was; no link is
followed. A listing longer than that store could have made is refused (StoreError), so
a migration stops rather than copy less than there is.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from ...core.errors import ConfigError, CorruptRecord, UnreadableLease
from ...core.limits import (
    EFFECT_KINDS,
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINTS_LISTED,
    MAX_RECORD_BYTES,
    check_checkpoint_bounds,
    check_effect_bounds,
)
from ...core.read_bounds import EFFECTS_READ, HEARTBEATS_READ, BoundedRead
from ...records import CheckpointInfo, ClusterRecord, Heartbeat, LeaseRecord, check_name
from ...records.parsing import NAME_PATTERN
from .._reported import ReportedOnce
from ..base import MAX_LISTED_AGENTS, parse_lease
from ..dirs.fileio import dir_entries, file_kind, opened_dir, read_file
from ..dirs.location import SYNCDIR_MARKER, is_sync_copy, open_root
from . import common
from .file_inbox import InboxReader, checkpoint_name, listed, translated

__all__ = ["EarlierFileStore", "open_earlier_file"]

log = logging.getLogger("hamsterbunker.stores.earlier.file")

_AGENT_ENTRIES = 4 * MAX_LISTED_AGENTS  # the most entries of agents/ listed, as there
_CHECKPOINT = re.compile(r"ckpt-([0-9]{20})-([0-9]{10})\.hbc")
_HEARTBEAT = re.compile(rf"({NAME_PATTERN.pattern})\.json")
_HEARTBEAT_ENTRIES = 4 * HEARTBEATS_READ.count
_EFFECTS = {f"{index:04d}-{kind}.hbe": (index, kind) for index, kind in common.EVERY_EFFECT}
# Past this many entries in a step's directory only the names a record can have are tried.
_EFFECT_ENTRIES = 4 * len(common.EVERY_EFFECT)


def open_earlier_file(url: str) -> EarlierFileStore:
    """The earlier file store at url (file:///dir or a path), never made: ConfigError in
    one line if there is none there."""
    from .. import file_store_path

    root = Path(file_store_path(url) if "://" in url else url).absolute()
    open_root(root, create=False)  # ConfigError naming the path if absent or not a directory
    if (root / SYNCDIR_MARKER).exists():
        raise ConfigError(f"{root} is a syncdir store, which keeps its own layout: not migrated")
    if (root / "kv").exists():
        raise common.already_migrated(str(root), "kv/")
    if not (root / "cluster.json").exists() and not (root / "agents").exists():
        raise ConfigError(f"{root} holds no store an earlier version wrote (no cluster.json)")
    return EarlierFileStore(root)


class EarlierFileStore(InboxReader):
    """The reads ``hb migrate-store`` makes (``SourceStore``) of an earlier file store; the
    inbox's are InboxReader's."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, ReportedOnce(log))
        self.url = root.as_uri()

    def _agent(self, agent: str, *sub: str) -> tuple[Path, tuple[str, ...]]:
        parts = ("agents", check_name("agent id", agent), *sub)
        return self.root.joinpath(*parts), parts

    def _read_one(self, parts: tuple[str, ...], name: str, cap: int) -> bytes | None:
        """The file parts/name (None if it or its directory is absent)."""
        with opened_dir(self.root, parts) as fd:
            return (
                None if fd is None else read_file(fd, name, self.root.joinpath(*parts, name), cap)
            )

    @translated
    def read_cluster(self) -> ClusterRecord | None:
        data = self._read_one((), "cluster.json", MAX_RECORD_BYTES)
        return None if data is None else ClusterRecord.from_json(data)

    @translated
    def list_agents(self) -> list[str]:
        with opened_dir(self.root, ("agents",)) as fd:
            entries = [] if fd is None else dir_entries(fd, _AGENT_ENTRIES)
            names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        agents = (n for n in names if NAME_PATTERN.fullmatch(n) and not is_sync_copy(n))
        return sorted(agents)[:MAX_LISTED_AGENTS]

    @translated
    def read_lease(self, agent: str) -> LeaseRecord | None:
        path, parts = self._agent(agent)
        with opened_dir(self.root, parts) as fd:  # a symlink here: CorruptRecord, as there
            if fd is None:
                return None
            try:
                data = read_file(fd, "lease.json", path / "lease.json", MAX_RECORD_BYTES)
            except CorruptRecord as exc:
                raise UnreadableLease(str(exc), str(path / "lease.json")) from exc
        return None if data is None else parse_lease(data, lambda: str(path / "lease.json"))

    @translated
    def read_acceptance(self, agent: str) -> bytes | None:
        return self._read_one(self._agent(agent)[1], "acceptance.json", MAX_RECORD_BYTES)

    @translated
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        path, parts = self._agent(agent, "heartbeats")
        stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
        with opened_dir(self.root, parts) as fd:
            if fd is None:
                return []
            for name in sorted(e.name for e in dir_entries(fd, _HEARTBEAT_ENTRIES)):
                match = _HEARTBEAT.fullmatch(name)
                if match is None or is_sync_copy(name):
                    continue
                if stored.full:
                    self._report(f"{path}: read the heartbeats of {len(stored.entries)} nodes only")
                    break
                try:
                    data = read_file(fd, name, path / name, HEARTBEATS_READ.entry_bytes)
                except CorruptRecord as exc:
                    self._report(f"skipped: {exc}")
                    continue
                if data is not None:
                    stored.offer(match[1], data)

        def report(node: str, exc: Exception) -> None:
            self._report(f"ignoring unreadable heartbeat {path / f'{node}.json'}: {exc}")

        return common.heartbeats(stored, report)

    @translated
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        path, parts = self._agent(agent, "checkpoints")
        found = []
        with opened_dir(self.root, parts) as fd:
            for entry in [] if fd is None else listed(fd, MAX_CHECKPOINTS_LISTED, path):
                match = _CHECKPOINT.fullmatch(entry.name)
                if match is None:
                    continue
                seq, epoch = int(match[1]), int(match[2])
                problem = check_checkpoint_bounds(seq, epoch, 0)
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                problem = problem or file_kind(st.st_mode)
                if problem is not None:
                    self._report(f"ignoring {path / entry.name}: {problem}")
                    continue
                found.append(
                    CheckpointInfo(epoch=epoch, seq=seq, size=st.st_size, written=st.st_mtime)
                )
        return common.newest_first(found)

    @translated
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        parts = self._agent(agent, "checkpoints")[1]
        data = self._read_one(parts, checkpoint_name(info.seq, info.epoch), MAX_CHECKPOINT_BYTES)
        if data is None:
            raise common.no_longer_retained(agent, info)
        return data

    @translated
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        if check_effect_bounds(seq, 0, EFFECT_KINDS[0], 0) is not None:
            return {}  # no step directory has this name
        path, parts = self._agent(agent, "effects", f"{seq:020d}")
        try:
            with opened_dir(self.root, parts) as fd:
                if fd is None:
                    return {}
                journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
                for index, kind in self._effect_names(fd, path):
                    name = f"{index:04d}-{kind}.hbe"
                    if journal.full:
                        break
                    try:
                        data = read_file(fd, name, path / name, EFFECTS_READ.entry_bytes)
                    except (CorruptRecord, PermissionError) as exc:
                        self._report(f"effect record left out: {exc}")
                        continue
                    if data is not None:
                        journal.offer((index, kind), data)
                return dict(journal.entries)
        except (CorruptRecord, PermissionError) as exc:
            self._report(f"effect journal left out: {exc}")
            return {}

    def _effect_names(self, fd: int, path: Path) -> list[tuple[int, str]]:
        entries = dir_entries(fd, _EFFECT_ENTRIES + 1)
        if len(entries) > _EFFECT_ENTRIES:
            self._report(f"{path} holds over {_EFFECT_ENTRIES} entries: reading record names")
            return common.EVERY_EFFECT
        return sorted(_EFFECTS[entry.name] for entry in entries if entry.name in _EFFECTS)

    def close(self) -> None:
        pass
