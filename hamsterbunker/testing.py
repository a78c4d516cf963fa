"""Test doubles that ship with the library (in the spirit of ``structlog.testing``).

``MemoryStore`` keeps every record in this process's memory and implements the
store contract of :mod:`hamsterbunker.stores.base` exactly as its docstrings
state, so tests of code built on a store (the lease keeper, the runtime, your
own agent) run fast and without a disk::

    from hamsterbunker.testing import MemoryStore

    store = MemoryStore()
    node_a = Runtime(node_id="a", region="r", store=store, agent=agent, secret=secret)
    node_b = Runtime(node_id="b", region="r", store=store, agent=agent, secret=secret)

Every node that should share the store must be given the *same* MemoryStore
object: it gives mutual exclusion between threads of one process, nothing more.
Records are kept as their JSON forms and parsed on every read, as a real
backend does, so a caller can never change a stored record by mutating an
object it passed in or got back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .blob import Blob
from .errors import (
    ClusterChanged,
    ConfigError,
    CorruptRecord,
    InboxFull,
    LeaseConflict,
    NotNextNumber,
    StoreError,
)
from .limits import (
    INBOX_REPLIES_KEPT,
    MAX_CHECKPOINT_BYTES,
    MAX_EPOCH,
    MAX_RECORD_BYTES,
    MAX_REPLY_BYTES,
    MAX_SEQ,
    check_checkpoint_bounds,
    check_effect_bounds,
    check_submission_bounds,
)
from .read_bounds import EFFECTS_READ, HEARTBEATS_READ, INBOX_READ, BoundedRead
from .records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from .stores._reported import readable
from .stores._terms import TermChanges
from .stores.base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    Store,
    StoreGuarantees,
    check_consumed,
    check_fence,
    check_own_epoch,
    check_reseal,
    inbox_full,
    parse_lease,
)
from .stores.reseal import check_resealed_reply, check_resealed_submission, reply_page_bounds

__all__ = ["MEMORY_GUARANTEES", "MemoryStore"]

log = logging.getLogger(__name__)

MEMORY_GUARANTEES = StoreGuarantees(
    mutual_exclusion="a threading.Lock: real between threads of one process, none beyond it",
    durability="none: everything is lost when the process ends",
    across_hosts="none: one process only (share the same MemoryStore object)",
)

# How often watch() looks at the change counter.
_WATCH_POLL_S = 0.02


def _report(kind: str) -> Callable[[str, bytes, Exception], None]:
    """How the memory store logs a heartbeat or event of this kind that does not parse."""

    def report(node: str, _data: bytes, exc: Exception) -> None:
        log.warning("memory store: ignoring an unreadable %s of %s: %s", kind, node, exc)

    return report


def _found(data: bytes) -> str:
    """What an unreadable lease record is, for replace_unreadable_lease: its digest."""
    return hashlib.sha256(data).hexdigest()


def _parse_lease(data: bytes) -> LeaseRecord:
    return parse_lease(data, lambda: _found(data))


def _listable(info: CheckpointInfo) -> bool:
    """Whether a stored entry's numbers are within hamsterbunker.limits (else left out)."""
    return (
        0 < info.seq <= MAX_SEQ
        and 0 < info.epoch <= MAX_EPOCH
        and 0 <= info.size <= MAX_CHECKPOINT_BYTES
    )


@dataclass
class _Agent:
    """Everything stored for one agent. Only touched with MemoryStore._lock held."""

    lease: bytes | None = None
    # seq -> (info, sealed bytes): the newest keep_checkpoints at or below the last
    # seq written, and whatever was above it. A test may plant junk here.
    checkpoints: dict[int, tuple[CheckpointInfo, bytes]] = field(default_factory=dict)
    # (seq, index, kind) -> sealed bytes: the effect journal. A test may plant junk here.
    effects: dict[tuple[int, int, str], bytes] = field(default_factory=dict)
    # The inbox: the last number admitted; unconsumed number -> (request id, sealed
    # bytes); consumed number -> (request id, sealed reply); request id -> number.
    last_admitted: int = 0
    pending: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    done: dict[int, tuple[str, bytes | None]] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    acceptance: bytes | None = None
    heartbeats: dict[str, bytes] = field(default_factory=dict)
    events: dict[str, deque[bytes]] = field(default_factory=dict)
    changes: int = 0  # moves on every write; watch() polls it


