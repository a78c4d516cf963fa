"""RecordStore: the store contract (``interface.Store``) over any backend, every record
read within its bound and parsed as unauthenticated input here alone.

The cluster record, heartbeats, event logs and the agents' index are here; the lease in
``leases``, checkpoints and the effect journal in ``checkpoints``, the inbox in ``inbox``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import replace

from ...core.blob import Blob
from ...core.errors import ClusterChanged, LeaseConflict, StoreError
from ...core.limits import (
    INBOX_REPLIES_KEPT,
    MAX_RECORD_BYTES,
    RELEASE_WITH_PUBLISH_BYTES,
    check_effect_bounds,
)
from ...core.read_bounds import HEARTBEATS_READ, ReadBound
from ...records import (
    CheckpointInfo,
    ClusterRecord,
    Event,
    Heartbeat,
    LeaseRecord,
    check_name,
    check_record_name,
)
from .._reported import readable
from .._terms import TermChanges
from ..backend import Backend, Capability, Compare, DeleteRange, Get, Put, Txn
from ..base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    RestoreRead,
    StoreReport,
    check_reseal,
    refuse,
)
from ..interface import Store
from ..reseal import check_resealed_submission
from . import checkpoints, events, inbox
from .base import Layer, Settings, bounded_records, must
from .keys import CLUSTER, INDEX, AgentKeys, folder_range
from .leases import Leases
from .restore import restore_read, restore_reads

__all__ = ["RecordStore"]

_AGENTS_READ = ReadBound(MAX_LISTED_AGENTS, 0, 0)


def _node_name(name: str) -> str | None:
    try:
        return check_record_name(name)
    except StoreError:
        return None


class RecordStore(Leases, Store):
    """Every record of the store contract, laid out on one backend (``layer.keys``)."""

    def __init__(
        self,
        backend: Backend,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int | None = None,
        per_epoch: bool = False,
    ) -> None:
        """per_epoch: retention by epoch (``Settings.per_epoch``: a syncdir node's subtree)."""
        replies = INBOX_REPLIES_KEPT if keep_replies is None else keep_replies
        self.layer = Layer(backend, Settings(keep_checkpoints, events_per_node, replies, per_epoch))
        self.backend = backend
        self.url = backend.url
        self.guarantees = backend.guarantees
        self.warnings = list(backend.warnings)
        self._events = events.EventLogs(self.layer)
        self._leases: dict[str, tuple[bytes, LeaseRecord]] = {}  # see Leases
        self._fences: dict[str, str] = {}

    # -- cluster -----------------------------------------------------------

    def read_cluster(self) -> ClusterRecord | None:
        data = self.layer.get(CLUSTER, MAX_RECORD_BYTES, "the cluster record")
        return None if data is None else ClusterRecord.from_json(data)

    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        result = self.layer.commit(
            Txn(
                compares=[Compare(CLUSTER, None)],
                writes=[Put(CLUSTER, record.to_json())],
                reads=[Get(CLUSTER, MAX_RECORD_BYTES)],
            )
        )
        stored = result.reads[0]
        if not isinstance(stored, bytes):
            raise StoreError("the cluster record is over the limit of bytes, or gone")
        return ClusterRecord.from_json(stored)

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        txn = Txn(
            compares=[Compare(CLUSTER, expected.to_json())], writes=[Put(CLUSTER, new.to_json())]
        )
        if not self.layer.commit(txn).succeeded:
            raise ClusterChanged("the cluster record changed since it was read")
        return new

    def list_agents(self) -> list[str]:
        found = self.backend.scan(INDEX, _AGENTS_READ)
        names = [key[len(INDEX) :] for key in found.keys]  # planted bytes: still a name
        agents = []
        for name in sorted(names):
            try:
                agents.append(check_name("agent id", name))
            except Exception:
                self.layer.reported(f"leaving out an agent index entry {name[:80]!r}")
        return agents[:MAX_LISTED_AGENTS]

    # -- lease -------------------------------------------------------------

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        """cas_lease, with what the new term's restore reads first read in its commit."""
        keys = AgentKeys(agent)
        reads = restore_reads(keys, new, taking=True)
        stored, found = self._cas(agent, expected_version, new, reads)
        return stored, restore_read(self.layer, keys, found, self._fences[agent], new.seq + 1)

    def read_for_restore(self, agent: str) -> RestoreRead:
        keys = AgentKeys(agent)
        known = self._leases.get(agent)
        lease = None if known is None else known[1]
        fence = self._fences.get(agent)  # taken before the listing: it is read under fence
        found = self.layer.commit(Txn(reads=restore_reads(keys, lease))).reads
        read = restore_read(self.layer, keys, found, fence)
        if read.infos and read.newest is None:
            read = replace(read, newest=self.read_checkpoint(agent, read.infos[0]))
        return read

    # -- checkpoints and the effect journal --------------------------------

    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        return checkpoints.put_checkpoint(self.layer, AgentKeys(agent), fence, seq, blob, consumed)

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
        keys = AgentKeys(agent)
        planned = self._release_write(keys, expected_version, released)
        if planned is None or len(blob) > RELEASE_WITH_PUBLISH_BYTES:
            return self.put_checkpoint(agent, fence, seq, blob, consumed), None
        data = bytes(blob)  # made once: written again if the lease changed meanwhile
        try:
            info = checkpoints.put_checkpoint(
                self.layer, keys, fence, seq, data, consumed, planned[0]
            )
        except LeaseConflict:  # an operator's request written into it: released on its own
            return self.put_checkpoint(agent, fence, seq, data, consumed), None
        self._written(keys, planned[1])
        return info, planned[1]

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        fence = self._fences.get(agent)  # taken before the listing: it is read under fence
        return checkpoints.list_checkpoints(self.layer, AgentKeys(agent), fence)

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        return checkpoints.read_checkpoint(self.layer, AgentKeys(agent), info)

    def read_checkpoint_from(
        self, agent: str, seq: int, epoch: int
    ) -> tuple[CheckpointInfo, bytes] | None:
        return checkpoints.read_checkpoint_from(self.layer, AgentKeys(agent), seq, epoch)

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        check_reseal(info, old, new)
        return self.layer.reseal(AgentKeys(agent).checkpoint(info), old, new)

    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        checkpoints.put_effect(self.layer, AgentKeys(agent), fence, seq, index, kind, blob)

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        return checkpoints.read_effects(self.layer, AgentKeys(agent), seq)

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        refuse(check_effect_bounds(seq, index, kind, len(new)))
        return self.layer.reseal(AgentKeys(agent).effect(seq, index, kind), old, new)

    # -- inbox -------------------------------------------------------------

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        return inbox.admit(self.layer, AgentKeys(agent), request_id, number, blob)

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        return inbox.read_inbox(self.layer, AgentKeys(agent), after)

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        return inbox.read_admission(self.layer, AgentKeys(agent), request_id)

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        check_resealed_submission(number, old, new)
        return self.layer.reseal(AgentKeys(agent).submission(number), old, new)

    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        return inbox.read_replies(self.layer, AgentKeys(agent), after, limit)

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return inbox.reseal_reply(self.layer, AgentKeys(agent), number, old, new)

    # -- loss acceptance ---------------------------------------------------

    def read_acceptance(self, agent: str) -> bytes | None:
        keys = AgentKeys(agent)
        return self.layer.get(
            keys.acceptance, MAX_RECORD_BYTES, f"loss-acceptance record of {agent!r}"
        )

    def put_acceptance(self, agent: str, data: bytes) -> None:
        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(
                f"loss-acceptance record of {agent!r} is {len(data)} bytes, above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        keys = AgentKeys(agent)
        must(self.layer.commit_indexed(keys, Txn(writes=[Put(keys.acceptance, bytes(data))])))

    # -- heartbeats and events ---------------------------------------------

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        keys = AgentKeys(agent)
        beat = Put(keys.beat(heartbeat.node), heartbeat.to_json())
        must(self.layer.commit_indexed(keys, Txn(writes=[beat])))

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        keys = AgentKeys(agent)
        what = f"the heartbeats of {agent}"
        stored = bounded_records(self.layer, keys.beats, HEARTBEATS_READ, _node_name, what)

        def report(node: str, _data: bytes, exc: Exception) -> None:
            self.layer.reported(f"leaving out the heartbeat of {node} of {agent}: {exc}")

        return list(readable(stored, Heartbeat.from_json, report))

    def remove_heartbeat(self, agent: str, node: str) -> None:
        keys = AgentKeys(agent)
        must(self.layer.commit(Txn(writes=[DeleteRange(keys.beat(node))])))

    def append_event(self, agent: str, event: Event) -> None:
        self._events.append(AgentKeys(agent), event)

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        return self._events.read(AgentKeys(agent), after or {})

    def forget_node(self, agent: str, node: str) -> None:
        keys = AgentKeys(agent)
        writes = [DeleteRange(keys.beat(node)), DeleteRange(*folder_range(keys.node_events(node)))]
        must(self.layer.commit(Txn(writes=writes)))
        self._events.forget(keys, node)

    def forget_agent(self, agent: str) -> None:
        keys = AgentKeys(agent)
        writes = [DeleteRange(*folder_range(keys.base)), DeleteRange(keys.index)]
        must(self.layer.commit(Txn(writes=writes)))
        self.layer.forget_agent(agent)
        self._events.forget_agent(agent)
        self._leases.pop(agent, None)
        self._fences.pop(agent, None)

    # -- watch, check, close -----------------------------------------------

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[LeaseRecord | None]:
        keys = AgentKeys(agent)
        carries = Capability.NOTICE_VALUES in self.backend.capabilities

        async def read_lease_bytes() -> bytes | None:
            # In a thread: a store slow to answer must not hold up the watcher's event loop.
            return await asyncio.to_thread(self._lease_bytes, keys)

        terms = TermChanges() if terms_only else None
        if terms is not None:
            # The term as the watch begins; unread, the first value seen counts as a change.
            with suppress(StoreError):
                terms.changed(await read_lease_bytes())
        prefix = keys.lease if lease_only or terms_only else keys.base
        waited = keys.waited_for
        async for notice in self.backend.watch(prefix):
            # Beyond the lease only submissions and replies are waited for: not the
            # heartbeats, events, checkpoints and counts written all the while.
            key = notice.key
            if key not in (None, keys.lease) and (lease_only or terms_only or not waited(key)):
                continue
            # The lease's value, where the notice says it: always, where every notice carries
            # its value (None: deleted); else where this one carried it (None: read to know).
            told = notice.key == keys.lease and (carries or notice.value is not None)
            if terms is not None:
                try:
                    value = notice.value if told else await read_lease_bytes()
                except StoreError:
                    # Not read (the store is down, or the record over its bound): what
                    # changed is unknown, so say so, as after a gap; the watch goes on.
                    yield None
                    continue
                if not terms.changed(value):
                    continue
            lease_notice = told and prefix == keys.lease
            yield self._record_in(agent, notice.value) if lease_notice else None

    def _record_in(self, agent: str, value: bytes | None) -> LeaseRecord | None:
        """The lease record a notice carried, or None where it must be read to know. Kept
        as a read of it would be, unless this client knows a newer one: a standby taking
        the lease it was told of then compares the bytes told, with no read first."""
        if value is None:
            return None
        try:
            record = LeaseRecord.from_json(value)
        except StoreError:
            return None
        known = self._leases.get(agent)
        if known is None or known[1].version < record.version:
            self._leases[agent] = (value, record)
        return record

    def check(self) -> None:
        self.backend.check()

    def report(self) -> StoreReport:
        return StoreReport(cheap_watch=Capability.CHEAP_WATCH in self.backend.capabilities)

    def close(self) -> None:
        self.backend.close()
