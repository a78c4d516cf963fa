"""The file store's tail: only appended event bytes and changed heartbeat files are read.

Each node appends to ``events/<node>.jsonl`` and, when it is full, renames it
to ``<node>.jsonl.1`` and starts a new one. We remember, per node, which file
(inode) we read up to which byte: appended lines are read from there; after a
rotation the rest of the old file is read from ``.1`` (if it is still that
file), then the new one from the start. Heartbeat files are replaced whole,
so a changed inode, size or mtime tells us which to read again.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import CorruptRecord, StoreError
from ..records import Event, Heartbeat
from ..tail import TailRead
from .file import _EVENTS, _HEARTBEAT, _is_sync_copy

__all__ = ["FileTail"]


@dataclass(frozen=True)
class _Position:
    """How far one node's event log has been read."""

    inode: int
    # The segment's first complete line (empty until it has one). With the inode
    # it tells a segment apart from a later one given the same inode number.
    head: bytes
    offset: int  # bytes consumed: always just after a complete line
    last_n: int  # the highest event number returned for this node


class FileTail:
    def __init__(self, agent_dir: Path) -> None:
        self._events_dir = agent_dir / "events"
        self._heartbeats_dir = agent_dir / "heartbeats"
        self._positions: dict[str, _Position] = {}
        self._beats: dict[str, tuple[tuple[int, int, int], Heartbeat | None]] = {}

    def read(self) -> TailRead:
        try:
            return TailRead(self._new_events(), self._heartbeats())
        except OSError as exc:
            raise StoreError(f"store I/O failed: {exc}") from exc

    # -- events --------------------------------------------------------------

    def _new_events(self) -> list[Event]:
        events: list[Event] = []
        positions: dict[str, _Position | None] = dict(self._positions)
        for node, name in _records(self._events_dir, _EVENTS):
            new, positions[node] = self._node_events(
                node, self._events_dir / name, positions.get(node)
            )
            events.extend(new)
        # Kept only once every log was read: after an error, the next read starts over.
        self._positions = {node: p for node, p in positions.items() if p is not None}
        return events

    def _node_events(
        self, node: str, current: Path, position: _Position | None
    ) -> tuple[list[Event], _Position | None]:
        try:
            file = current.open("rb")
        except FileNotFoundError:
            return [], position  # rotated away this instant: the next read finds it
        with file:
            inode = os.fstat(file.fileno()).st_ino
            last_n = position.last_n if position else 0
            lines: list[bytes] = []
            if position is not None and _is_segment(file, inode, position):
                offset, head = position.offset, position.head
            else:
                # First sight, or rotated since: what we have not read of the old
                # segment is in .1 now. If .1 is not that segment either (rotated
                # twice, or a new store in its place), everything in .1 is new.
                rest = _rest_of(current.with_name(current.name + ".1"), position)
                if rest is None:
                    rest, last_n = _read_from(current.with_name(current.name + ".1"), 0), 0
                lines += _complete_lines(rest)[0]
                offset, head = 0, b""
            file.seek(offset)
            new_lines, consumed = _complete_lines(file.read())
        if offset == 0 and new_lines:
            head = new_lines[0]
        lines += new_lines
        events = []
        for line in lines:
            try:
                event = Event.from_json(line)
            except CorruptRecord:
                continue
            if event.node == node and event.n > last_n:
                events.append(event)
                last_n = event.n
        return events, _Position(inode, head, offset + consumed, last_n)

    # -- heartbeats ----------------------------------------------------------

    def _heartbeats(self) -> list[Heartbeat]:
        seen = {}
        for node, name in _records(self._heartbeats_dir, _HEARTBEAT):
            path = self._heartbeats_dir / name
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            cached = self._beats.get(name)
            if cached is None or cached[0] != signature:
                cached = (signature, _heartbeat(path, node))
            seen[name] = cached
        self._beats = seen  # removed heartbeats drop out
        return [beat for _, beat in seen.values() if beat is not None]


def _records(directory: Path, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(node, file name) of each node's record file in directory, sync copies left out."""
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries)
    except FileNotFoundError:
        return []
    matches = ((pattern.fullmatch(name), name) for name in names if not _is_sync_copy(name))
    return [(match[1], name) for match, name in matches if match]


def _is_segment(file: BinaryIO, inode: int, position: _Position) -> bool:
    """Whether the open file is the segment position was taken in."""
    if inode != position.inode:
        return False
    head = position.head
    return not head or os.pread(file.fileno(), len(head), 0) == head


def _rest_of(path: Path, position: _Position | None) -> bytes | None:
    """What follows position in path, if path is the segment position was taken in."""
    if position is None:
        return None
    try:
        with path.open("rb") as file:
            if not _is_segment(file, os.fstat(file.fileno()).st_ino, position):
                return None
            file.seek(position.offset)
            return file.read()
    except FileNotFoundError:
        return None


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read()
    except FileNotFoundError:
        return b""


def _complete_lines(data: bytes) -> tuple[list[bytes], int]:
    """The complete lines of data and the bytes they take; a line still being written waits."""
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(), end


def _heartbeat(path: Path, node: str) -> Heartbeat | None:
    try:
        beat = Heartbeat.from_json(path.read_bytes())
    except (FileNotFoundError, CorruptRecord):
        return None
    return beat if beat.node == node else None