class MemoryStore(Store):
    """A Store kept in memory: thread-safe, one process only."""

    url = "memory://"
    guarantees = MEMORY_GUARANTEES

    def __init__(
        self,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
    ) -> None:
        if keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints must be at least 1")
        if keep_replies < 1:
            raise ConfigError("keep_replies must be at least 1")
        self.keep_replies = keep_replies
        if events_per_node < 1:
            raise ConfigError("events_per_node must be at least 1")
        self.keep_checkpoints = keep_checkpoints
        self.events_per_node = events_per_node
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._cluster: bytes | None = None
        self._agents: dict[str, _Agent] = {}

    def _agent(self, agent: str) -> _Agent:
        """The agent's records (created empty on first use); call with the lock held."""
        found = self._agents.get(agent)
        if found is None:
            check_name("agent id", agent)
            found = self._agents[agent] = _Agent()
        return found

    # -- cluster -----------------------------------------------------------

    def read_cluster(self) -> ClusterRecord | None:
        """The cluster record, or None before the first node created it."""
        with self._lock:
            data = self._cluster
        return None if data is None else ClusterRecord.from_json(data)

    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        """Store record unless one exists (atomically); return the record that is stored."""
        with self._lock:
            if self._cluster is None:
                self._cluster = record.to_json()
            data = self._cluster
        return ClusterRecord.from_json(data)

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        """Replace the cluster record with new only if it is still expected."""
        with self._lock:
            if self._cluster != expected.to_json():
                raise ClusterChanged("the cluster record changed since it was read")
            self._cluster = new.to_json()
        return new

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        """Replace a retained checkpoint's bytes with new, only if they are still old."""
        check_reseal(info, old, new)
        with self._lock:
            state = self._agent(agent)
            found = state.checkpoints.get(info.seq)
            if found is None or found[0].epoch != info.epoch or found[1] != old:
                return False
            state.checkpoints[info.seq] = (found[0], bytes(new))
            state.changes += 1
        return True

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        """Replace an effect-journal record with new, only if it is still old."""
        problem = check_effect_bounds(seq, index, kind, len(new))
        if problem is not None:
            raise StoreError(problem)
        with self._lock:
            state = self._agent(agent)
            if state.effects.get((seq, index, kind)) != old:
                return False
            state.effects[(seq, index, kind)] = bytes(new)
            state.changes += 1
        return True

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Replace an unconsumed submission's sealed bytes with new, only if still old."""
        check_resealed_submission(number, old, new)
        with self._lock:
            state = self._agent(agent)
            found = state.pending.get(number)
            if found is None or found[1] != old:
                return False
            state.pending[number] = (found[0], bytes(new))
            state.changes += 1
        return True

    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        """One page of the kept consumed submissions' replies above after (see Store)."""
        count, scan = reply_page_bounds(limit)
        with self._lock:
            done = self._agent(agent).done
            numbers = sorted(number for number in done if number > after)
            looked = numbers[:scan]
            kept = [(number, done[number][1]) for number in looked]
        replies: list[tuple[int, bytes]] = []
        for index, (number, reply) in enumerate(kept):
            if reply is None:
                continue
            if len(reply) > MAX_REPLY_BYTES:
                log.warning("memory store: leaving out the reply to %d of %s", number, agent)
                continue
            replies.append((number, reply))
            if len(replies) == count:
                more = index + 1 < len(numbers)
                return replies, number if more else None
        return replies, looked[-1] if len(numbers) > len(looked) else None

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        """Replace a kept consumed submission's sealed reply with new, only if still old."""
        check_resealed_reply(number, new)
        with self._lock:
            state = self._agent(agent)
            found = state.done.get(number)
            if found is None or found[1] != old:
                return False
            state.done[number] = (found[0], bytes(new))
            state.changes += 1
        return True

    def list_agents(self) -> list[str]:
        """The agents anything was written for, sorted (a read makes an empty entry: not one)."""
        with self._lock:
            written = [name for name, state in self._agents.items() if state.changes]
        return sorted(written)[:MAX_LISTED_AGENTS]

    # -- lease -------------------------------------------------------------

    def read_lease(self, agent: str) -> LeaseRecord | None:
        """The agent's lease record as last written, or None if never written."""
        with self._lock:
            data = self._agent(agent).lease
        return None if data is None else _parse_lease(data)

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored version is expected_version (None: no record yet)."""
        with self._lock:
            state = self._agent(agent)
            current = None if state.lease is None else _parse_lease(state.lease)
            current_version = None if current is None else current.version
            if current_version != expected_version:
                raise LeaseConflict(
                    f"lease of {agent!r} is at version {current_version}, not {expected_version}"
                )
            stored = replace(new, version=(current_version or 0) + 1)
            state.lease = stored.to_json()
            state.changes += 1
        return stored

    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored lease record is still the unreadable one found."""
        with self._lock:
            state = self._agent(agent)
            if state.lease is None or _found(state.lease) != found:
                raise LeaseConflict(f"the lease record of {agent!r} changed since it was read")
            state.lease = new.to_json()
            state.changes += 1
        return new

    # -- checkpoints -------------------------------------------------------

    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        """Store a sealed checkpoint, only if fence matches the current lease.

        Refused (StoreError) outside the bounds of check_checkpoint_bounds, or if a
        checkpoint of the fence's own epoch at or above seq is stored; anything of
        another epoch, whatever its seq, keeps nothing out. Retention keeps the
        newest keep_checkpoints at or below seq and never touches anything above.
        The consumed submissions commit with it (see Store.put_checkpoint).
        """
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed)
        if problem is not None:
            raise StoreError(problem)
        data = bytes(blob)
        with self._lock:
            state = self._agent(agent)
            lease = None if state.lease is None else LeaseRecord.from_json(state.lease)
            check_fence(lease, fence, seq)
            # Only what the listing would show counts, as in the real backends.
            stored = [i for i, _blob in state.checkpoints.values() if _listable(i)]
            check_own_epoch(stored, fence.epoch, seq)
            info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(data), written=time.time())
            state.checkpoints[seq] = (info, data)  # another epoch's under seq is replaced
            below = sorted((s for s in state.checkpoints if s <= seq), reverse=True)
            for old in below[self.keep_checkpoints :]:
                del state.checkpoints[old]
            for key in [key for key in state.effects if key[0] <= seq]:
                del state.effects[key]  # this step's journal and older: never read again
            self._consume(state, consumed)
            state.changes += 1
        return info

    def _consume(self, state: _Agent, consumed: Sequence[Consumed]) -> None:
        """Mark consumed and keep their replies; forget the oldest past keep_replies."""
        for each in consumed:
            state.pending.pop(each.number, None)
            state.done[each.number] = (each.request_id, each.reply)
            state.numbers.setdefault(each.request_id, each.number)
        for old in sorted(state.done)[: -self.keep_replies]:
            request_id, _reply = state.done.pop(old)
            if state.numbers.get(request_id) == old:
                del state.numbers[request_id]

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        """Retained checkpoints, newest first: by seq, then epoch, both descending.

        An entry outside the bounds of hamsterbunker.limits (only a test can plant
        one here) is left out and logged, as the real backends do.
        """
        with self._lock:
            kept = [info for info, _blob in self._agent(agent).checkpoints.values()]
        listed = []
        for info in kept:
            if _listable(info):
                listed.append(info)
            else:
                log.warning("memory store: leaving out checkpoint %r of %s", info, agent)
        return sorted(listed, key=lambda info: (info.seq, info.epoch), reverse=True)

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        """The sealed bytes of one retained checkpoint; CorruptRecord if over the size limit."""
        with self._lock:
            found = self._agent(agent).checkpoints.get(info.seq)
        if found is None or found[0].epoch != info.epoch:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        if len(found[1]) > MAX_CHECKPOINT_BYTES:
            raise CorruptRecord(
                f"checkpoint {info.seq} of {agent!r} is {len(found[1])} bytes, above the limit "
                f"of {MAX_CHECKPOINT_BYTES} bytes"
            )
        return found[1]

    # -- effect journal ----------------------------------------------------

    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        """Store one effect-journal record of step seq, only if fence matches the current lease."""
        problem = check_effect_bounds(seq, index, kind, len(blob))
        if problem is not None:
            raise StoreError(problem)
        with self._lock:
            state = self._agent(agent)
            lease = None if state.lease is None else LeaseRecord.from_json(state.lease)
            check_fence(lease, fence, seq)
            state.effects[(seq, index, kind)] = bytes(blob)
            state.changes += 1

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        """The journal of step seq, within read_bounds.EFFECTS_READ; a planted entry outside
        the bounds is logged and left out."""
        with self._lock:
            stored = sorted((k, v) for k, v in self._agent(agent).effects.items() if k[0] == seq)
        journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
        for (_seq, index, kind), blob in stored:
            problem = check_effect_bounds(seq, index, kind, len(blob))
            if problem is not None:
                log.warning("memory store: leaving out an effect record of %s: %s", agent, problem)
            elif not journal.offer((index, kind), blob) and journal.full:
                break
        if journal.stopped:
            log.warning(
                "memory store: effect journal of step %d of %s: stopped reading at %d bytes",
                seq,
                agent,
                journal.total,
            )
        return dict(journal.entries)

    # -- inbox -------------------------------------------------------------

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        """Admit a sealed submission as number, once per request id (see Store.admit)."""
        problem = check_submission_bounds(number, request_id, len(blob))
        if problem is not None:
            raise StoreError(problem)
        with self._lock:
            state = self._agent(agent)
            known = state.numbers.get(request_id)
            if known is not None:
                return known, True
            if number != state.last_admitted + 1:
                raise NotNextNumber(number, state.last_admitted + 1)
            full = inbox_full(
                len(state.pending) + 1, sum(len(b) for _r, b in state.pending.values()) + len(blob)
            )
            if full is not None:
                raise InboxFull(full)
            state.pending[number] = (request_id, bytes(blob))
            state.numbers[request_id] = number
            state.last_admitted = number
            state.changes += 1
        return number, False

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        """Unconsumed submissions above after, oldest first (planted junk is left out)."""
        with self._lock:
            pending = sorted(self._agent(agent).pending.items())
        found: BoundedRead[int] = BoundedRead(INBOX_READ)
        for number, (_request_id, blob) in pending:
            if number <= after:
                continue
            if not 0 < number <= MAX_SEQ or found.too_big(len(blob)):
                log.warning("memory store: leaving out submission %d of %s", number, agent)
            elif not found.offer(number, blob):
                break
        if found.stopped:
            log.warning("memory store: inbox of %s: stopped reading at the bound", agent)
        return found.entries

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        """What is known of request_id's admission, or None."""
        with self._lock:
            state = self._agent(agent)
            number = state.numbers.get(request_id)
            if number is None:
                return None
            done = state.done.get(number)
        if done is None or done[0] != request_id:  # consumed is another request's: not this
            return AdmissionState(number, consumed=False, reply=None)
        reply = done[1]
        if reply is not None and len(reply) > MAX_REPLY_BYTES:
            log.warning("memory store: ignoring an oversized reply to %s", request_id)
            reply = None
        return AdmissionState(number, consumed=True, reply=reply)

    # -- loss acceptance ---------------------------------------------------

    def read_acceptance(self, agent: str) -> bytes | None:
        """The agent's loss-acceptance record, or None; CorruptRecord if over MAX_RECORD_BYTES."""
        with self._lock:
            data = self._agent(agent).acceptance
        if data is not None and len(data) > MAX_RECORD_BYTES:
            raise CorruptRecord(
                f"loss-acceptance record of {agent!r} is {len(data)} bytes, above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        return data

    def put_acceptance(self, agent: str, data: bytes) -> None:
        """Replace the agent's loss-acceptance record (StoreError if it could not be read back)."""
        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(
                f"loss-acceptance record of {agent!r} is {len(data)} bytes, above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        with self._lock:
            state = self._agent(agent)
            state.acceptance = bytes(data)
            state.changes += 1

    # -- heartbeats --------------------------------------------------------

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        """Replace this node's heartbeat."""
        check_name("node id", heartbeat.node)
        data = heartbeat.to_json()
        with self._lock:
            state = self._agent(agent)
            state.heartbeats[heartbeat.node] = data
            state.changes += 1

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        """Every node's last heartbeat, ordered by node id, within read_bounds.HEARTBEATS_READ."""
        stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
        with self._lock:
            beats = self._agent(agent).heartbeats
            for node in sorted(beats):
                if stored.full:
                    break
                if stored.too_big(len(beats[node])):
                    log.warning("memory store: leaving out the heartbeat of %s: too big", node)
                stored.offer(node, beats[node])
        # Only a test can plant a damaged one; skipped as the real backends do.
        return list(readable(stored.entries, Heartbeat.from_json, _report("heartbeat")))

    def remove_heartbeat(self, agent: str, node: str) -> None:
        """Drop a node's heartbeat (graceful stop). No error if absent."""
        check_name("node id", node)
        with self._lock:
            state = self._agent(agent)
            if state.heartbeats.pop(node, None) is not None:
                state.changes += 1

    # -- events ------------------------------------------------------------

    def append_event(self, agent: str, event: Event) -> None:
        """Append to the event log of event.node; the oldest fall off past events_per_node."""
        check_name("node id", event.node)
        data = event.to_json()
        with self._lock:
            state = self._agent(agent)
            log = state.events.get(event.node)
            if log is None:
                log = state.events[event.node] = deque(maxlen=self.events_per_node)
            log.append(data)
            state.changes += 1

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        """Events with n above after[node] (0 if absent), each node's in order."""
        after = after or {}
        with self._lock:
            logs = self._agent(agent).events
            stored = [(node, list(logs[node])) for node in sorted(logs)]
        # Only a test can plant a damaged one; skipped as the real backends do.
        lines = ((node, line) for node, node_lines in stored for line in node_lines)
        parsed = readable(lines, Event.from_json, _report("event"))
        return [event for event in parsed if event.n > after.get(event.node, 0)]

    def forget_node(self, agent: str, node: str) -> None:
        """Drop node's heartbeat and event log (``hb forget``). No error if absent."""
        check_name("agent id", agent)
        check_name("node id", node)
        with self._lock:
            state = self._agents.get(agent)  # a forget of nothing makes no agent
            if state is None:
                return
            beat = state.heartbeats.pop(node, None)
            log = state.events.pop(node, None)
            if beat is not None or log is not None:
                state.changes += 1

    # -- watch -------------------------------------------------------------

    def _changes(self, agent: str) -> int:
        with self._lock:
            return self._agent(agent).changes

    def _lease_bytes(self, agent: str) -> bytes | None:
        with self._lock:
            return self._agent(agent).lease

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[None]:
        """Yield whenever the agent's records changed since the last yield (polled every 20 ms);
        with terms_only, only when the lease record's term did (not on renewals)."""
        if terms_only:
            terms = TermChanges()
            terms.changed(self._lease_bytes(agent))  # the term as the watch begins
            while True:
                await asyncio.sleep(_WATCH_POLL_S)
                if terms.changed(self._lease_bytes(agent)):
                    yield None
        seen = self._changes(agent)
        while True:
            await asyncio.sleep(_WATCH_POLL_S)
            now = self._changes(agent)
            if now != seen:
                seen = now
                yield None

    def check(self) -> None:
        """Nothing to check: the store is this object, there while anyone holds it."""

    def close(self) -> None:
        """Nothing to release: the records stay for other users of this object."""
