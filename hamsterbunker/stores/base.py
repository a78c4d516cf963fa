"""What the store interface (``interface.Store``) speaks in, and the checks every store
makes the same way."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.errors import CorruptRecord, Fenced, StoreError, UnreadableLease
from ..core.limits import (
    MAX_CONSUMED_PER_STEP,
    MAX_EPOCH,
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    check_reply_bounds,
)
from ..records import CheckpointInfo, LeaseRecord, parse_json

__all__ = [
    "MAX_LISTED_AGENTS",
    "AdmissionState",
    "Consumed",
    "Fence",
    "HeardLease",
    "Refusal",
    "RestoreRead",
    "StoreGuarantees",
    "StoreReport",
    "SyncedFolder",
    "TakenJournals",
    "check_consumed",
    "check_fence",
    "check_own_epoch",
    "check_reseal",
    "describe_fence_text",
    "fence_text",
    "inbox_full",
    "newest_first",
    "parse_fence_text",
    "parse_lease",
    "refuse",
]


@dataclass(frozen=True)
class Fence:
    """The lease a writer believes it holds; the store compares it in the write's atomic step."""

    holder: str
    session: str
    epoch: int

    def matches(self, lease: LeaseRecord | None) -> bool:
        """Whether lease is the one this fence names (holder, session and epoch)."""
        return lease is not None and (lease.holder, lease.session, lease.epoch) == (
            self.holder,
            self.session,
            self.epoch,
        )

    def to_text(self) -> str:
        """This fence as the stores that compare it themselves keep it (``fence_text``)."""
        return fence_text(self.holder, self.session, self.epoch)

    def refused(self, seq: int, now: str) -> Fenced:
        """The error for checkpoint seq written under this fence while the lease is now `now`."""
        return Fenced(
            f"checkpoint {seq} of {self.holder} under epoch {self.epoch} refused: "
            f"the lease is now {now}"
        )


def fence_text(holder: str | None, session: str, epoch: int) -> str:
    """A lease's fence as stored beside the lease, compared byte for byte by fenced writes:
    ``[holder, session, epoch]`` in JSON (a released lease's equals no writer's)."""
    return json.dumps([holder, session, epoch])


def parse_fence_text(data: bytes) -> tuple[str | None, str, int]:
    """(holder, session, epoch) of a stored fence; CorruptRecord for anything else."""
    doc = parse_json(data, "lease fence")
    if not isinstance(doc, list) or len(doc) != 3:
        raise CorruptRecord("lease fence is not [holder, session, epoch]")
    holder, session, epoch = doc
    if not (holder is None or isinstance(holder, str)) or not isinstance(session, str):
        raise CorruptRecord("lease fence has a holder or session of the wrong type")
    if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH:
        raise CorruptRecord(f"lease fence epoch is not a number in 0..{MAX_EPOCH}")
    return holder, session, epoch


def describe_fence_text(data: bytes | None) -> str:
    """A stored fence in words, for a Fenced message (None: no fence is stored)."""
    if data is None:
        return "no lease"
    try:
        holder, _session, epoch = parse_fence_text(data)
    except CorruptRecord:
        return "an unreadable fence"
    return f"epoch {epoch} released" if holder is None else f"epoch {epoch} held by {holder}"


def parse_lease(data: bytes, found: Callable[[], str]) -> LeaseRecord:
    """data as a lease record, or UnreadableLease naming found() (what is stored instead)."""
    try:
        return LeaseRecord.from_json(data)
    except CorruptRecord as exc:
        raise UnreadableLease(str(exc), found()) from exc


def check_fence(lease: LeaseRecord | None, fence: Fence, seq: int) -> None:
    """Raise Fenced unless lease is the one fence names (for backends that check in Python)."""
    if not fence.matches(lease):
        now = "no lease" if lease is None else f"epoch {lease.epoch} held by {lease.holder}"
        raise fence.refused(seq, now)


def check_own_epoch(stored: list[CheckpointInfo], epoch: int, seq: int) -> None:
    """StoreError if epoch already stored a checkpoint at or above seq (another epoch's
    may be junk written without the secret: it never keeps the leader out)."""
    own = [info.seq for info in stored if info.epoch == epoch and info.seq >= seq]
    if own:
        raise StoreError(
            f"checkpoint sequence must increase: {seq} is not above {max(own)}, which epoch "
            f"{epoch} already stored"
        )


@dataclass(frozen=True)
class Consumed:
    """A submission a step consumed, stored atomically with that step's checkpoint."""

    number: int
    request_id: str
    reply: bytes | None  # sealed (a node seals one for every consumption); None proves nothing


@dataclass(frozen=True)
class AdmissionState:
    """What the store knows of one request id's admission (``read_admission``): forgeable;
    only a sealed reply that opens as this number's and request id's proves it done."""

    number: int
    consumed: bool
    reply: bytes | None  # the sealed reply once consumed (None: none readable)


def refuse(problem: str | None) -> None:
    """StoreError(problem), unless a check found none (None)."""
    if problem is not None:
        raise StoreError(problem)


