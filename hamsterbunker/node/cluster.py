"""The cluster record as this node knows it: opened with the secret, kept against the store.

The record holds the salt and key check of the cluster's key. A node opens
it with the secret before writing anything but a new record, so a node with
the wrong secret touches nothing. A node that remembers the record (its
state directory, see ``hamsterbunker.memory``) puts a lost one back and
refuses a different one: without the record no node started later could open
the checkpoints this cluster sealed, and a different record means another key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import CorruptRecord, StoreError, StoreRegressed
from ..lease import LeaseKeeper
from ..memory import Memory, MemoryFile
from ..records import ClusterRecord
from ..sealing import Sealer, new_cluster_record
from ..stores import Store
from .calls import NodeCalls

__all__ = ["Cluster", "NodeMemory"]

log = logging.getLogger("hamsterbunker")
Emit = Callable[..., None]


class Cluster:
    """Opens and checks the cluster record of one agent; every method blocks on the store."""

    def __init__(
        self,
        store: Store,
        agent_id: str,
        secret: str,
        *,
        remembered: ClusterRecord | None,
        memory_path: Path | None,
        emit: Emit,
    ) -> None:
        self._store, self._agent_id, self._secret = store, agent_id, secret
        self._remembered, self._memory_path = remembered, memory_path
        self._emit = emit

    def open(self) -> Sealer:
        """The sealer of this cluster; a new cluster record if the store has none (and we
        remember none). WrongSecret if the secret does not open it."""
        if self._remembered is not None:
            cluster = self.reconcile(self._remembered)
        else:
            cluster = self._store.read_cluster() or self._store.create_cluster(
                new_cluster_record(self._secret)
            )
        return Sealer(self._secret, cluster)

    def reconcile(self, ours: ClusterRecord) -> ClusterRecord:
        """Put a lost cluster record back from what this node knows; refuse a different one."""
        try:
            stored = self._store.read_cluster()
        except CorruptRecord as exc:
            # Ours was verified before and is remembered: go on with it, loudly.
            self._emit("store.warning", message=f"{exc}: going on with the remembered one")
            return ours
        if stored is None:
            stored = self._store.create_cluster(ours)  # the record that won, if another did
            self._emit("store.regressed", reason="the cluster record was gone: put it back")
        if stored.key_id != ours.key_id:
            forget = (
                f" (or remove {self._memory_path} if the store was replaced deliberately)"
                if self._memory_path is not None
                else ""
            )
            raise StoreRegressed(
                f"agent {self._agent_id}: the store's cluster record changed from key id "
                f"{ours.key_id} to {stored.key_id}: the store was replaced or re-created; "
                f"refusing to go on with another key{forget}"
            )
        if stored != ours:
            # Same key id, other key parameters (n, r, p): not the record this node
            # verified. Unauthenticated, so ours is kept, and the change reported.
            self._emit(
                "store.warning",
                message=f"the store's cluster record differs from the one this node remembers "
                f"(n={stored.n} r={stored.r} p={stored.p}, remembered n={ours.n} r={ours.r} "
                f"p={ours.p}): going on with the remembered one",
            )
        return ours

    def check(self, ours: ClusterRecord, node_id: str) -> None:
        """After the store went back: see that the cluster record is still ours."""
        try:
            self.reconcile(ours)
        except StoreError as exc:
            log.warning("%s: could not check the cluster record: %s", node_id, exc)


class NodeMemory:
    """Keeps what this node has seen of the store in its state directory, when a write is due.

    Memory only sharpens what a restarted node can notice: a failure to save
    is logged (once until it works again), and the agent goes on.
    """

    def __init__(self, file: MemoryFile, keeper: LeaseKeeper, calls: NodeCalls, node_id: str):
        self._file, self._keeper, self._calls, self._node_id = file, keeper, calls, node_id
        self._failed = False

    async def save(self, cluster: ClusterRecord, *, force: bool = False) -> None:
        seen = Memory(self._keeper.highest_epoch, self._keeper.reach(), cluster)
        if not self._file.due(seen, force=force):
            return  # most passes: no thread hand-off for nothing
        try:
            await self._calls.work(self._file.save, seen, force=force)
            self._failed = False
        except OSError as exc:
            if not self._failed:
                log.warning("%s: cannot save its memory: %s", self._node_id, exc)
            self._failed = True
