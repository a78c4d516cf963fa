"""Following a store as it changes (``Store.tail``): each ``Tail.read()`` returns the
events not returned before and the current heartbeats. A monitor reads whenever the
store's watch hints at a change, and on a timer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..records import Event, Heartbeat

__all__ = ["GenericTail", "Tail", "TailRead"]


@dataclass(frozen=True)
class TailRead:
    events: list[Event]  # new since the last read, each node's in order
    heartbeats: list[Heartbeat]  # every node's current heartbeat


class Tail(Protocol):
    def read(self) -> TailRead: ...


class _Readable(Protocol):
    """The two store reads a generic tail makes (any Store has them)."""

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]: ...

    def list_heartbeats(self, agent: str) -> list[Heartbeat]: ...


class GenericTail:
    """Works on any store: events after a per-node cursor, every heartbeat. The last event
    returned of each node is read again: if it is gone or another, the node's log was
    dropped (``hb forget``) and is read again from its start."""

    def __init__(self, store: _Readable, agent: str) -> None:
        self._store = store
        self._agent = agent
        self._last: dict[str, Event] = {}  # the last event returned of each node

    def read(self) -> TailRead:
        again: set[str] = set()
        for _attempt in range(2):  # the second, only if a log started afresh
            after = {node: event.n - 1 for node, event in self._last.items()}
            found = self._store.read_events(self._agent, after=after)
            by_number = {(event.node, event.n): event for event in found}
            again = {node for node, e in self._last.items() if by_number.get((node, e.n)) != e}
            for node in again:  # read from its start: the next attempt, or the next read
                del self._last[node]
            if not again:
                break
        events = [
            event
            for event in found
            if event.node not in again
            and (event.node not in self._last or event.n > self._last[event.node].n)
        ]
        for event in events:  # each node's in order: its last one stays
            self._last[event.node] = event
        return TailRead(events, self._store.list_heartbeats(self._agent))
