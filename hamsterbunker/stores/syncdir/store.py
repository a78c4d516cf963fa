"""The syncdir store: a folder kept in step by a sync tool, each node writing only its own files.

Its design is ``docs/syncdir.md``. Layout::

    ROOT/.hamsterbunker-syncdir      marks the mode (written once, if absent)
    ROOT/cluster.json                the cluster record (created once, never rewritten)
    ROOT/nodes/NODE/                 a file store that only NODE writes (kv/, .lock, .redo)
    ROOT/nodes/NODE/published/AGENT/ NODE's claims, term records and chain choices

The store is a composite of record-layer file stores (``subtrees``): its own
node's subtree (``_mine``, the only one it writes) and every other node's,
opened read-only (nothing is ever written there, not even a lock) as they
appear under ``nodes/`` (listed on each read, the objects cached). Nothing
outside ``nodes/<own node>/`` is ever written but the marker and the cluster
record, each created at most once and never replaced.

**Lease and fences** (``lease``): the lease is the winning claim among every
node's, each written only by its node, published under a new name at each
write (``published``); a fenced write is checked against the winning claim
first, then by the own file store against the own claim under its lock.

**Chains.** Each node's checkpoints are its own chain. ``list_chains`` and
``read_chain_checkpoint`` name the chain. The protocol's ``list_checkpoints``,
``read_checkpoint`` and ``read_for_restore`` see every chain merged, newest
first by (seq, epoch); a (seq, epoch) that several chains hold is listed once,
from the chain of the highest node id (the claim order's tie-break, so every
node reads the same bytes). This keeps ``CheckpointInfo`` as it is; a
node's restore does not use this merge but the lineage
(``hamsterbunker.node.lineage_view``), through ``chains`` (``stores.chains``).

**Term records.** ``put_term_start`` writes the own node's record of a term
once (``published/AGENT/terms/EPOCH.rec``); ``read_term_starts`` reads every
node's, placed by the subtree and the file name (``terms``). Chain choices
(``hb choose-chain``) are kept the same way under ``choices/``.

**Other records.** Heartbeats, events, effects, the inbox and the loss
acceptance are written to the own subtree. ``list_heartbeats``,
``read_events`` (``after`` maps each node to the last n read of its log) and
``list_agents`` read every subtree: a node's heartbeat and event log are
taken from its own subtree if it has one, else from ours (where a test or a
tool wrote them for it), else from the first subtree by name; ``tail`` is
the generic one over these merged reads. Effects, inbox, replies and the
acceptance record are read from the own subtree only, but for
``read_chain_effects``, which reads any node's effect journal of a step for a
replay; a store opened to read, on a machine where its node has no subtree,
reads them as empty.

**Refused**, and declared so in ``report().refuses`` (``base.Refusal``):
``replace_cluster`` and every ``reseal_*`` (key rotation rewrites a shared
record); ``forget_node`` of a node that has its own subtree (it would delete
its files: of this node itself, or of a node with no subtree, it drops what is
in ours).

**Untrusted.** A claim, chain or log of another node that does not parse or
is too big is skipped and reported (logged once, and listed by
``problems()``), never raised; a symlink, a FIFO or a directory in place of
one is no record (the file backend reads none there); a name under ``nodes/``
that is not a node id, or is a sync tool's, is never a node.
``sync_files()`` lists the sync tool's files for reporting. A sync-conflict
copy of the cluster record stops every node until one is removed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import ConfigError, CorruptRecord, LeaseConflict, StoreError, StoreUnavailable
from ...core.limits import INBOX_REPLIES_KEPT, check_checkpoint_bounds, check_effect_bounds
from ...core.read_bounds import HEARTBEATS_READ
from ...records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from ..base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    StoreReport,
    SyncedFolder,
    check_consumed,
)
from ..chains import Chains
from ..dirs.fileio import opened_dir, os_errors_as_store_errors
from ..dirs.location import open_root
from ..interface import Store
from ..layer import RecordStore
from .layout import CLUSTER, NODES, published_parts, sync_files
from .lease import ClaimsLease
from .merge import by_node, merged_chains
from .promises import GUARANTEES, REFUSES, ROTATION_REFUSED, check_sync_delay_bounds
from .root import check_mode, create_once, read_cluster_record
from .subtrees import Problems, Subtrees, refuse_earlier_subtrees
from .terms import CHOICES, TERMS, records_of_every_node, write_term_record
from .watch import merged_watch

if TYPE_CHECKING:
    from ...core.blob import Blob

__all__ = ["SyncDirStore"]

# OSError of the store's own root-level reads and writes, as a StoreError.
_os_errors_as_store_errors = os_errors_as_store_errors("syncdir store")


class SyncDirStore(Store):
    """A store in a synced folder: node subtrees, claims, per-node chains (see the module)."""

    guarantees = GUARANTEES

    def __init__(
        self,
        root: str | os.PathLike[str],
        node: str | None = None,
        *,
        sync_delay_ms: int | None = None,
        create: bool = True,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
        lock_timeout: float = 2.0,
    ) -> None:
        # A node writes only its own subtree, so a writer needs its node id; and its restore
        # waits up to the sync delay. A reader (create=False) needs neither: without a node
        # it has no subtree of its own ("" names none) and writes nothing; without a delay
        # it holds 0 (not stated).
        if create and (node is None or sync_delay_ms is None):
            raise ConfigError(
                "a syncdir store opened to write needs this node's id and the folder's "
                "sync_delay_ms (both from the node's config)"
            )
        self.node = "" if node is None else check_name("node id", node)
        self.sync_delay_ms = 0 if sync_delay_ms is None else check_sync_delay_bounds(sync_delay_ms)
        self.root = Path(root).absolute()
        self.url = "syncdir" + self.root.as_uri().removeprefix("file")
        self._problems = Problems()
        open_root(self.root, create=create)
        refuse_earlier_subtrees(self.root)  # before anything is written
        _os_errors_as_store_errors(check_mode)(self.root, create)
        if create:
            with opened_dir(self.root, (NODES,), create=True):
                pass
        self._subtrees = Subtrees(
            self.root,
            self.node,
            self._problems,
            create=create,
            keep_checkpoints=keep_checkpoints,
            events_per_node=events_per_node,
            keep_replies=keep_replies,
            lock_timeout=lock_timeout,
        )
        self._mine = self._subtrees.mine
        self.warnings: list[str] = [] if self._mine is None else list(self._mine.warnings)
        self._lease = ClaimsLease(
            self.root, self.node, self.subtrees, self._writer, self._problems, self.sync_delay_ms
        )

    # -- subtrees ------------------------------------------------------------

    def _writer(self) -> RecordStore:
        if self._mine is None:
            who = f"node {self.node} has no subtree" if self.node else "no node id was given"
            raise StoreError(f"{who} in {self.root}: this store was opened to read")
        return self._mine

    def subtrees(self) -> dict[str, RecordStore]:
        """Every node's subtree, this node's included (if it has one), by node id."""
        return self._subtrees.all()

    def problems(self) -> list[str]:
        """What was skipped as unreadable (each once, the first 1024), for a report."""
        return self._problems.listed()

    def sync_files(self) -> list[str]:
        """The sync tool's own files in the folder (conflict copies, temporary files, its
        markers), relative to the root: never read as ours, listed for a report."""
        return sync_files(self.root)

    @property
    def chains(self) -> Chains:
        return self  # the operations below, under "chains" and "term records"

    def report(self) -> StoreReport:
        # Its watch is a watchfiles thread per node subtree. Problems last: the listing
        # of the subtrees reports into them.
        nodes, files = tuple(self.subtrees()), tuple(self.sync_files())
        return StoreReport(
            cheap_watch=False,
            synced_folder=SyncedFolder(nodes, files, tuple(self.problems())),
            refuses=REFUSES,
        )

    def check(self) -> None:
        try:
            mode = os.stat(self.root).st_mode
        except OSError as exc:
            raise StoreUnavailable(f"store directory {self.root}: {exc.strerror}") from exc
        if not stat.S_ISDIR(mode):
            raise StoreUnavailable(f"store path {self.root} is not a directory")
        if self._mine is not None:
            self._mine.check()

    # -- cluster -------------------------------------------------------------

    @_os_errors_as_store_errors
    def read_cluster(self) -> ClusterRecord | None:
        return read_cluster_record(self.root)

    @_os_errors_as_store_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        self._writer()  # a reader creates nothing
        stored = self.read_cluster()
        if stored is not None:
            return stored
        others = sorted(self._subtrees.peers())
        if others:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise StoreError(
                f"{self.root} holds the subtrees of other nodes ({shown}) but no cluster "
                "record yet: wait for the sync tool to bring their cluster record rather than "
                "create a second one (which would leave a conflict copy), then start again"
            )
        create_once(self.root, CLUSTER, record.to_json())
        stored = self.read_cluster()
        if stored is None:
            raise StoreError(f"cluster record vanished from {self.root}")
        return stored

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        raise StoreError(ROTATION_REFUSED.format(what="replacing the cluster record"))

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        raise StoreError(ROTATION_REFUSED.format(what="re-sealing a checkpoint"))

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        raise StoreError(ROTATION_REFUSED.format(what="re-sealing a submission"))

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        raise StoreError(ROTATION_REFUSED.format(what="re-sealing an effect record"))

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        raise StoreError(ROTATION_REFUSED.format(what="re-sealing a reply"))

    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        return ([], None) if self._mine is None else self._mine.read_replies(agent, after, limit)

    def list_agents(self) -> list[str]:
        listed = self._subtrees.each("agent list", lambda store: store.list_agents(), None)
        agents = {agent for names in listed.values() for agent in names}
        return sorted(agents)[:MAX_LISTED_AGENTS]

    # -- lease: claims (``lease``) --------------------------------------------------

    def claims(self, agent: str) -> dict[str, LeaseRecord]:
        """Every node's claim on the agent's lease (node -> claim), as ``ClaimsLease``."""
        return self._lease.claims(agent)

    def read_lease(self, agent: str) -> LeaseRecord | None:
        return self._lease.read(agent)

    def check_claims_with(self, agent: str, problem: Callable[[LeaseRecord], str | None]) -> None:
        self._lease.check_claims_with(agent, problem)

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        return self._lease.cas(agent, expected_version, new)

    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        # read_lease never reports one: an unreadable claim is skipped (ClaimsLease.claims),
        # and this node's own is replaced by its next write (ClaimsLease._write_own).
        raise LeaseConflict(f"the syncdir lease of {agent!r} is never unreadable as a whole")

    # -- checkpoints: one chain per node -----------------------------------------

    def list_chains(self, agent: str) -> dict[str, list[CheckpointInfo]]:
        """Each node's chain of the agent's checkpoints (node -> newest first), by node id."""
        check_name("agent id", agent)
        return self._subtrees.each(
            f"checkpoints of {agent}", lambda store: store.list_checkpoints(agent), None
        )

    def read_chain_checkpoint(self, agent: str, node: str, info: CheckpointInfo) -> bytes:
        """The sealed bytes of checkpoint info in node's chain (StoreError if it is gone)."""
        store = self.subtrees().get(check_name("node id", node))
        if store is None:
            raise StoreError(f"no chain of node {node} for {agent!r} in {self.root}")
        return store.read_checkpoint(agent, info)

    # -- term records: where each term started (hamsterbunker.sealing.term_records) -------

    @_os_errors_as_store_errors
    def put_term_start(self, agent: str, epoch: int, data: bytes) -> None:
        """Write this node's record of its term at epoch, once (``terms``: a retry of the
        same bytes is a no-op; other bytes, StoreError)."""
        check_name("agent id", agent)
        self._writer()  # a reader writes nothing
        write_term_record(self.root, self.node, agent, epoch, data)

    def read_term_starts(self, agent: str) -> dict[tuple[int, str], bytes]:
        """Every node's term records of the agent, unopened: (epoch, node) -> bytes, the
        epoch from the file's name and the node from its subtree. Junk is reported."""
        return records_of_every_node(self.root, self.subtrees(), agent, self._problems, TERMS)

    @_os_errors_as_store_errors
    def put_chain_choice(self, agent: str, epoch: int, data: bytes) -> None:
        """Write this node's (signed) chain choice made while the term of epoch won, once."""
        check_name("agent id", agent)
        self._writer()
        write_term_record(self.root, self.node, agent, epoch, data, CHOICES)

    def read_chain_choices(self, agent: str) -> dict[tuple[int, str], bytes]:
        """Every node's chain choices, unopened: (epoch of the term they follow, node) ->
        bytes, placed as term records are. Junk is reported."""
        return records_of_every_node(self.root, self.subtrees(), agent, self._problems, CHOICES)

    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        mine = self._writer()
        # Bounds before the fence, as every store: nothing is read or written for them.
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed)
        if problem is not None:
            raise StoreError(problem)
        self._lease.check_fence(agent, fence, seq)
        return mine.put_checkpoint(agent, fence, seq, blob, consumed)

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        """Every chain's checkpoints merged (see the module; a node restores by the lineage)."""
        return [info for _node, info in merged_chains(self.list_chains(agent))]

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        for node, listed in merged_chains(self.list_chains(agent)):
            if (listed.seq, listed.epoch) == (info.seq, info.epoch):
                return self.read_chain_checkpoint(agent, node, listed)
        raise StoreError(f"checkpoint {info.seq} of epoch {info.epoch} of {agent!r} is gone")

    # -- effect journal, inbox, acceptance: the own subtree ----------------------

    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        mine = self._writer()
        problem = check_effect_bounds(seq, index, kind, len(blob))
        if problem is not None:
            raise StoreError(problem)
        self._lease.check_fence(agent, fence, seq)
        mine.put_effect(agent, fence, seq, index, kind, blob)

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        return {} if self._mine is None else self._mine.read_effects(agent, seq)

    def read_chain_effects(self, agent: str, node: str, seq: int) -> dict[tuple[int, str], bytes]:
        """The effect journal of step seq in node's subtree (this node's included), unopened:
        (index, kind) -> bytes; {} if node has no subtree here. Read by that subtree's file
        store: bounded, and a record that is junk (too big, not a regular file) is left
        out and reported."""
        check_name("agent id", agent)
        store = self.subtrees().get(check_name("node id", node))
        if store is None:
            return {}
        try:
            return store.read_effects(agent, seq)
        except CorruptRecord as exc:
            self._problems(f"effect journal of step {seq} of node {node} skipped: {exc}")
            return {}

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        return self._writer().admit(agent, request_id, number, blob)

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        return [] if self._mine is None else self._mine.read_inbox(agent, after)

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        return None if self._mine is None else self._mine.read_admission(agent, request_id)

    def read_acceptance(self, agent: str) -> bytes | None:
        return None if self._mine is None else self._mine.read_acceptance(agent)

    def put_acceptance(self, agent: str, data: bytes) -> None:
        self._writer().put_acceptance(agent, data)

    # -- heartbeats and events: written to the own subtree, read from every one ----

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        self._writer().put_heartbeat(agent, heartbeat)

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        subtrees = self.subtrees()
        found = self._subtrees.each(
            f"heartbeats of {agent}", lambda store: store.list_heartbeats(agent), subtrees
        )
        chosen = by_node(found, lambda beat: beat.node, set(subtrees), self.node)
        # Each subtree's read keeps to HEARTBEATS_READ; so does the merge, by node id.
        return [beat for beats in chosen.values() for beat in beats[:1]][: HEARTBEATS_READ.count]

    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._writer().remove_heartbeat(agent, node)

    def append_event(self, agent: str, event: Event) -> None:
        self._writer().append_event(agent, event)

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        subtrees = self.subtrees()
        found = self._subtrees.each(
            f"events of {agent}", lambda store: store.read_events(agent, after), subtrees
        )
        chosen = by_node(found, lambda event: event.node, set(subtrees), self.node)
        return [event for events in chosen.values() for event in events]

    def forget_node(self, agent: str, node: str) -> None:
        check_name("node id", node)
        if node != self.node and node in self._subtrees.peers():
            raise StoreError(
                f"node {node} has its own subtree in {self.root}: forgetting it would delete "
                "files only that node writes, which a synced folder would bring back or turn "
                f"into conflicts. Remove {self.root / NODES / node} on every machine once the "
                "node is gone for good"
            )
        self._writer().forget_node(agent, node)

    # -- watch ---------------------------------------------------------------

    def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[None]:
        """Every subtree's store watch and published claims, merged; new subtrees picked up
        each second."""
        check_name("agent id", agent)
        return merged_watch(
            self.subtrees,
            agent,
            lease_only=lease_only,
            terms_only=terms_only,
            own=self.node,
            claims_of=lambda node: self.root.joinpath(*published_parts(node, agent)),
        )

    def close(self) -> None:
        self._subtrees.close()
