"""The store contract: the few atomic operations the lease and fencing logic needs.

The lease logic lives above this contract (``hamsterbunker.lease``); a backend
only has to make each operation atomic as stated. One contract test suite
(``tests/stores/contract``) runs against every backend.

A backend subclasses ``Store`` explicitly: it inherits the defaults (``tail``,
the generic tail; ``chains``, none), and mypy refuses to instantiate a backend
that leaves any other method out.

Callers never ask which backend they have: what differs between stores is
said by the store (``chains``, ``report``), so code outside this package never
imports a backend's module nor checks a store's type (``lint-imports``).
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
    """A shared store. Every method is blocking; the runtime calls them from threads."""

    url: str  # as it may be shown: no credential (urls.redacted_url)
    guarantees: StoreGuarantees
    warnings: list[str]

    def read_cluster(self) -> ClusterRecord | None:
        """The cluster record, or None before the first node created it."""

    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        """Store record unless one exists (atomically); return the record that is stored."""

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        """Replace the cluster record with new only if it is still expected (compare-and-set).

        The stored bytes are compared with ``expected.to_json()`` and new written
        in one atomic step, durably; ClusterChanged, storing nothing, if the
        stored record is another one or gone. Returns new. (``hb rotate-secret``:
        nodes agree on the keys because each change is made against the last.)
        """

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        """Replace the sealed bytes of retained checkpoint info with new, only if they are
        still old, in one atomic step against put_checkpoint and its retention; durable as
        a checkpoint is. False, changing nothing, if it is gone or holds other bytes.

        The compare with old is the fence: a re-seal (``hb rotate-secret commit``)
        never brings back a checkpoint retention removed, nor overwrites one a
        leader wrote meanwhile. new must be as long as old (the same checkpoint
        sealed under another key), else StoreError and nothing changes.
        """

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Replace the sealed bytes of unconsumed submission number with new, only if they
        are still old, in one atomic step against admit and the consumption a checkpoint
        commits; durable as an admission is. False, changing nothing, if it is consumed,
        gone or another. new must be as long as old (the inbox's byte totals count it),
        else StoreError and nothing changes.
        """

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        """Replace the effect-journal record (seq, index, kind) with new, only if it is
        still old, in one atomic step against put_effect and the removal of the journal;
        durable as put_effect is. False, changing nothing, if it is gone or another.
        StoreError for numbers or a size outside ``check_effect_bounds``.
        """

    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        """One page of the sealed replies of the kept consumed submissions numbered above
        after, oldest first, and where the next page starts: (replies, the after to read
        on from, or None once nothing is left). For ``hb rotate-secret commit``.

        A page holds at most limit replies (1 to ``stores.reseal.REPLY_PAGE``) and
        looks at no more than ``REPLY_SCAN_FACTOR`` times as many consumed records
        (one consumed without a reply, or junk, counts): it may be empty and still
        not the last. The replies are those ``read_admission`` gives. Not
        authenticated: a record that does not parse, or a reply over
        ``MAX_REPLY_BYTES``, is logged and left out, reading no more than that.
        """

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Replace the sealed reply of kept consumed submission number with new, only if it
        is still old, in one atomic step against the consumption a checkpoint commits and
        its retention; durable as that consumption is. False, changing nothing, if it is
        gone, another, or consumed without a reply. StoreError, changing nothing, for a
        number or a size of new outside ``check_reply_bounds``.
        """

    def list_agents(self) -> list[str]:
        """The ids of the agents the store holds records of, sorted (for ``hb status``).

        An agent is listed once anything was written for it (a lease, a heartbeat,
        a submission); reading never makes one. Not authenticated: a name that is
        not a valid agent id is skipped. At most ``MAX_LISTED_AGENTS``, and the
        work is bounded however much was planted.
        """

    def read_lease(self, agent: str) -> LeaseRecord | None:
        """The agent's lease record as last written, or None if never written.

        UnreadableLease if what is stored there does not parse (or is no record as
        this store writes one), naming it for replace_unreadable_lease.
        """

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored version is expected_version (None: no record yet).

        Atomic against every other cas_lease and put_checkpoint. Returns the
        stored record with its new version; raises LeaseConflict otherwise
        (or UnreadableLease, where the backend reads the record to compare).
        """

    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored lease record is still the unreadable one that
        read_lease reported as found (``UnreadableLease.found``).

        Atomic as cas_lease is, and fencing as it does: a write under the fence of
        any earlier lease is refused (Fenced) afterwards. LeaseConflict, writing
        nothing, if the record changed since (readable again, gone, or other junk).
        The record is stored with version new.version where the record carries
        its version (the caller picks one no earlier record is likely to have
        had), or with the store's own where it keeps one (etcd's revision).
        """

    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        """Store a sealed checkpoint durably, only if fence matches the current lease.

        The fence check (holder, session and epoch equal the stored lease's) and
        the write are one atomic step. Raises Fenced if the lease moved on.
        Raises StoreError, storing nothing, if a checkpoint of the fence's epoch
        at or above seq is stored (a term numbers upwards and never overwrites
        its own), or if seq, the epoch or the size is outside the bounds of
        ``hamsterbunker.core.limits.check_checkpoint_bounds`` (with its message).
        ``blob`` is bytes, or pieces made as they are taken (``hamsterbunker.core.blob``;
        a publish's, encrypted while they are written): their length is checked
        before anything is written; if making them raises, nothing is stored and
        that is raised.

        Only the runtime can tell an authentic checkpoint from junk written by
        someone without the secret, so nothing stored under *another* epoch,
        whatever its number, keeps this write out: the caller numbers on from
        the newest checkpoint that authenticates. Retention keeps the newest
        few checkpoints at or below seq and removes older ones; a checkpoint
        above seq (junk, or a damaged one the caller skipped) is left as it is.
        A checkpoint of another epoch under the same seq may be replaced.

        Once the checkpoint is durable, the same call removes the effect journal
        (``put_effect``) of every step at or below seq: a replay only ever reads
        the journal of the step after the newest checkpoint, so these are never
        read again. Never before the checkpoint is durable: a crash in between
        must leave the journal of a step that is not yet published. What a
        crash leaves behind is removed by a later checkpoint.

        ``consumed`` (at most ``MAX_CONSUMED_PER_STEP``, each within
        ``check_reply_bounds``, else StoreError and nothing stored) are the
        submissions the step consumed. They commit with the checkpoint, all or
        nothing: once it is accepted, each is consumed (``read_inbox`` no longer
        lists it, it no longer counts towards the inbox's limits) and its reply
        is readable by ``read_admission``; if the write is refused or cut short,
        none is. A number with no pending entry (gone, never admitted) is still
        recorded as consumed. The newest ``keep_replies`` consumed records are
        kept (by number); older ones are removed with their request id, which a
        later ``admit`` then takes as new.
        """

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        """Retained checkpoints, newest first: by seq, then epoch, both descending.

        What the store holds under a checkpoint's name is not authenticated: an
        entry whose name or description does not parse, or whose numbers are
        outside ``hamsterbunker.core.limits``, is logged and left out, never raised.
        """

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        """The sealed bytes of one retained checkpoint (StoreError if it is gone).

        Raises CorruptRecord, reading no more than that, for stored bytes over
        ``hamsterbunker.core.limits.MAX_CHECKPOINT_BYTES``.
        """

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        """cas_lease for a new term, and, where the backend can make both in one atomic
        step of bounded size (etcd: one txn), read_for_restore as of that write: the new
        holder's restore then costs no round trip of its own. None otherwise, or if
        that read failed: the term's restore reads for itself.

        A default that read after the write would hold up the keeper's first
        renewal for the read of a checkpoint of any size: this one does not read.
        """
        return self.cas_lease(agent, expected_version, new), None

    def read_for_restore(self, agent: str) -> RestoreRead:
        """What a restore reads first: the checkpoints listed, the loss-acceptance record,
        and the newest checkpoint's bytes (errors as those calls raise them).

        This default makes those reads one after another; a backend that can
        make them in one round trip offers its own.
        """
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
        """Store one sealed effect-journal record of step seq durably, only under fence.

        The record is the ``kind`` ("intent" or "outcome") of the step's effect
        number ``index``. The fence check (as for put_checkpoint) and the write
        are one atomic step; Fenced if the lease moved on. Durable as a
        checkpoint is before it returns. Replaces a record under the same
        (seq, index, kind). Raises StoreError, storing nothing, for numbers or a
        size outside ``hamsterbunker.core.limits.check_effect_bounds`` (with its
        message).
        """

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        """The effect journal of step seq: (index, kind) -> the sealed bytes stored.

        Not authenticated (the caller opens each record). An entry whose name
        does not parse, whose numbers or kind are outside
        ``check_effect_bounds``, or whose bytes are over
        ``hamsterbunker.core.limits.MAX_EFFECT_BYTES`` is logged and left out, never
        raised, reading no more than that limit of it.
        """

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        """Admit a sealed submission as number, once per request id, in one atomic step.

        Returns (number, duplicate). If request_id is known (pending, or consumed
        and still kept), nothing is stored and its number comes back with
        duplicate True. Otherwise number must be the inbox's next one (one above
        the last admitted, 1 for the first), else NotNextNumber says which is,
        storing nothing. Then InboxFull (naming the limit) if admitting it would
        hold more than ``MAX_INBOX_COUNT`` unconsumed submissions or more than
        ``MAX_INBOX_BYTES`` of them; StoreError for a number, request id or size
        outside ``check_submission_bounds``. Durable before it returns. Two
        clients racing with one request id get one admission between them.
        """

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        """Unconsumed submissions numbered above after, oldest first: (number, sealed bytes).

        Within ``read_bounds.INBOX_READ``: at most ``MAX_INBOX_COUNT`` of them and
        ``MAX_INBOX_BYTES`` in all, which a genuine inbox never passes; where
        planted entries would pass it the read stops, and a read after the last
        number returned goes on. Not authenticated: an entry whose name does not
        parse, whose number is out of bounds or whose bytes are over
        ``MAX_SUBMISSION_BYTES`` is logged and left out, reading no more than
        that limit of it.
        """

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        """What the store knows of request_id's admission, or None if nothing (any more).

        Not authenticated. A reply over ``MAX_REPLY_BYTES`` or a record that
        does not parse is logged and taken as no reply yet.
        """

    def read_acceptance(self, agent: str) -> bytes | None:
        """The agent's loss-acceptance record (``hb accept-loss``), or None if there is none.

        Opaque bytes, authenticated by the caller. CorruptRecord if over
        ``hamsterbunker.core.limits.MAX_RECORD_BYTES``.
        """

    def put_acceptance(self, agent: str, data: bytes) -> None:
        """Replace the agent's loss-acceptance record (durably, as a checkpoint is stored)."""

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
        """Drop a node's heartbeat and its whole event log (``hb forget``). No error if absent.

        Afterwards ``list_heartbeats``, ``read_events`` and every tail show
        nothing of node, and nothing of any other node has changed. The
        caller makes sure the node is dead: a node that writes again shows
        again, its log starting afresh (a new process numbers its events from
        1), and a tail that read the old log reads the new one from its start.
        node is checked with ``records.check_name`` before it names any key or
        path (ConfigError). It is a change that ``watch`` reports.
        """

    def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[LeaseRecord | None]:
        """Yield whenever the agent's lease or inbox may have changed: a hint, never proof.

        An admission and a checkpoint that consumes submissions are changes: a
        node waiting for its inbox and a client waiting for a reply are woken
        by them. Other records (heartbeats, events, checkpoints) may wake it too,
        or not.

        With lease_only, only changes of the lease record matter (a standby
        waiting for a release); a backend may then stay quiet about the rest.
        With terms_only as well, only a change of ``LeaseRecord.term()`` (a
        release, a takeover, an operator's request) or of a record that cannot
        be read matters: the backend stays quiet through renewals.

        A lease_only watch of a backend whose change notices carry the record
        (etcd's watch events, Redis' messages) yields the record, its version
        set: what a read would have returned at that change, so a node spares
        that read's round trip. It may already be replaced (a compare-and-set
        on its version then fails), and a writer without the secret can forge
        it as it can the stored one. Otherwise, and after a gap in the notices,
        it yields None: read to know.
        """

    @property
    def chains(self) -> Chains | None:
        """The store's chain operations if it keeps one chain of checkpoints per node (a
        synced folder: ``stores.chains``); None, this default, if its one lease keeps one
        chain."""
        return None

    def report(self) -> StoreReport:
        """What this store says of itself (``StoreReport``). A synced folder's reads its
        copy (the node subtrees and the sync tool's files, bounded as its reads are) and
        lists the problems its reads so far reported: call it after them."""

    def tail(self, agent: str) -> Tail:
        """Follow the agent's new events and current heartbeats (see ``stores.tail``).

        This default reads through read_events and list_heartbeats; a backend
        with a cheaper way to read only what changed offers its own.
        """
        return GenericTail(self, agent)

    def check(self) -> None:
        """Raise StoreUnavailable unless the store itself is there and answering.

        For a monitor: a store that reads a missing record as "not written
        yet" (the file store) would show a removed store as an empty cluster.
        """

    def close(self) -> None:
        """Release what the store holds open."""
