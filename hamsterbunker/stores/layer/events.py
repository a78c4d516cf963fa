"""Each node's event log on a backend: ``events/<node>/<position>``, the newest kept.

By position, not ``Event.n`` (which starts at 1 in every process): a client lists the
log once to find its last position, then counts on itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ...core.limits import MAX_RECORD_BYTES
from ...core.read_bounds import ReadBound
from ...records import Event
from .._reported import readable
from ..backend import DeleteRange, Put, Txn
from .base import Layer, must
from .keys import AgentKeys, parse_number

__all__ = ["EVENTS_READ", "EventLogs"]

# The most one read_events returns, whatever was planted: a node's log is its
# store's setting (events_per_node), so this bounds the logs of many nodes.
EVENTS_READ = ReadBound(100_000, MAX_RECORD_BYTES, 64 * 1024 * 1024)
# One page of a log's positions, listed to find where to append.
_POSITIONS = ReadBound(4096, 0, 0)
_MAX_PAGES = 64


class EventLogs:
    """Appends and reads the event logs; remembers where each node's log goes on."""

    def __init__(self, layer: Layer) -> None:
        self.layer = layer
        self._next: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def append(self, keys: AgentKeys, event: Event) -> None:
        folder = keys.node_events(event.node)
        with self._lock:
            position = self._next.get((keys.agent, event.node))
        if position is None:
            position = self._last_position(folder) + 1
        writes: list[Put | DeleteRange] = [Put(keys.event(event.node, position), event.to_json())]
        keep = self.layer.settings.events_per_node
        if position > keep:
            writes.append(DeleteRange(folder, keys.event(event.node, position - keep + 1)))
        must(self.layer.commit_indexed(keys, Txn(writes=writes)))
        with self._lock:
            self._next[(keys.agent, event.node)] = position + 1

    def _last_position(self, folder: str) -> int:
        """The highest position in a log (0 for none), looking at a bounded number of pages."""
        last, after = 0, ""
        for _page in range(_MAX_PAGES):
            found = self.layer.backend.scan(folder, _POSITIONS, after=after)
            names = found.keys
            for key in names:
                last = max(last, parse_number(key[len(folder) :]) or 0)
            if not found.more or not names:
                break
            after = max(names)
        return last

    def read(self, keys: AgentKeys, after: Mapping[str, int]) -> list[Event]:
        found = self.layer.backend.scan(keys.events, EVENTS_READ)
        for too_large in found.too_large:
            self.layer.reported(f"leaving out the event {too_large.key}: too big")
        if found.more:
            self.layer.reported(f"events of {keys.agent}: stopped reading at the read bound")
        stored = [(key[len(keys.events) :].partition("/")[0], data) for key, data in found.items]

        def report(node: str, _data: bytes, exc: Exception) -> None:
            self.layer.reported(f"leaving out an event of {node} of {keys.agent}: {exc}")

        events = readable(stored, Event.from_json, report)
        return [event for event in events if event.n > after.get(event.node, 0)]

    def forget_agent(self, agent: str) -> None:
        """After the agent's records are removed: every log of it starts at position 1."""
        with self._lock:
            for known in [k for k in self._next if k[0] == agent]:
                del self._next[known]

    def forget(self, keys: AgentKeys, node: str) -> None:
        """After a node's log is removed: a new log starts at position 1."""
        with self._lock:
            self._next.pop((keys.agent, node), None)
