"""The cluster record as this node knows it: opened with the secrets, kept against the store.

A node that remembers the record puts a lost one back and refuses another
cluster's or an older key list; a running node follows a rotation (``follow``).
A store with no record at all does not exist yet: a node makes it (the first
record) only if allowed to, loudly, since a mistyped URL looks just the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..core.errors import (
    ConfigError,
    CorruptRecord,
    StoreError,
    StoreRegressed,
    StoreUnavailable,
)
from ..lease import LeaseKeeper
from ..lease.control import ControlView
from ..lease.memory import Memory, MemoryFile
from ..records import ClusterRecord
from ..sealing import Sealer, new_cluster_record
from ..sealing.keyring import Secret
from ..stores import Store, folder_store_made, redacted_url
from .calls import NodeCalls

__all__ = ["Cluster", "NodeMemory", "check_folder_store"]

log = logging.getLogger("hamsterbunker")
Emit = Callable[..., None]


class Cluster:
    """Opens, checks and follows the cluster record of one agent; every method blocks on
    the store."""

    def __init__(
        self,
        store: Store,
        agent_id: str,
        secret: Secret,
        *,
        remembered: ClusterRecord | None,
        memory_path: Path | None,
        emit: Emit,
        create: bool = True,
    ) -> None:
        """create: make the store's cluster record if it has none and none is remembered
        (else ConfigError, nothing written)."""
        self._store, self._agent_id, self._secret = store, agent_id, secret
        self._remembered, self._memory_path = remembered, memory_path
        self._emit, self._create = emit, create
        self._sealer: Sealer | None = None
        self.created = False  # open() made the store (for store.created, once numbered)

    @property
    def record(self) -> ClusterRecord | None:
        """The newest authenticated record this node follows (None before open)."""
        return None if self._sealer is None else self._sealer.cluster

    def open(self) -> Sealer:
        """The sealer of this cluster; a new cluster record if the store has none (and we
        remember none). WrongSecret if the secrets do not open it, or lack a key it lists."""
        if self._remembered is not None:
            cluster = self.reconcile(self._remembered)
        else:
            cluster = self._store.read_cluster() or self._new_cluster()
        self._sealer = Sealer(self._secret, cluster, refresh=self._store.read_cluster)
        return self._sealer

    def _new_cluster(self) -> ClusterRecord:
        """The store's first cluster record, which makes the store: ours, or another node's
        that won the race."""
        if not self._create:
            if self._being_synced():
                raise StoreUnavailable(
                    f"no cluster record in {self._store.url} yet, and this node does not create "
                    "one: waiting for the sync to bring it (start the node that makes the store "
                    "with --create-store, if none has)"
                )
            raise new_store_refused(self._store.url)
        ours = new_cluster_record(self._secret)
        made = self._store.create_cluster(ours)
        self.created = made == ours
        return made

    def _being_synced(self) -> bool:
        """Whether the store is a synced folder that shows the sync at work (Syncthing's
        marker, or another node's subtree beside this node's own): its record may come."""
        folder = self._store.report().synced_folder
        if folder is None:
            return False
        return ".stfolder" in folder.sync_files or len(folder.nodes) > 1

    def reconcile(self, ours: ClusterRecord) -> ClusterRecord:
        """Put a lost cluster record back from what this node knows; refuse another cluster's
        or an older one. The record to go on with: ours, or a newer one the store holds (the
        sealer authenticates it)."""
        try:
            stored = self._store.read_cluster()
        except CorruptRecord as exc:
            # Ours was verified before and is remembered: go on with it, loudly.
            self._emit("store.warning", message=f"{exc}: going on with the remembered one")
            return ours
        if stored is None:
            stored = self._store.create_cluster(ours)  # the record that won, if another did
            self._emit("store.regressed", reason="the cluster record was gone: put it back")
        if stored.salt != ours.salt:
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
        if stored.generation < ours.generation:
            raise StoreRegressed(
                f"agent {self._agent_id}: the store's cluster record went back from key "
                f"generation {ours.generation} (key id {ours.key_id}) to {stored.generation} "
                f"(key id {stored.key_id}): a secret rotation was undone in the store; refusing "
                "the older key list"
            )
        if stored.generation > ours.generation:
            return stored  # a rotation went on while this node was down
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
        """After the store went back: see that the cluster record is still ours (the newest
        this node follows, if it followed a rotation since ``ours``)."""
        try:
            self.reconcile(self.record or ours)
        except StoreError as exc:
            log.warning("%s: could not check the cluster record: %s", node_id, exc)

    def follow(self, found: bytes | None = None) -> bool:
        """Read the record (or take it as found: read along with the lease) and follow a
        rotation's step: True if the keys changed. Raises StoreRegressed for a record below
        the generation followed, Tampered or WrongSecret for one that does not authenticate
        or names a key this node lacks (nothing changed).
        """
        if self._sealer is None:
            return False
        stored = self._store.read_cluster() if found is None else ClusterRecord.from_json(found)
        if stored is None:
            return False  # put back by reconcile at the next regression check, or a restart
        return self._sealer.adopt(stored)


def new_store_refused(url: str) -> ConfigError:
    """The one line that refuses to make a store (url: redacted)."""
    return ConfigError(
        f"store {url} does not exist (it holds no cluster record); not creating it: check the "
        "store URL, or pass --create-store if this node starts a new cluster"
    )


def check_folder_store(url: str) -> None:
    """ConfigError if url names a file:// or syncdir:// folder that holds no store, read
    before a node opens it to write, which would make the folder. A syncdir folder the sync
    is bringing passes: its node waits for the cluster record (``Cluster.open``)."""
    if folder_store_made(url) is False:
        raise new_store_refused(redacted_url(url))


class NodeMemory:
    """Keeps what this node has seen of the store in its state directory, when a write is due.

    Memory only sharpens what a restarted node can notice: a failure to save
    is logged (once until it works again), and the agent goes on.
    """

    def __init__(
        self,
        file: MemoryFile,
        keeper: LeaseKeeper,
        calls: NodeCalls,
        node_id: str,
        following: Cluster | None = None,
        control: ControlView | None = None,
    ) -> None:
        self._file, self._keeper, self._calls, self._node_id = file, keeper, calls, node_id
        self._following, self._control = following, control
        self._failed = False

    async def save(self, cluster: ClusterRecord, *, force: bool = False) -> None:
        """Save what was seen; ``cluster`` unless the node followed a newer record since."""
        newest = self._following.record if self._following is not None else None
        control = self._control.text if self._control is not None else ""
        seen = Memory(self._keeper.highest_epoch, self._keeper.reach(), newest or cluster, control)
        if not self._file.due(seen, force=force):
            return  # most passes: no thread hand-off for nothing
        try:
            await self._calls.work(self._file.save, seen, force=force)
            self._failed = False
        except OSError as exc:
            if not self._failed:
                log.warning("%s: cannot save its memory: %s", self._node_id, exc)
            self._failed = True
