"""Following a store as it changes: new events and current heartbeats, read incrementally.

A monitor polls ``Tail.read()`` whenever the store's watch hints at a change
(and on a timer, since a watch is only a hint). Each call returns only events
not returned before. Every store offers one through ``Store.tail(agent)``:
``GenericTail`` by default, or the backend's own where it can do better (the
file store reads only appended bytes and changed heartbeat files).
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
    """Works on any store: events after a per-node cursor, every heartbeat."""

    def __init__(self, store: _Readable, agent: str) -> None:
        self._store = store
        self._agent = agent
        self._cursor: dict[str, int] = {}

    def read(self) -> TailRead:
        events = self._store.read_events(self._agent, after=self._cursor)
        for event in events:
            self._cursor[event.node] = max(self._cursor.get(event.node, 0), event.n)
        return TailRead(events, self._store.list_heartbeats(self._agent))
