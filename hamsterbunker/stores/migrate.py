"""Copying a store an earlier version wrote into this version's layout: ``hb migrate-store``
(what is copied, and why it is safe: docs/design.md, "One record layer over a small
backend interface").

The source is only read, through ``stores.earlier``; its heartbeats and event logs are
not copied. Every node must be stopped: the source is read a lease TTL apart and again
after the copy, and any change refuses. The cluster record goes last, so a copy cut
short holds none, and running the migration again writes the same records.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.errors import ConfigError, StoreError, Tampered
from ..core.limits import INBOX_REPLIES_KEPT, MAX_INBOX_COUNT
from ..records import CheckpointInfo, LeaseRecord
from ..sealing import Sealer
from .backend import Put, Txn
from .earlier import SourceStore
from .layer import RecordStore
from .layer.keys import AgentKeys

__all__ = ["Migrated", "SourceStore", "Stopped", "copy_agent", "migrate", "open_migration"]

# At most this many records, or bytes of values, in one commit (etcd allows 128 operations
# and 1.5 MiB a request by default).
_OPS_PER_COMMIT = 64
_BYTES_PER_COMMIT = 1 << 20
# How long the source is watched for a running node: its lease TTL (not authenticated, so
# within these bounds).
_WATCH_S = (2.0, 30.0)


@dataclass
class Migrated:
    """What was copied, per agent, and what was left out (junk the source held)."""

    agents: dict[str, str] = field(default_factory=dict)  # agent -> one line of what
    left_out: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Inbox:
    pending: list[tuple[int, str, bytes]]  # number, request id, sealed submission
    consumed: list[tuple[int, str, bytes | None]]  # number, request id, sealed reply or none


def open_migration(source_url: str, target_url: str) -> tuple[SourceStore, RecordStore]:
    """The earlier version's store at source_url (never made), and this version's store at
    target_url (made if need be); ConfigError for a URL of no such store."""
    from urllib.parse import urlsplit

    from . import open_store
    from .urls import redacted_url

    if redacted_url(source_url) == redacted_url(target_url):
        raise ConfigError("migrate into another store: --from and --to name the same one")
    scheme = urlsplit(source_url).scheme
    source: SourceStore
    if scheme in ("redis", "rediss"):
        from .earlier.redis import open_earlier_redis

        source = open_earlier_redis(source_url)
    elif scheme in ("etcd", "etcds"):
        from .earlier.etcd import open_earlier_etcd

        source = open_earlier_etcd(source_url)
    elif scheme in ("file", ""):
        from .earlier.file import open_earlier_file

        source = open_earlier_file(source_url)
    else:
        raise ConfigError(
            f"{source_url!r}: only file://, redis://, etcd:// and syncdir:// stores were "
            "written in an earlier layout (postgresql:// came with this version)"
        )
    try:
        target = open_store(target_url)
        if not isinstance(target, RecordStore):
            raise ConfigError(
                f"{target_url!r}: migrate into a file, Redis, etcd or PostgreSQL store"
            )
    except BaseException:
        source.close()
        raise
    return source, target


def migrate(
    source: SourceStore,
    target: RecordStore,
    sealer: Sealer,
    *,
    say: Callable[[str], None] = print,
    pause: Callable[[float], None] = time.sleep,
) -> Migrated:
    """Copy source into target (see the module); ConfigError if either is not as it must be,
    StoreError if the source changed (a node is running)."""
    cluster = source.read_cluster()
    if cluster is None:
        raise ConfigError(f"store {source.url} holds no cluster record: nothing to migrate")
    if target.read_cluster() is not None:
        raise ConfigError(
            f"store {target.url} holds a cluster already: migrate into an empty store "
            "(another directory, prefix or database)"
        )
    agents = source.list_agents()
    strangers = sorted(set(target.list_agents()) - set(agents))
    if strangers:
        raise ConfigError(f"store {target.url} holds agents the source has not: {strangers[:5]}")
    stopped = Stopped([(source, agents)])
    stopped.watch(source.url, say, pause)
    migrated = Migrated()
    for agent in agents:
        migrated.agents[agent] = copy_agent(source, target, sealer, agent, migrated.left_out)
        say(f"agent {agent}: {migrated.agents[agent]}")
    stopped.check("wrote during the copy")
    target.create_cluster(cluster)
    return migrated


@dataclass(frozen=True)
class Snapshot:
    """What a running node would change in a source: leases, heartbeats, newest checkpoints."""

    leases: dict[str, LeaseRecord | None]
    beats: dict[tuple[str, str], int]
    newest: dict[str, tuple[int, int] | None]  # agent -> newest checkpoint's (seq, epoch)


def _snapshot(source: SourceStore, agents: list[str]) -> Snapshot:
    leases, beats, newest = {}, {}, {}
    for agent in agents:
        leases[agent] = source.read_lease(agent)
        for beat in source.list_heartbeats(agent):
            beats[(agent, beat.node)] = beat.beats
        listed = source.list_checkpoints(agent)
        newest[agent] = (listed[0].seq, listed[0].epoch) if listed else None
    return Snapshot(leases, beats, newest)


class Stopped:
    """Sources (each with its agents) that no running node may write during a migration."""

    def __init__(self, sources: list[tuple[SourceStore, list[str]]]) -> None:
        self._sources = sources
        self._before = [_snapshot(source, agents) for source, agents in sources]

    def watch(self, where: str, say: Callable[[str], None], pause: Callable[[float], None]) -> None:
        """Wait the longest lease TTL (within bounds), then check."""
        leases = [lease for seen in self._before for lease in seen.leases.values() if lease]
        ttl_s = max((lease.ttl_ms / 1000 for lease in leases), default=0)
        watch_s = min(max(ttl_s, _WATCH_S[0]), _WATCH_S[1]) if self._sources else 0
        say(f"checking that no node writes {where} ({watch_s:g} s) ...")
        pause(watch_s)
        self.check("is running")

    def check(self, what: str) -> None:
        """StoreError if a source changed: a node of it is running (what it did)."""
        for (source, agents), before in zip(self._sources, self._before, strict=True):
            now = _snapshot(source, agents)
            for (agent, node), beats in now.beats.items():
                if before.beats.get((agent, node)) != beats:
                    raise StoreError(f"node {node} of agent {agent} {what}: stop every node first")
            for agent, lease in now.leases.items():
                if lease != before.leases.get(agent) or now.newest[agent] != before.newest.get(
                    agent
                ):
                    raise StoreError(f"agent {agent}'s lease or checkpoints changed: a node {what}")


def copy_agent(
    source: SourceStore,
    target: RecordStore,
    sealer: Sealer,
    agent: str,
    left_out: list[str],
    *,
    numbered: bool = False,
) -> str:
    """Copy one agent's records; one line of what was copied. numbered: the lease record
    keeps its version (a syncdir node's claim, whose published versions go on from it)."""
    keys = AgentKeys(agent)
    writes: list[Put] = []
    listed = sorted(source.list_checkpoints(agent), key=lambda info: (info.seq, info.epoch))
    for info in listed:
        writes.append(Put(keys.checkpoint(info), source.read_checkpoint(agent, info)))
    step = listed[-1].seq + 1 if listed else 1
    effects = source.read_effects(agent, step)
    writes += [Put(keys.effect(step, index, kind), data) for (index, kind), data in effects.items()]
    acceptance = source.read_acceptance(agent)
    if acceptance is not None:
        writes.append(Put(keys.acceptance, acceptance))
    inbox = _read_inbox(source, sealer, agent, left_out)
    writes += _inbox_writes(keys, inbox)
    _commit_all(target, [*writes, Put(keys.index, b"")])
    lease = source.read_lease(agent)
    if lease is not None and numbered:
        there = target.read_lease(agent)
        if there != lease:
            target.create_lease(agent, lease)
    elif lease is not None:
        there = target.read_lease(agent)
        target.cas_lease(agent, None if there is None else there.version, lease)
    _verify(source, target, agent, listed, inbox)
    return (
        f"lease epoch {lease.epoch if lease else '-'}, {len(listed)} checkpoint(s)"
        f"{f' (newest seq {listed[-1].seq})' if listed else ''}, {len(effects)} journaled "
        f"effect(s), {len(inbox.pending)} pending and {len(inbox.consumed)} consumed "
        "submission(s) kept"
    )


def _read_inbox(source: SourceStore, sealer: Sealer, agent: str, left_out: list[str]) -> _Inbox:
    pending: list[tuple[int, str, bytes]] = []
    after = 0
    while len(pending) < MAX_INBOX_COUNT:
        page = source.read_inbox(agent, after)
        if not page:
            break
        for number, blob in page:
            try:
                request_id = sealer.open_submission(blob, agent, number).request_id
            except Tampered as exc:
                left_out.append(f"agent {agent}: submission #{number}: {exc}")
                continue
            pending.append((number, request_id, blob))
        after = page[-1][0]
    waiting = {request_id for _, request_id, _ in pending}
    consumed: list[tuple[int, str, bytes | None]] = []
    for request_id in source.request_ids(agent, MAX_INBOX_COUNT + INBOX_REPLIES_KEPT):
        state = None if request_id in waiting else source.read_admission(agent, request_id)
        if state is not None and state.consumed:
            consumed.append((state.number, request_id, state.reply))
        elif state is not None:
            left_out.append(f"agent {agent}: request {request_id} (#{state.number}): not read")
    return _Inbox(sorted(pending), sorted(consumed, key=lambda each: each[:2]))


def _inbox_writes(keys: AgentKeys, inbox: _Inbox) -> list[Put]:
    """The inbox's records in the record layer's layout (``layer.inbox``)."""
    writes: list[Put] = []
    for number, request_id, blob in inbox.pending:
        writes.append(Put(keys.submission(number), blob))
        writes.append(Put(keys.request(request_id), f"{number} {len(blob)}".encode()))
    for number, request_id, reply in inbox.consumed:
        writes.append(Put(keys.reply(number, request_id), b"-" if reply is None else b"+" + reply))
        writes.append(Put(keys.request(request_id), f"{number} 0".encode()))
    numbers = [each[0] for each in inbox.pending] + [each[0] for each in inbox.consumed]
    if not numbers:
        return writes
    waiting = sum(len(blob) for _, _, blob in inbox.pending)
    done = len(inbox.consumed)
    writes += [
        Put(keys.last, str(max(numbers)).encode()),
        Put(keys.admitted, f"{len(numbers)} {waiting}".encode()),
        Put(keys.consumed, f"{done} 0".encode()),
        Put(keys.kept, str(done).encode()),
    ]
    return writes


def _commit_all(target: RecordStore, writes: list[Put]) -> None:
    """writes, in commits of at most _OPS_PER_COMMIT and (but for one big value alone)
    _BYTES_PER_COMMIT each."""
    batch: list[Put] = []
    size = 0
    for write in [*writes, None]:
        value_size = 0 if write is None else len(bytes(write.value))
        full = len(batch) >= _OPS_PER_COMMIT or size + value_size > _BYTES_PER_COMMIT
        if batch and (write is None or full):
            if not target.backend.commit(Txn(writes=batch)).succeeded:
                raise StoreError(f"store {target.url} refused a write that compared nothing")
            batch, size = [], 0
        if write is not None:
            batch.append(write)
            size += value_size


def _verify(
    source: SourceStore,
    target: RecordStore,
    agent: str,
    listed: list[CheckpointInfo],
    inbox: _Inbox,
) -> None:
    """Read back what was copied: StoreError if the target does not hold it."""
    copied = sorted(target.list_checkpoints(agent), key=lambda info: (info.seq, info.epoch))
    if [(i.seq, i.epoch, i.size) for i in copied] != [(i.seq, i.epoch, i.size) for i in listed]:
        raise StoreError(f"agent {agent}: the checkpoints read back are not the ones copied")
    for was, now in zip(listed, copied, strict=True):
        copy = target.read_checkpoint(agent, now)
        if _digest(source.read_checkpoint(agent, was)) != _digest(copy):
            raise StoreError(f"agent {agent}: checkpoint {was.seq} read back differs")
    if [n for n, _ in target.read_inbox(agent)] != [n for n, _, _ in inbox.pending]:
        raise StoreError(f"agent {agent}: the pending submissions read back differ")
    for number, request_id, reply in inbox.consumed:
        state = target.read_admission(agent, request_id)
        if state is None or (state.number, state.consumed, state.reply) != (number, True, reply):
            raise StoreError(f"agent {agent}: request {request_id} read back differs")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
