"""Test doubles that ship with the library (in the spirit of ``structlog.testing``).

``MemoryStore`` keeps every record in this process's memory: the record layer
every store uses, over a memory backend, so tests of code built on a store (the
lease keeper, the runtime, your own agent) run fast, without a disk, and
against the same record rules as a real store::

    from hamsterbunker.testing import MemoryStore

    store = MemoryStore()
    node_a = Runtime(node_id="a", region="r", store=store, agent=agent, secret=secret)
    node_b = Runtime(node_id="b", region="r", store=store, agent=agent, secret=secret)

Every node that should share the store must be given the *same* MemoryStore
object: it gives mutual exclusion between threads of one process, nothing more.
Records are kept as bytes and parsed on every read, as in a real backend, so a
caller can never change a stored record by mutating an object it passed in or
got back.
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
