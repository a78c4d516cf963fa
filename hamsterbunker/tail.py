"""Following a store as it changes: new events and current heartbeats, read incrementally.

A monitor polls ``Tail.read()`` whenever the store's watch hints at a change
(and on a timer, since a watch is only a hint). Each call returns only events
not returned before. A backend that can do better than the generic tail (the
file store reads only appended bytes and changed heartbeat files) offers its
own through a ``tail(agent)`` method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .records import Event, Heartbeat
from .stores import Store

__all__ = ["Tail", "TailRead", "open_tail"]


@dataclass(frozen=True)
class TailRead:
    events: list[Event]  # new since the last read, each node's in order
    heartbeats: list[Heartbeat]  # every node's current heartbeat


class Tail(Protocol):
    def read(self) -> TailRead: ...


class GenericTail:
    """Works on any store: events after a per-node cursor, every heartbeat."""

    def __init__(self, store: Store, agent: str) -> None:
        self._store = store
        self._agent = agent
        self._cursor: dict[str, int] = {}

    def read(self) -> TailRead:
        events = self._store.read_events(self._agent, after=self._cursor)
        for event in events:
            self._cursor[event.node] = max(self._cursor.get(event.node, 0), event.n)
        return TailRead(events, self._store.list_heartbeats(self._agent))


def open_tail(store: Store, agent: str) -> Tail:
    tail = getattr(store, "tail", None)
    if callable(tail):
        made: Tail = tail(agent)
        return made
    return GenericTail(store, agent)
