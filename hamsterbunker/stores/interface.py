"""The store contract: the atomic operations the lease, the term and the clients need.

A store subclasses ``Store`` (inheriting ``tail``, ``chains`` and the restore reads'
defaults); ``tests/stores/contract`` holds every store to it. Callers ask the store
(``chains``, ``report``), never its type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

from ..core.blob import Blob
from ..core.errors import CorruptRecord
from ..records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord
from .base import (
    AdmissionState,
    Consumed,
    Fence,
    RestoreRead,
    StoreGuarantees,
    StoreReport,
    newest_first,
)
from .chains import Chains
from .tail import GenericTail, Tail

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """A shared store. Every method but ``watch`` is blocking (the runtime calls them from
    threads). Whatever a read returns is unauthenticated; reads of several entries leave
    out, logged once, what does not parse or is over its bound (``core.limits``)."""

    url: str  # as it may be shown: no credential (urls.redacted_url)
    guarantees: StoreGuarantees
    warnings: list[str]

    def read_cluster(self) -> ClusterRecord | None:
        """The cluster record, or None before the first node created it."""

    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        """Store record unless one exists (atomically); return the record that is stored."""

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        """Compare-and-set of the cluster record against ``expected.to_json()``, durably;
        returns new. ClusterChanged, storing nothing, if another record or none is stored."""

    # Each reseal_* (``hb rotate-secret commit``) replaces a record's sealed bytes old with
    # new in one atomic step against the record's writers and removals, durably; False,
    # changing nothing, if it is gone or holds other bytes; StoreError, changing nothing,
    # if new is outside the record's bounds.

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        """Re-seal retained checkpoint info (new as long as old)."""

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Re-seal unconsumed submission number (new as long as old)."""

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        """Re-seal effect-journal record (seq, index, kind)."""

    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        """One page of the kept sealed replies numbered above after, oldest first, and the
        after to read on from (None once nothing is left).

        At most limit replies (1 to ``reseal.REPLY_PAGE``), looking at no more than
        ``REPLY_SCAN_FACTOR`` times as many consumed records: a page may be empty and not
        the last. A reply over ``MAX_REPLY_BYTES`` is logged and left out.
        """

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Re-seal the reply of kept consumed submission number (False without a reply)."""

    def list_agents(self) -> list[str]:
        """The ids of the agents anything was written for, sorted; reading never makes one.
        At most ``MAX_LISTED_AGENTS``; a name that is no agent id is skipped."""

    def read_lease(self, agent: str) -> LeaseRecord | None:
        """The agent's lease record as last written, or None if never written.
        UnreadableLease if what is stored does not parse (``found`` names it)."""

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored version is expected_version (None: no record yet),
        atomically against every other lease write and fenced write; returns the record
        stored with its new version. LeaseConflict otherwise (or UnreadableLease)."""

    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored lease record is still the unreadable one read_lease
        reported as found; atomic and fencing as cas_lease. LeaseConflict, writing nothing,
        if it changed since. Stored under new.version, or the store's own (etcd)."""

    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        """Store a sealed checkpoint durably, only if fence is the current lease's (checked
        in the same atomic step): Fenced otherwise.

        StoreError, storing nothing, if the fence's epoch already stored a checkpoint at or
        above seq (another epoch's never keeps it out, and one under the same seq may be
        replaced), or outside ``check_checkpoint_bounds``. ``blob``'s pieces are made as
        they are written; if making them raises, nothing is stored. Retention keeps the
        newest checkpoints at or below seq; once this one is durable, the effect journal of
        every step at or below seq is removed.

        ``consumed`` (at most ``MAX_CONSUMED_PER_STEP``, each within ``check_reply_bounds``)
        commit with it, all or nothing: each leaves ``read_inbox`` and the inbox's limits,
        and its reply becomes readable by ``read_admission`` (a number never admitted is
        still recorded). The newest ``keep_replies`` consumed are kept; older ones go with
        their request ids.
        """

    def put_checkpoint_and_release(
        self,
        agent: str,
        fence: Fence,
        seq: int,
        blob: Blob,
        consumed: Sequence[Consumed],
        expected_version: int,
        released: LeaseRecord,
    ) -> tuple[CheckpointInfo, LeaseRecord | None]:
        """put_checkpoint, and in the same commit, where the store can, cas_lease from
        expected_version to released (a leader's last publish before a stop: one round
        trip for both). The lease record stored, or None if it was not written (the
        caller releases then)."""
        also = (consumed,) if consumed else ()  # stores wrapped by tests take four arguments
        return self.put_checkpoint(agent, fence, seq, blob, *also), None

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        """Retained checkpoints, newest first: by seq, then epoch, both descending."""

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        """The sealed bytes of one retained checkpoint: StoreError if it is gone,
        CorruptRecord, unread, if over ``MAX_CHECKPOINT_BYTES``."""

    def read_checkpoint_from(
        self, agent: str, seq: int, epoch: int
    ) -> tuple[CheckpointInfo, bytes] | None:
        """The oldest retained checkpoint at or after seq under epoch (the one a lease record
        names, or one published since), with its description: one read where the store can
        (a standby's hot copy). None if there is none."""
        named = [i for i in self.list_checkpoints(agent) if (i.seq, i.epoch) >= (seq, epoch)]
        if not named:
            return None
        oldest = min(named, key=lambda info: (info.seq, info.epoch))
        return oldest, self.read_checkpoint(agent, oldest)

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        """cas_lease for a new term, with read_for_restore as of that write where a backend
        can make both one bounded atomic step (etcd); None otherwise, or if that read
        failed: the term's restore reads for itself."""
        return self.cas_lease(agent, expected_version, new), None

    def read_for_restore(self, agent: str) -> RestoreRead:
        """What a restore reads first: the checkpoints listed, the loss-acceptance record and
        the newest checkpoint's bytes (errors as those reads raise them)."""
        infos = newest_first(self.list_checkpoints(agent))
        try:
            acceptance, problem = self.read_acceptance(agent), ""
        except CorruptRecord as exc:
            acceptance, problem = None, str(exc)
        newest = self.read_checkpoint(agent, infos[0]) if infos else None
        return RestoreRead(infos, acceptance, newest, problem)

    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        """Store the sealed ``kind`` ("intent" or "outcome") record of step seq's effect
        ``index`` durably, replacing one stored there, only under fence (Fenced, as
        put_checkpoint). StoreError, storing nothing, outside ``check_effect_bounds``."""

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        """Step seq's effect journal: (index, kind) -> sealed bytes, within
        ``read_bounds.EFFECTS_READ``."""

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        """Admit a sealed submission as number, once per request id, atomically and durably:
        (number, duplicate).

        A known request id (pending, or consumed and kept) stores nothing and returns its
        number with duplicate True. Else NotNextNumber unless number is one above the last
        admitted; InboxFull past ``MAX_INBOX_COUNT`` or ``MAX_INBOX_BYTES`` unconsumed;
        StoreError outside ``check_submission_bounds``.
        """

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        """Unconsumed submissions numbered above after, oldest first: (number, sealed bytes),
        within ``read_bounds.INBOX_READ`` (where planted entries pass it, the read stops and
        one after the last number returned goes on)."""

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        """What the store knows of request_id's admission, or None if nothing (any more). A
        reply over ``MAX_REPLY_BYTES`` or unparsable is taken as no reply yet."""

    def read_acceptance(self, agent: str) -> bytes | None:
        """The agent's loss-acceptance record, unopened, or None; CorruptRecord if over
        ``MAX_RECORD_BYTES``."""

    def put_acceptance(self, agent: str, data: bytes) -> None:
        """Replace the agent's loss-acceptance record durably."""

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        """Replace this node's heartbeat."""

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        """Every node's last heartbeat."""

    def remove_heartbeat(self, agent: str, node: str) -> None:
        """Drop a node's heartbeat (graceful stop). No error if absent."""

    def append_event(self, agent: str, event: Event) -> None:
        """Append to the event log of event.node. Each log is bounded; old events fall off."""

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        """Events with n above after[node] (0 if absent), each node's in order."""

    def forget_node(self, agent: str, node: str) -> None:
        """Drop a node's heartbeat and event log (``hb forget``; the caller makes sure the
        node is dead), a change ``watch`` reports. No error if absent; ConfigError for a
        node that is no node id."""

    def forget_agent(self, agent: str) -> None:
        """Remove every record of agent: its lease, checkpoints, effect journal, inbox,
        heartbeats and events, and its place in list_agents (``hb forget --agent``, which
        looks for live nodes first). StoreError where the store cannot (a synced folder)."""

    def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[LeaseRecord | None]:
        """Yield whenever the agent's lease or inbox may have changed: a hint, never proof.

        Admissions and consumptions are changes; other records may wake it too. With
        lease_only only the lease record matters; with terms_only as well, only a change of
        ``LeaseRecord.term()`` or of an unreadable record (not renewals). A lease_only watch
        whose backend's notices carry the record yields it, version set (it may already be
        replaced, and is as forgeable as the stored one); otherwise None: read to know.
        """

    @property
    def chains(self) -> Chains | None:
        """The chain operations of a store that keeps one chain of checkpoints per node (a
        synced folder); None, this default, elsewhere."""
        return None

    def report(self) -> StoreReport:
        """What this store says of itself. A synced folder's lists the problems its reads so
        far reported: call it after them."""

    def tail(self, agent: str) -> Tail:
        """Follow the agent's new events and current heartbeats (``stores.tail``)."""
        return GenericTail(self, agent)

    def check(self) -> None:
        """StoreUnavailable unless the store itself is there and answering (for a monitor:
        a file store reads a removed store as an empty one)."""

    def close(self) -> None:
        """Release what the store holds open."""
