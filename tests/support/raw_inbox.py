"""Planting inbox entries as a store writer without the secret would: past admit and its limits.

``plant_submissions`` writes bytes where the record layer keeps a pending
submission (``stores.layer.keys``), on any backend, so that a test can fill an
inbox beyond what ``admit`` would ever store.
"""

from __future__ import annotations

from collections.abc import Iterable

from hamsterbunker.stores.backend import Put, Txn
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import AgentKeys

__all__ = ["plant_submissions"]

# Entries one etcd txn puts: under its default --max-txn-ops (128) and request size.
_ETCD_BATCH = 4


def plant_submissions(store: Store, agent: str, entries: Iterable[tuple[int, bytes]]) -> None:
    """Store each (number, bytes) as a pending submission of agent, whatever its size."""
    from hamsterbunker.stores.syncdir import SyncDirStore

    entries = list(entries)
    if isinstance(store, SyncDirStore):
        assert store._mine is not None, "a syncdir store of a node with a subtree"
        store = store._mine
    if isinstance(store, RecordStore):
        keys = AgentKeys(agent)
        batch = 100 if all(len(blob) < 1024 for _number, blob in entries) else _ETCD_BATCH
        for start in range(0, len(entries), batch):
            writes = [Put(keys.submission(n), blob) for n, blob in entries[start:][:batch]]
            assert store.backend.commit(Txn(writes=writes)).succeeded
    else:
        raise AssertionError(f"no way to plant submissions in {store!r}")
