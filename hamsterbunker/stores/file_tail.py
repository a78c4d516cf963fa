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

from ..errors import CorruptRecord, StoreError
from ..records import Event, Heartbeat
from ..tail import TailRead
from .file import _EVENTS, _HEARTBEAT, _is_sync_copy

__all__ = ["FileTail"]


@dataclass
class _Position:
    inode: int
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
        for node, name in _records(self._events_dir, _EVENTS):
            events.extend(self._node_events(node, self._events_dir / name))
        return events

    def _node_events(self, node: str, current: Path) -> list[Event]:
        position = self._positions.get(node)
        try:
            file = current.open("rb")
        except FileNotFoundError:
            return []  # rotated away this instant: the next read finds it
        with file:
            inode = os.fstat(file.fileno()).st_ino
            lines: list[bytes] = []
            if position is None or position.inode != inode:
                # First sight, or rotated since: what we have not read of the old
                # file is in .1 now, unless it rotated twice (then read .1 whole).
                previous = current.with_name(current.name + ".1")
                start = position.offset if position and _inode(previous) == position.inode else 0
                lines += _complete_lines(_read_from(previous, start))[0]
                offset = 0
            else:
                offset = position.offset
            file.seek(offset)
            new_lines, consumed = _complete_lines(file.read())
            lines += new_lines
        last_n = position.last_n if position else 0
        self._positions[node] = _Position(inode, offset + consumed, last_n)
        events = []
        for line in lines:
            try:
                event = Event.from_json(line)
            except CorruptRecord:
                continue
            if event.node == node and event.n > last_n:
                events.append(event)
                last_n = event.n
        self._positions[node].last_n = last_n
        return events

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


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
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
