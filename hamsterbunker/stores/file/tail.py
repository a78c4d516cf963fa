"""The file store's tail: only appended event bytes and changed heartbeat files are read.

Each node appends to ``events/<node>.jsonl`` and, when it is full, renames it
to ``<node>.jsonl.1`` and starts a new one. We remember, per node, which file
(inode) we read up to which byte: appended lines are read from there; after a
rotation the rest of the old file is read from ``.1`` (if it is still that
file), then the new one from the start. Heartbeat files are replaced whole,
so a changed inode, size or mtime tells us which to read again.

The store's rules for what it finds hold here too (see ``stores.file``):
directories are walked without following a symlink, only regular files are
opened (never blocking on a FIFO), and each read is capped: at most the
store's ``segment_cap`` bytes of one event segment per call (a longer
segment is read on over the next calls; a line longer than that is passed
over), ``MAX_RECORD_BYTES`` of a heartbeat, of the lowest node ids as many as
``read_bounds.HEARTBEATS_READ`` takes. What is refused is logged once and
skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import CorruptRecord, StoreError
from ...limits import MAX_RECORD_BYTES
from ...read_bounds import HEARTBEATS_READ
from ...records import Event, Heartbeat
from .._reported import readable
from ..tail import TailRead
from .fileio import closing_fd, file_kind, open_regular, opened_subdir, pread_upto, read_file
from .layout import EVENTS_NAME, HEARTBEAT_ENTRIES, HEARTBEAT_NAME, agent_parts, record_files
from .tree import StoreTree

__all__ = ["FileTail"]


@dataclass(frozen=True)
class _Position:
    """How far one node's event log has been read."""

    inode: int
    # The segment's first complete line (empty until it has one), at most
    # MAX_RECORD_BYTES of it: a longer line is junk, and comparing all of it would
    # read up to a cap more on every call. With the inode it tells a segment apart
    # from a later one given the same inode number.
    head: bytes
    offset: int  # bytes consumed: always just after a complete line
    last_n: int  # the highest event number returned for this node


