"""The file store's heartbeats and event logs: ``heartbeats/<node>.json``, ``events/<node>.jsonl``.

A heartbeat file is replaced whole and not fsynced: one lost in a crash is
rewritten on the next tick. Each node appends to its own event log (NFS has no
atomic append across clients); when a segment holds ``events_per_segment``
events it is renamed to ``<node>.jsonl.1``, replacing the previous one, so at
most two segments remain. What is not a regular file within its cap under one
of these names is logged once and skipped. A read of the heartbeats lists at
most ``HEARTBEAT_ENTRIES`` names and takes them, by node id, through a
``BoundedRead`` of ``read_bounds.HEARTBEATS_READ``. ``hb forget`` unlinks a
node's files (a symlink itself, never its target; a directory planted there is
left).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from ...errors import CorruptRecord, StoreError
from ...limits import MAX_RECORD_BYTES
from ...read_bounds import HEARTBEATS_READ, BoundedRead
from ...records import Event, Heartbeat, check_name
from .._reported import readable
from .fileio import atomic_write, closing_fd, discard, open_regular, read_file, write_all
from .layout import EVENTS_NAME, HEARTBEAT_ENTRIES, HEARTBEAT_NAME, agent_parts, record_files
from .tree import StoreTree

__all__ = ["EventLogs", "HeartbeatFiles"]

# O_NONBLOCK: a FIFO planted there fails the open (ENXIO) instead of waiting for a reader.
_APPEND_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)


class HeartbeatFiles:
    """Store.put_heartbeat, list_heartbeats and remove_heartbeat in a store's tree."""

    def __init__(self, tree: StoreTree) -> None:
        self._tree = tree

    def put(self, agent: str, heartbeat: Heartbeat) -> None:
        check_name("node id", heartbeat.node)
        with self._tree.writing(*agent_parts(agent, "heartbeats")) as directory:
            atomic_write(directory, f"{heartbeat.node}.json", heartbeat.to_json(), durable=False)

    def current(self, agent: str) -> list[Heartbeat]:
        path = self._tree.agent_dir(agent) / "heartbeats"
        stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
        with self._tree.reading(*agent_parts(agent, "heartbeats")) as directory:
            if directory is None:
                return []
            for node, name in record_files(directory, HEARTBEAT_NAME, HEARTBEAT_ENTRIES):
                if stored.full:
                    self._tree.report(
                        f"{path}: read the heartbeats of the first {len(stored.entries)} nodes "
                        "only, the most one read takes"
                    )
                    break
                cap = HEARTBEATS_READ.entry_bytes
                data = self._tree.read_or_skip(directory, name, path / name, cap)
                if data is not None:
                    stored.offer(node, data)

        def report(node: str, _data: bytes, exc: Exception) -> None:
            self._tree.report(f"ignoring unreadable heartbeat {path / f'{node}.json'}: {exc}")

        return list(readable(stored.entries, Heartbeat.from_json, report))

    def remove(self, agent: str, node: str) -> None:
        check_name("node id", node)
        with self._tree.reading(*agent_parts(agent, "heartbeats")) as directory:
            if directory is not None:
                discard(directory, f"{node}.json")

    def forget(self, agent: str, node: str) -> None:
        """remove, for ``hb forget``: something planted there that is not a file is left."""
        check_name("node id", node)
        path = self._tree.agent_dir(agent) / "heartbeats"
        with self._tree.reading(*agent_parts(agent, "heartbeats")) as directory:
            if directory is not None:
                _remove_files(directory, [f"{node}.json"], path, self._tree.report)


class EventLogs:
    """Store.append_event and read_events in a store's tree, each node's log bounded."""

    def __init__(self, tree: StoreTree, *, events_per_segment: int, segment_cap: int) -> None:
        self._tree = tree
        self._per_segment = events_per_segment
        self._cap = segment_cap  # the most read of one segment
        self._counts: dict[tuple[str, str], int] = {}  # events in each current segment

    def append(self, agent: str, event: Event) -> None:
        check_name("node id", event.node)
        record = event.to_json()
        if len(record) > MAX_RECORD_BYTES:  # no reader would take it
            raise StoreError(
                f"event {event.type} of {len(record)} bytes is above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        path = self._tree.agent_dir(agent) / "events"
        name = f"{event.node}.jsonl"
        key = (agent, event.node)
        with self._tree.writing(*agent_parts(agent, "events")) as directory:
            if key not in self._counts:
                self._counts[key] = self._segment_events(directory, name, path / name)
            if self._counts[key] >= self._per_segment:
                # Bounded: the previous segment is replaced, so at most two remain.
                with contextlib.suppress(FileNotFoundError):  # removed by hand: nothing to move
                    os.replace(name, f"{name}.1", src_dir_fd=directory, dst_dir_fd=directory)
                self._counts[key] = 0
            # Only this node appends to this file (NFS has no atomic append across clients).
            try:
                out = open_regular(directory, name, path / name, _APPEND_FLAGS, 0o666)
            except CorruptRecord:
                self._counts.pop(key)  # counted again next time, and so moved aside
                raise
            with closing_fd(out):
                write_all(out, record + b"\n")
        self._counts[key] += 1

    def _segment_events(self, directory: int, name: str, path: Path) -> int:
        """The events in a node's current segment. Something there that is not a regular
        file within the cap counts as full, so that it is rotated away, never written."""
        try:
            data = read_file(directory, name, path, self._cap)
        except CorruptRecord as exc:
            self._tree.report(f"moving aside: {exc}")
            return self._per_segment
        return 0 if data is None else data.count(b"\n")

    def forget(self, agent: str, node: str) -> None:
        """Remove node's segments (``hb forget``), durably: its log starts afresh if it writes."""
        check_name("node id", node)
        path = self._tree.agent_dir(agent) / "events"
        with self._tree.reading(*agent_parts(agent, "events")) as directory:
            if directory is not None:
                names = [f"{node}.jsonl", f"{node}.jsonl.1"]
                if _remove_files(directory, names, path, self._tree.report):
                    os.fsync(directory)
        self._counts.pop((agent, node), None)

    def read(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        path = self._tree.agent_dir(agent) / "events"
        events: list[Event] = []

        def report(node: str, _line: bytes, exc: Exception) -> None:
            self._tree.report(f"ignoring an unreadable event in {path / node}.jsonl: {exc}")

        with self._tree.reading(*agent_parts(agent, "events")) as directory:
            if directory is None:
                return []
            for node, name in record_files(directory, EVENTS_NAME):
                lines: list[tuple[str, bytes]] = []
                # Current segment first, then the previous one: if the writer rotates
                # between the two reads, the rotated events are still found.
                for segment in (name, f"{name}.1"):
                    data = self._tree.read_or_skip(directory, segment, path / segment, self._cap)
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


def _remove_files(
    directory: int, names: list[str], path: Path, report: Callable[[str], None]
) -> bool:
    """Unlink each name in directory: a symlink itself, never what it points to. A directory
    planted under one of the names is not ours to remove: reported, left (readers skip it).
    Whether anything was removed."""
    removed = False
    for name in names:
        try:
            os.unlink(name, dir_fd=directory)
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            report(f"not removed: {path / name} is a directory")
            continue
        removed = True
    return removed
