"""Test doubles that ship with the library (in the spirit of ``structlog.testing``).

``MemoryStore``: the record layer every store uses, over a memory backend, so tests of
code built on a store run fast and under the same record rules as a real store (records
are kept as bytes: mutating an object passed in or got back changes nothing stored).
Nodes that share it must be given the *same* object; it excludes threads of one process,
nothing more::

    store = MemoryStore()
    node_a = Runtime(node_id="a", region="r", store=store, agent=agent, secret=secret)
    node_b = Runtime(node_id="b", region="r", store=store, agent=agent, secret=secret)
"""

from __future__ import annotations

from .core.limits import INBOX_REPLIES_KEPT
from .stores.backends.memory import GUARANTEES, MemoryBackend
from .stores.layer import RecordStore

__all__ = ["MEMORY_GUARANTEES", "MemoryStore"]

MEMORY_GUARANTEES = GUARANTEES


class MemoryStore(RecordStore):
    """A store kept in memory: thread-safe, one process only."""

    def __init__(
        self,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
    ) -> None:
        super().__init__(
            MemoryBackend(),
            keep_checkpoints=keep_checkpoints,
            events_per_node=events_per_node,
            keep_replies=keep_replies,
        )