def check_consumed(consumed: Sequence[Consumed]) -> str | None:
    """Why a checkpoint may not carry these consumed submissions, or None if it may."""
    if len(consumed) > MAX_CONSUMED_PER_STEP:
        return (
            f"a step consumed {len(consumed)} submissions, above the limit of "
            f"{MAX_CONSUMED_PER_STEP} per step"
        )
    for each in consumed:
        size = None if each.reply is None else len(each.reply)
        problem = check_reply_bounds(each.number, each.request_id, size)
        if problem is not None:
            return problem
    return None


def inbox_full(count: int, size: int) -> str | None:
    """Why an inbox holding count unconsumed submissions of size bytes is over its limits."""
    if count > MAX_INBOX_COUNT:
        return f"inbox is full: it holds {MAX_INBOX_COUNT} unconsumed submissions, the limit"
    if size > MAX_INBOX_BYTES:
        return (
            f"inbox is full: this submission would make its unconsumed submissions {size} "
            f"bytes, above the limit of {MAX_INBOX_BYTES} bytes ({MAX_INBOX_BYTES // 2**20} MiB)"
        )
    return None


def check_reseal(info: CheckpointInfo, old: bytes, new: bytes) -> None:
    """StoreError unless new can replace old as checkpoint info's bytes (reseal_checkpoint)."""
    if len(new) != len(old):
        raise StoreError(
            f"a re-sealed checkpoint {info.seq} must be as long as the one it replaces "
            f"({len(new)} bytes, not {len(old)})"
        )


# The most agents list_agents returns: a listing stops there however many were planted.
MAX_LISTED_AGENTS = 1000


@dataclass(frozen=True)
class RestoreRead:
    """What ``Store.read_for_restore`` found."""

    infos: list[CheckpointInfo]  # newest first: by epoch, then seq (newest_first)
    acceptance: bytes | None  # the loss-acceptance record, unopened
    # The sealed bytes of infos[0]; None when nothing is listed, or where take_lease did
    # not read it along (too big, or not the one the lease record names): read it then.
    newest: bytes | None
    acceptance_problem: str = ""  # why the acceptance record could not be taken (CorruptRecord)
    # The cluster record as read along, unparsed (None: not read along, or over its bound):
    # a new term follows the cluster's keys from it with no read of its own.
    cluster: bytes | None = None
    # Read along by take_lease for the term's first step (None: not read along, or cut short
    # by the bound): the effect journals from the step after the checkpoint the lease
    # record names, and read_inbox(agent, 0).
    journals: TakenJournals | None = None
    inbox: list[tuple[int, bytes]] | None = None


@dataclass(frozen=True)
class TakenJournals:
    """The effect journals of steps first..through (None: every step from first on) as the
    commit that took the lease read them: final, since that commit fenced off every older
    term. records: by step, as ``Store.read_effects`` returns them."""

    first: int
    through: int | None
    records: dict[int, dict[tuple[int, str], bytes]]

    def of(self, seq: int) -> dict[tuple[int, str], bytes] | None:
        """Step seq's journal, or None if this read does not cover it (read it then)."""
        if seq < self.first or (self.through is not None and seq > self.through):
            return None
        return self.records.get(seq, {})


def newest_first(infos: list[CheckpointInfo]) -> list[CheckpointInfo]:
    """Checkpoints in the order a restore tries them: by epoch, then seq, descending."""
    return sorted(infos, key=lambda info: (info.epoch, info.seq), reverse=True)


class HeardLease:
    """What a lease watch yielded since it was last asked: the newest record, or None once
    a change came without one (a read must tell then)."""

    def __init__(self) -> None:
        self._newest: LeaseRecord | None = None
        self._bare = False  # a change without a record since the last take

    def add(self, record: LeaseRecord | None) -> None:
        if record is None:
            self._bare = True
        elif self._newest is None or record.version > self._newest.version:
            self._newest = record

    def take(self) -> LeaseRecord | None:
        newest = None if self._bare else self._newest
        self._newest, self._bare = None, False
        return newest


@dataclass(frozen=True)
class StoreGuarantees:
    """What a backend promises, stated so users can judge it."""

    mutual_exclusion: str
    durability: str
    across_hosts: str


@dataclass(frozen=True)
class SyncedFolder:
    """This machine's copy of a synced folder, as a syncdir store reads it (docs/syncdir.md)."""

    nodes: tuple[str, ...]  # the node subtrees the copy holds, by node id
    sync_files: tuple[str, ...]  # the sync tool's own files, relative to the root
    problems: tuple[str, ...]  # what the store skipped as unreadable so far (each once)


class Refusal:
    """Operations a store declines by design (``StoreReport.refuses``), raising StoreError:
    a caller can tell before it starts."""

    KEY_ROTATION = "key-rotation"  # replace_cluster and every reseal_*
    FORGET_OTHER_NODE = "forget-other-node"  # forget_node of a node with its own subtree
    FORGET_AGENT = "forget-agent"  # forget_agent


@dataclass(frozen=True)
class StoreReport:
    """What a store says of itself (``Store.report``), read where a caller would otherwise
    ask for its type: ``hb status``, ``hb-tui``, ``hb choose-chain``."""

    cheap_watch: bool  # a watch costs a monitor less than polling (``Capability.CHEAP_WATCH``)
    synced_folder: SyncedFolder | None = None  # None: the store is not a synced folder
    refuses: frozenset[str] = frozenset()  # Refusal's: what this store declines
