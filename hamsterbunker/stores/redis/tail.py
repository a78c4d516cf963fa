"""The Redis store's tail: new events and current heartbeats in one script call.

The script (``scripts.TAIL``) is handed how many events of each node
were read so far and sends only the newer ones, with every heartbeat. A
node's log dropped by ``hb forget`` is read from its start if it writes again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...limits import MAX_SEQ
from ...records import Event
from ..tail import TailRead
from .replies import Report, events_in, heartbeats_in, node_name, text

__all__ = ["RedisTail"]


class RedisTail:
    """A tail that remembers, per node, how many events it has read (the event counts).

    fetch runs the script with the counts read so far, as flat (node, count)
    strings, and returns its answer; its errors are the store's.
    """

    def __init__(
        self,
        fetch: Callable[[list[str]], Any],
        report_heartbeat: Report,
        report_event: Report,
    ) -> None:
        self._fetch = fetch
        self._report_heartbeat = report_heartbeat
        self._report_event = report_event
        self._seen: dict[str, int] = {}

    def read(self) -> TailRead:
        answer = self._fetch([str(value) for item in sorted(self._seen.items()) for value in item])
        if not isinstance(answer, list) or not answer:
            return TailRead([], [])
        beats = heartbeats_in(answer[0], self._report_heartbeat)
        logs: dict[str, tuple[int, list[Any]]] = {}
        for item in answer[1:]:
            if isinstance(item, list) and len(item) == 1:  # no longer counted (hb forget)
                self._seen.pop(text(item[0]), None)
                continue
            # The script sends only counts and names as we write them; checked again here.
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], list)):
                continue
            node, count = node_name(item[0]), item[1]
            if node is not None and isinstance(count, int) and 0 <= count <= MAX_SEQ:
                logs[node] = (count, item[2])
        events: list[Event] = []
        for node in sorted(logs):
            count, lines = logs[node]
            self._seen[node] = count
            events.extend(events_in(node, lines, self._report_event))
        return TailRead(events, beats)
