"""The syncdir store: a folder kept in step by a sync tool, each node writing only its own
subtree (design and layout: ``docs/syncdir.md``).

A composite of record-layer file stores (``subtrees``): this node's, the only one it
writes, and every other node's, opened read-only as they appear. The lease is the
winning claim (``lease``); each node's checkpoints are its chain (``Store.chains``), which
``list_checkpoints`` and ``read_checkpoint`` merge (``merge.merged_chains``). Heartbeats,
events and agents are read from every subtree (``merge.by_node``); effects, the inbox and
the acceptance from this node's (empty for a reader without one). Key rotation and
forgetting a node with its own subtree are refused (``report().refuses``). Whatever is
unreadable is skipped and reported (``problems()``), never raised.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ...core.errors import ConfigError, CorruptRecord, LeaseConflict, StoreError, StoreUnavailable
from ...core.limits import INBOX_REPLIES_KEPT, check_checkpoint_bounds, check_effect_bounds
from ...core.read_bounds import HEARTBEATS_READ
from ...records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from .._reported import ReportedOnce
from ..base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    StoreReport,
    SyncedFolder,
    check_consumed,
    refuse,
)
from ..chains import Chains
from ..dirs.fileio import opened_dir
from ..dirs.location import open_root
from ..interface import Store
from ..layer import RecordStore
from .first_start import FirstStart
from .layout import CLUSTER, NODES, log, os_errors, published_parts, sync_files
from .lease import ClaimsLease
from .merge import by_node, merged_chains
from .promises import GUARANTEES, REFUSES, ROTATION_REFUSED, check_sync_delay_bounds
from .root import check_mode, create_once, read_cluster_record
from .subtrees import Subtrees, refuse_earlier_subtrees
from .terms import CHOICES, TERMS, records_of_every_node, write_term_record
from .watch import merged_watch

if TYPE_CHECKING:
    from ...core.blob import Blob

__all__ = ["SyncDirStore"]

R = TypeVar("R", Heartbeat, Event)


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
        first_start_wait_ms: int | None = None,
    ) -> None:
        """first_start_wait_ms: how long a node that may create the cluster record waits,
        once it announced so, for other nodes starting at the same time; twice the sync delay
        unless given (0: a folder no other machine shares yet)."""
        # A reader (create=False) may give neither: without a node ("") it writes nothing.
        if create and (node is None or sync_delay_ms is None):
            raise ConfigError(
                "a syncdir store opened to write needs this node's id and the folder's "
                "sync_delay_ms (both from the node's config)"
            )
        self.node = "" if node is None else check_name("node id", node)
        self.sync_delay_ms = 0 if sync_delay_ms is None else check_sync_delay_bounds(sync_delay_ms)
        self.root = Path(root).absolute()
        self.url = "syncdir" + self.root.as_uri().removeprefix("file")
        self._problems = ReportedOnce(log)  # what was skipped as unreadable: for reports
        open_root(self.root, create=create)
        refuse_earlier_subtrees(self.root)  # before anything is written
        os_errors(check_mode)(self.root, create)
        if create:
            with opened_dir(self.root, (NODES,), create=True):
                pass
        store = functools.partial(
            RecordStore,
            keep_checkpoints=keep_checkpoints,
            events_per_node=events_per_node,
            keep_replies=keep_replies,
            per_epoch=True,  # another term's checkpoint may be a branch kept aside
        )
        self._subtrees = Subtrees(
            self.root, self.node, self._problems, store, create=create, lock_timeout=lock_timeout
        )
        self._mine = self._subtrees.mine
        self.warnings: list[str] = [] if self._mine is None else list(self._mine.warnings)
        if first_start_wait_ms is None:
            first_start_wait_ms = 2 * self.sync_delay_ms
        self._first_start = FirstStart(self.root, self.node, first_start_wait_ms / 1000)
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
        """The sync tool's own files in the folder, relative to the root (for a report)."""
        return sync_files(self.root)

    @property
    def chains(self) -> Chains:
        return self  # the operations below, under "chains" and "term records"

    def report(self) -> StoreReport:
        # Problems last: the listing of the subtrees reports into them.
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

    @os_errors
    def read_cluster(self) -> ClusterRecord | None:
        return read_cluster_record(self.root)

    @os_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        self._writer()  # a reader creates nothing
        stored = self.read_cluster()
        if stored is not None:
            return stored
        # Never two records from two machines: the first start is settled (``first_start``).
        self._first_start.settle(self._subtrees.peers())
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
        check_name("agent id", agent)
        return self._subtrees.each(
            f"checkpoints of {agent}", lambda store: store.list_checkpoints(agent), None
        )

    def read_chain_checkpoint(self, agent: str, node: str, info: CheckpointInfo) -> bytes:
        store = self.subtrees().get(check_name("node id", node))
        if store is None:
            raise StoreError(f"no chain of node {node} for {agent!r} in {self.root}")
        return store.read_checkpoint(agent, info)

    # -- term records: where each term started (hamsterbunker.sealing.term_records) -------

    def put_term_start(self, agent: str, epoch: int, data: bytes) -> None:
        self._put_term_record(agent, epoch, data, TERMS)

    def read_term_starts(self, agent: str) -> dict[tuple[int, str], bytes]:
        return records_of_every_node(self.root, self.subtrees(), agent, self._problems, TERMS)

    def put_chain_choice(self, agent: str, epoch: int, data: bytes) -> None:
        self._put_term_record(agent, epoch, data, CHOICES)

    def read_chain_choices(self, agent: str) -> dict[tuple[int, str], bytes]:
        return records_of_every_node(self.root, self.subtrees(), agent, self._problems, CHOICES)

    @os_errors
    def _put_term_record(self, agent: str, epoch: int, data: bytes, kind: str) -> None:
        check_name("agent id", agent)
        self._writer()  # a reader writes nothing
        write_term_record(self.root, self.node, agent, epoch, data, kind)

    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        mine = self._writer()
        # Bounds before the fence, as every store: nothing is read or written for them.
        refuse(check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed))
        self._lease.check_fence(agent, fence, seq)
        return mine.put_checkpoint(agent, fence, seq, blob, consumed)

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        """Every chain's checkpoints merged (a node restores by the lineage instead)."""
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
        refuse(check_effect_bounds(seq, index, kind, len(blob)))
        self._lease.check_fence(agent, fence, seq)
        mine.put_effect(agent, fence, seq, index, kind, blob)

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        return {} if self._mine is None else self._mine.read_effects(agent, seq)

    def read_chain_effects(self, agent: str, node: str, seq: int) -> dict[tuple[int, str], bytes]:
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

    def _by_node(self, what: str, read: Callable[[RecordStore], Sequence[R]]) -> dict[str, list[R]]:
        """Each node's records, read from every subtree (``merge.by_node``)."""
        subtrees = self.subtrees()
        return by_node(self._subtrees.each(what, read, subtrees), set(subtrees), self.node)

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        chosen = self._by_node(f"heartbeats of {agent}", lambda store: store.list_heartbeats(agent))
        # Each subtree's read keeps to HEARTBEATS_READ; so does the merge, by node id.
        return [beat for beats in chosen.values() for beat in beats[:1]][: HEARTBEATS_READ.count]

    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._writer().remove_heartbeat(agent, node)

    def append_event(self, agent: str, event: Event) -> None:
        self._writer().append_event(agent, event)

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        chosen = self._by_node(f"events of {agent}", lambda store: store.read_events(agent, after))
        return [event for events in chosen.values() for event in events]

    def forget_agent(self, agent: str) -> None:
        raise StoreError(
            f"{self.root} is a synced folder: an agent's records are in every node's subtree, "
            "which only that node writes. Stop its nodes and remove agents/"
            f"{agent} from each node's subtree on its own machine"
        )

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