class FileTail:
    def __init__(self, tree: StoreTree, agent: str, *, segment_cap: int) -> None:
        self._tree = tree
        self._agent_parts = agent_parts(agent)
        agent_dir = tree.agent_dir(agent)
        self._events_dir = agent_dir / "events"
        self._heartbeats_dir = agent_dir / "heartbeats"
        self._cap = segment_cap
        self._report = tree.report  # the store's: each problem logged once
        self._positions: dict[str, _Position] = {}
        self._beats: dict[str, tuple[tuple[int, int, int], Heartbeat | None]] = {}

    def read(self) -> TailRead:
        try:
            with self._tree.reading(*self._agent_parts) as agent_fd:
                if agent_fd is None:  # no store, or no agent yet: nothing to read
                    self._beats = {}
                    return TailRead([], [])
                return TailRead(self._new_events(agent_fd), self._heartbeats(agent_fd))
        except OSError as exc:
            raise StoreError(f"store I/O failed: {exc}") from exc

    # -- events --------------------------------------------------------------

    def _new_events(self, agent_fd: int) -> list[Event]:
        events: list[Event] = []
        positions: dict[str, _Position | None] = dict(self._positions)
        with opened_subdir(agent_fd, "events", self._events_dir) as directory:
            if directory is None:
                return []
            for node, name in record_files(directory, EVENTS_NAME):
                new, positions[node] = self._node_events(directory, node, name, positions.get(node))
                events.extend(new)
        # Kept only once every log was read: after an error, the next read starts over.
        self._positions = {node: p for node, p in positions.items() if p is not None}
        return events

    def _node_events(
        self, directory: int, node: str, name: str, position: _Position | None
    ) -> tuple[list[Event], _Position | None]:
        fd = self._open_segment(directory, name)
        if fd is None:
            return [], position  # rotated away this instant (the next read finds it), or refused
        with closing_fd(fd):
            inode = os.fstat(fd).st_ino
            last_n = position.last_n if position else 0
            lines: list[bytes] = []
            if position is not None and _is_segment(fd, inode, position):
                offset, head = position.offset, position.head
            else:
                # First sight, or rotated since: what we have not read of the old
                # segment is in .1 now. If .1 is not that segment either (rotated
                # twice, or a new store in its place), everything in .1 is new.
                rest = self._rest_of(directory, f"{name}.1", position)
                if rest is None:
                    rest, last_n = self._read_from(directory, f"{name}.1", 0), 0
                lines += _complete_lines(rest, self._cap)[0]
                offset, head = 0, b""
            new_lines, consumed = _complete_lines(self._capped_read(fd, offset), self._cap)
        if offset == 0 and new_lines:
            head = new_lines[0][:MAX_RECORD_BYTES]
        lines += new_lines
        events = []
        for event in readable(((node, line) for line in lines), Event.from_json, self._skipped):
            if event.n > last_n:
                events.append(event)
                last_n = event.n
        return events, _Position(inode, head, offset + consumed, last_n)

    def _skipped(self, node: str, _stored: bytes, exc: Exception) -> None:
        self._report(f"ignoring an unreadable event in {self._events_dir / node}.jsonl: {exc}")

    def _open_segment(self, directory: int, name: str) -> int | None:
        """The segment name as a regular file; None if absent or refused (reported)."""
        try:
            return open_regular(directory, name, self._events_dir / name)
        except FileNotFoundError:
            return None
        except CorruptRecord as exc:
            self._report(f"skipped: {exc}")
            return None

    def _capped_read(self, fd: int, offset: int) -> bytes:
        """What the segment holds from offset, but at most segment_cap bytes."""
        size = os.fstat(fd).st_size
        return pread_upto(fd, offset, min(self._cap, max(size - offset, 0)))

    def _rest_of(self, directory: int, name: str, position: _Position | None) -> bytes | None:
        """What follows position in segment name, if it is the segment position was taken in."""
        if position is None:
            return None
        fd = self._open_segment(directory, name)
        if fd is None:
            return None
        with closing_fd(fd):
            if not _is_segment(fd, os.fstat(fd).st_ino, position):
                return None
            return self._capped_read(fd, position.offset)

    def _read_from(self, directory: int, name: str, offset: int) -> bytes:
        fd = self._open_segment(directory, name)
        if fd is None:
            return b""
        with closing_fd(fd):
            return self._capped_read(fd, offset)

    # -- heartbeats ----------------------------------------------------------

    def _heartbeats(self, agent_fd: int) -> list[Heartbeat]:
        with opened_subdir(agent_fd, "heartbeats", self._heartbeats_dir) as directory:
            seen = {} if directory is None else self._changed_heartbeats(directory)
        self._beats = seen  # removed heartbeats drop out
        return [beat for _, beat in seen.values() if beat is not None]

    def _changed_heartbeats(
        self, directory: int
    ) -> dict[str, tuple[tuple[int, int, int], Heartbeat | None]]:
        """Every heartbeat file's (signature, beat), reading only the changed ones."""
        seen: dict[str, tuple[tuple[int, int, int], Heartbeat | None]] = {}
        for node, name in record_files(directory, HEARTBEAT_NAME, HEARTBEAT_ENTRIES):
            if len(seen) >= HEARTBEATS_READ.count:
                break
            try:
                st = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                continue
            kind = file_kind(st.st_mode)
            if kind is not None:
                self._report(f"skipped: {self._heartbeats_dir / name} is {kind}")
                continue
            signature = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._beats.get(name)
            if cached is None or cached[0] != signature:
                cached = (signature, self._heartbeat(directory, name, node))
            seen[name] = cached
        return seen

    def _heartbeat(self, directory: int, name: str, node: str) -> Heartbeat | None:
        path = self._heartbeats_dir / name

        def report(_node: str, _stored: str, exc: Exception) -> None:
            self._report(f"ignoring unreadable heartbeat {path}: {exc}")

        def parse(name: str) -> Heartbeat | None:
            data = read_file(directory, name, path, MAX_RECORD_BYTES)
            return None if data is None else Heartbeat.from_json(data)

        return next(readable([(node, name)], parse, report), None)


def _is_segment(fd: int, inode: int, position: _Position) -> bool:
    """Whether the open file is the segment position was taken in."""
    if inode != position.inode:
        return False
    head = position.head
    return not head or os.pread(fd, len(head), 0) == head


def _complete_lines(data: bytes, cap: int) -> tuple[list[bytes], int]:
    """The complete lines of data and the bytes they take; a line still being written waits.

    A read of cap bytes without a line end is part of a line longer than any
    record: it is passed over (counted as consumed), so the tail moves on.
    """
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) >= cap:
        return [], len(data)
    return data[:end].splitlines(), end
