"""The Redis store: ``redis://[user:password@]host:port/db[?prefix=NAME]`` (``rediss://`` for TLS).

One Redis primary at one address (replicas behind it are fine, and a failover
that moves that address, by DNS or a proxy; Sentinel discovery is not built
in, and Redis Cluster is not supported, since a script touches several keys of
one agent). Every key starts with the prefix (default ``hamsterbunker``)::

    P:cluster                          the cluster record (SET NX)
    P:agent:A:lease                    hash: record (JSON), version, fence, term
    P:agent:A:checkpoints              hash: seq -> {epoch, size, written}
    P:agent:A:blobs                    hash: seq -> sealed bytes
    P:agent:A:effects:SEQ              hash: "<index>:<kind>" -> sealed effect-journal record
    P:agent:A:effect-steps             sorted set: the seqs that have a journal, scored by seq
    P:agent:A:inbox...                 the inbox: see hamsterbunker.stores.redis.inbox
    P:agent:A:acceptance               the loss-acceptance record (``hb accept-loss``; SET)
    P:agent:A:heartbeats               hash: node -> heartbeat JSON
    P:agent:A:event-counts             hash: node -> events appended so far
    P:agent:A:events:NODE              list of event JSON, trimmed to the newest N

``cas_lease`` and ``put_checkpoint`` are Lua scripts, which Redis runs one at
a time with nothing interleaved: the lease's version is compared and the
record written in one step, and a checkpoint is written only if the ``fence``
field stored beside the lease record (holder, session, epoch) equals the
writer's, in the same step. ``put_effect`` is fenced by the same comparison in
its own script, which also adds the step to ``effect-steps``; the checkpoint
script removes, in its step, the journal of its own step and of at most
``STEPS_REMOVED_PER_CHECKPOINT`` older steps that set lists (the lowest;
leftovers go at the next checkpoint), so its work is bounded whatever was
planted there. ``admit`` is one script too, and the checkpoint script consumes
the step's submissions in its own step (``hamsterbunker.stores.redis.inbox``).
``forget_node`` drops a node's heartbeat, count and list in one script (``forget``).

Nothing stored is trusted (DESIGN.md invariant 10): a checkpoint field that is
not a seq as we write one, or a description that does not decode, is skipped
by the scripts (never a Lua error), logged once and left out of listings; only
a checkpoint of the writer's own epoch at or above its seq refuses a write.
Values are measured (``STRLEN``/``HSTRLEN``) before they are fetched, so a
huge one is a CorruptRecord without being read: checkpoints above
``MAX_CHECKPOINT_BYTES``, records above ``MAX_RECORD_BYTES``; an effect-journal
record above ``MAX_EFFECT_BYTES`` is left out unread. ``read_effects`` looks
only at the fields it writes (``MAX_EFFECTS_PER_STEP`` indices, each kind), by
name, so a hash with any number of planted fields costs it no more. Whatever
Redis does not promise (replication is asynchronous; durability is whatever
``appendonly``/``appendfsync`` say) is stated in ``GUARANTEES`` and checked,
where the server lets us, at open.

The wake-up hint is pub/sub: every write publishes on ``P:agent:A:changed``
(and a lease write also on ``P:agent:A:lease-changed``, and on
``P:agent:A:term-changed`` if it changes the record's term, kept beside it in
the lease hash) in the same script or transaction; a lease write's message is
the record itself, which a watch of the lease yields. Keyspace notifications
would need ``notify-keyspace-events`` in the server's configuration, which
managed Redis often forbids; our own messages need nothing, and a lost one
costs only a tick.

Query options other than ``prefix`` go to redis-py as they are
(``socket_timeout``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_password``, ``ssl_cert_reqs``, ...). The ``ssl_*`` options need
``rediss://``, and the files they name are loaded when the store is opened, so
a missing file, one that is not PEM or a key that does not match its
certificate is a ConfigError at start. A refused TLS handshake is reported in
words: the server's certificate is not trusted by ``ssl_ca_certs``, or the
server refused the client certificate. Socket timeouts default to 2 s, so a
dead or frozen server is a StoreUnavailable, never a hang, and redis-py's own
retries are off: a write retried after an unanswered first try could apply
twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis

from ...blob import Blob
from ...errors import ConfigError, CorruptRecord, LeaseConflict, StoreError
from ...failpoints import failpoint
from ...limits import (
    INBOX_REPLIES_KEPT,
    MAX_CHECKPOINT_BYTES,
    MAX_RECORD_BYTES,
    MAX_SEQ,
    check_checkpoint_bounds,
)
from ...records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from .._reported import ReportedOnce
from ..backends.redis_connection import RedisConnection
from ..base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    RestoreRead,
    Store,
    StoreGuarantees,
    StoreReport,
    check_consumed,
    describe_fence_text,
    fence_text,
    newest_first,
)
from . import scripts as _scripts
from .effects import STEPS_REMOVED_PER_CHECKPOINT, RedisEffects
from .forget import RedisForget
from .inbox import RedisInbox
from .lease import READ_ARGS as LEASE_READ_ARGS
from .lease import READ_LEASE, REPLACE_UNREADABLE_LEASE, lease_in_answer
from .replies import (
    bounded,
    checkpoint_info,
    events_in,
    heartbeats_in,
    node_name,
    raw,
    reporter,
    text,
)
from .rewrites import RedisRewrites
from .tail import RedisTail

__all__ = ["GUARANTEES", "RedisStore"]

log = logging.getLogger(__name__)

GUARANTEES = StoreGuarantees(
    mutual_exclusion="Lua scripts on one Redis primary: the lease compare-and-set and the fenced "
    "checkpoint write are each one atomic script. Replication is asynchronous: after a "
    "failover the new primary may miss the latest takeover, and the previous holder's fence "
    "is accepted again until the lease moves on (still one writer per epoch on that primary)",
    durability="as the server is configured: appendonly yes with appendfsync always makes every "
    "acknowledged write durable; everysec can lose about a second on an OS crash; RDB "
    "snapshots or no persistence lose everything since the last snapshot; a failover can "
    "lose acknowledged writes (asynchronous replicas)",
    across_hosts="yes: every node that reaches the primary (rediss:// for TLS); not Redis Cluster",
)

# The watch's pub/sub connection: how long to wait for a message before a PING
# proves the link alive, and the bounds of its reconnection backoff.
_WATCH_PING_S = 5.0
_WATCH_RETRY_S = (0.1, 2.0)

# list_agents: keys looked at per SCAN call, and the most calls (a bound on its work).
_SCAN_COUNT = 1000
_SCAN_CALLS = 200
_AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # records.check_name's pattern

P = ParamSpec("P")
R = TypeVar("R")


def _glob_escaped(literal: str) -> str:
    """literal as a SCAN MATCH pattern that matches only itself."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", literal)


def _translated(
    method: Callable[Concatenate[RedisStore, P], R],
) -> Callable[Concatenate[RedisStore, P], R]:
    """Translate redis-py's errors at the store boundary (RedisConnection.errors_translated)."""

    @functools.wraps(method)
    def translated(self: RedisStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._connection.errors_translated(method.__name__):
            return method(self, *args, **kwargs)

    return translated


class RedisStore(Store):
    """A store in one Redis database, under a key prefix."""

    guarantees = GUARANTEES

    def __init__(
        self,
        url: str,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
        create: bool = True,  # nothing to create: records appear on the first write
    ) -> None:
        if keep_checkpoints < 1 or events_per_node < 1 or keep_replies < 1:
            raise ConfigError(
                "keep_checkpoints, events_per_node and keep_replies must be at least 1"
            )
        self._connection = RedisConnection(url)
        self.url, self.prefix = self._connection.url, self._connection.prefix
        self.keep_checkpoints, self.keep_replies = keep_checkpoints, keep_replies
        self.events_per_node = events_per_node
        self._redis = self._connection.client()
        self._rewrites = RedisRewrites(self._redis, self.prefix, self._key)
        self._cas_lease = self._redis.register_script(_scripts.CAS_LEASE)
        self._read_lease = self._redis.register_script(READ_LEASE)
        self._replace_unreadable = self._redis.register_script(REPLACE_UNREADABLE_LEASE)
        self._put_checkpoint = self._redis.register_script(_scripts.PUT_CHECKPOINT)
        self._list_checkpoints = self._redis.register_script(_scripts.LIST_CHECKPOINTS)
        self._read_checkpoint = self._redis.register_script(_scripts.READ_CHECKPOINT)
        self._bounded_get = self._redis.register_script(_scripts.BOUNDED_GET)
        self._bounded_hget = self._redis.register_script(_scripts.BOUNDED_HGET)
        self._read_events = self._redis.register_script(_scripts.READ_EVENTS)
        self._heartbeats = self._redis.register_script(_scripts.HEARTBEATS)
        self._append_event = self._redis.register_script(_scripts.APPEND_EVENT)
        self._put_heartbeat = self._redis.register_script(_scripts.PUT_HEARTBEAT)
        self._tail = self._redis.register_script(_scripts.TAIL)
        self._reported = ReportedOnce(log)
        self._effects = RedisEffects(
            self._redis, self._key, self._changed, self._reported, self.url
        )
        self._inbox = RedisInbox(
            self._redis, self._key, self._changed, self._reported, self.url, keep_replies
        )
        self._forget = RedisForget(self._redis, self._key, self._changed)
        self.warnings: list[str] = self._connection.persistence_warnings(self._redis)

    # -- keys --------------------------------------------------------------

    def _key(self, agent: str, *parts: str) -> str:
        return ":".join((self.prefix, "agent", check_name("agent id", agent), *parts))

    def _changed(self, agent: str) -> str:
        return self._key(agent, "changed")

    # -- cluster -----------------------------------------------------------

    @_translated
    def read_cluster(self) -> ClusterRecord | None:
        answer = self._bounded_get(keys=[f"{self.prefix}:cluster"], args=[MAX_RECORD_BYTES])
        data = bounded(answer, "cluster record", MAX_RECORD_BYTES)
        return None if data is None else ClusterRecord.from_json(data)

    @_translated
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        key = f"{self.prefix}:cluster"
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(key, record.to_json(), nx=True)
        pipe.get(key)
        _created, stored = pipe.execute()
        if stored is None:
            raise StoreError(f"cluster record under {self.prefix} vanished")
        return ClusterRecord.from_json(raw(stored))

    @_translated
    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        return self._rewrites.replace_cluster(expected, new)

    @_translated
    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_checkpoint(agent, info, old, new)

    @_translated
    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        return self._rewrites.reseal_effect(agent, seq, index, kind, old, new)

    @_translated
    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_submission(agent, number, old, new)

    @_translated
    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        return self._inbox.replies(agent, after, limit)

    @_translated
    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_reply(agent, number, old, new)

    @_translated
    def list_agents(self) -> list[str]:
        # SCAN by pattern: each call looks at about _SCAN_COUNT keys, and at most
        # _SCAN_CALLS calls are made, however many keys were planted.
        start = f"{self.prefix}:agent:"
        pattern = _glob_escaped(start) + "*"
        found: set[str] = set()
        cursor: int = 0
        for _call in range(_SCAN_CALLS):
            cursor, keys = self._redis.scan(cursor, match=pattern, count=_SCAN_COUNT)
            for key in keys:
                name = text(key).removeprefix(start).split(":", 1)[0]
                if _AGENT_NAME.fullmatch(name):
                    found.add(name)
            if cursor == 0 or len(found) >= MAX_LISTED_AGENTS:
                break
        return sorted(found)[:MAX_LISTED_AGENTS]

    # -- lease -------------------------------------------------------------

    @_translated
    def read_lease(self, agent: str) -> LeaseRecord | None:
        return lease_in_answer(
            self._read_lease(keys=[self._key(agent, "lease")], args=LEASE_READ_ARGS)
        )

    @_translated
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        # The new version is the stored one + 1: the script writes it only when
        # the stored version is expected_version, so computing it here is exact.
        stored = replace(new, version=(expected_version or 0) + 1)
        expected = "" if expected_version is None else str(expected_version)
        answer = self._cas_lease(
            keys=[self._key(agent, "lease")], args=[expected, *self._lease_args(agent, stored)]
        )
        if answer[0] == b"conflict":
            now = text(answer[1]) or None
            raise LeaseConflict(f"lease of {agent!r} is at version {now}, not {expected_version}")
        return stored

    @_translated
    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        answer = self._replace_unreadable(
            keys=[self._key(agent, "lease")],
            args=[found, MAX_RECORD_BYTES, *self._lease_args(agent, new)],
        )
        if answer[0] == b"conflict":
            raise LeaseConflict(f"the lease record of {agent!r} changed since it was read")
        return new

    def _lease_args(self, agent: str, stored: LeaseRecord) -> list[str | bytes]:
        """What a lease write's script takes after its comparison: the record, its fence,
        version and term, then the channels (the term's first)."""
        return [
            stored.to_json(),
            fence_text(stored.holder, stored.session, stored.epoch),
            str(stored.version),
            stored.term(),
            self._key(agent, "term-changed"),
            self._changed(agent),
            self._key(agent, "lease-changed"),
        ]

    # -- checkpoints -------------------------------------------------------

    @_translated
    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed)
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(blob), written=time.time())
        failpoint("checkpoint.before_commit")
        answer = self._put_checkpoint(
            keys=[
                self._key(agent, "lease"),
                self._key(agent, "checkpoints"),
                self._key(agent, "blobs"),
                self._key(agent, "effect-steps"),
                *self._inbox.keys(agent),
            ],
            args=[
                fence.to_text(),
                str(seq),
                info.to_json(),
                bytes(blob),
                self.keep_checkpoints,
                self._changed(agent),
                fence.epoch,
                MAX_SEQ,
                MAX_RECORD_BYTES,
                MAX_CHECKPOINT_BYTES,
                self._key(agent, "effects", ""),
                STEPS_REMOVED_PER_CHECKPOINT,
                *self._inbox.consume_args(consumed),
            ],
        )
        if answer[0] == b"fenced":
            raise fence.refused(seq, describe_fence_text(raw(answer[1]) or None))
        if answer[0] == b"seq":
            raise StoreError(
                f"checkpoint sequence must increase: {seq} is not above {text(answer[1])}, "
                f"stored under this epoch ({fence.epoch})"
            )
        return info

    @_translated
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        flat = self._list_checkpoints(
            keys=[self._key(agent, "checkpoints")], args=[MAX_RECORD_BYTES]
        )
        return self._listed(agent, flat)

    @_translated
    def read_for_restore(self, agent: str) -> RestoreRead:
        """The listing and the acceptance record in one round trip (a pipeline of their
        scripts), then the newest checkpoint's bytes."""
        pipe = self._redis.pipeline(transaction=False)
        self._list_checkpoints(
            keys=[self._key(agent, "checkpoints")], args=[MAX_RECORD_BYTES], client=pipe
        )
        self._bounded_get(
            keys=[self._key(agent, "acceptance")], args=[MAX_RECORD_BYTES], client=pipe
        )
        flat, answer = pipe.execute()
        infos = newest_first(self._listed(agent, flat))
        try:
            read = RestoreRead(
                infos,
                bounded(answer, f"loss-acceptance record of {agent!r}", MAX_RECORD_BYTES),
                None,
            )
        except CorruptRecord as exc:
            read = RestoreRead(infos, None, None, str(exc))
        return replace(read, newest=self.read_checkpoint(agent, infos[0])) if infos else read

    def _listed(self, agent: str, flat: Any) -> list[CheckpointInfo]:
        """What the listing script found that parses, newest first (by seq, then epoch)."""
        if flat is None:  # not a hash: nothing listable (the next publish replaces it)
            self._reported.warn(
                (agent, "checkpoints-type"),
                "redis store %s: the checkpoints of %s are not stored as a hash",
                self.url,
                agent,
            )
            return []
        found = []
        for field, doc in zip(flat[::2], flat[1::2], strict=False):
            try:
                found.append(checkpoint_info(raw(field), doc if isinstance(doc, int) else raw(doc)))
            except CorruptRecord as exc:
                # Not ours to judge further (the runtime authenticates what is listed):
                # left out, and said once.
                self._reported.warn(
                    (agent, "checkpoint", raw(field), hash(doc)),
                    "redis store %s: leaving out checkpoint entry %r of %s: %s",
                    self.url,
                    text(field)[:40],
                    agent,
                    exc,
                )
        return sorted(found, key=lambda info: (info.seq, info.epoch), reverse=True)

    @_translated
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        answer = self._read_checkpoint(
            keys=[self._key(agent, "checkpoints"), self._key(agent, "blobs")],
            args=[str(info.seq), MAX_RECORD_BYTES, MAX_CHECKPOINT_BYTES],
        )
        if not answer:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        doc, blob = answer
        field = str(info.seq).encode()
        if checkpoint_info(field, doc if isinstance(doc, int) else raw(doc)).epoch != info.epoch:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        if isinstance(blob, int):
            raise CorruptRecord(
                f"checkpoint {info.seq} of {agent!r} is {blob} bytes, above the limit of "
                f"{MAX_CHECKPOINT_BYTES} bytes: not read"
            )
        return raw(blob)

    # -- effect journal ----------------------------------------------------

    @_translated
    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        self._effects.put(agent, fence, seq, index, kind, blob)

    @_translated
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        return self._effects.read(agent, seq)

    # -- inbox -------------------------------------------------------------

    @_translated
    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        return self._inbox.admit(agent, request_id, number, blob)

    @_translated
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        return self._inbox.read(agent, after)

    @_translated
    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids the inbox keeps, at most most (``stores.migrate``)."""
        return self._inbox.request_ids(agent, most)

    @_translated
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        return self._inbox.admission(agent, request_id)

    # -- loss acceptance ---------------------------------------------------

    @_translated
    def read_acceptance(self, agent: str) -> bytes | None:
        answer = self._bounded_get(keys=[self._key(agent, "acceptance")], args=[MAX_RECORD_BYTES])
        return bounded(answer, f"loss-acceptance record of {agent!r}", MAX_RECORD_BYTES)

    @_translated
    def put_acceptance(self, agent: str, data: bytes) -> None:
        if len(data) > MAX_RECORD_BYTES:  # it could never be read back
            raise StoreError(
                f"loss-acceptance record of {agent!r} is {len(data)} bytes, above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._key(agent, "acceptance"), bytes(data))
        pipe.publish(self._changed(agent), "acceptance")
        pipe.execute()

    # -- heartbeats --------------------------------------------------------

    @_translated
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        node = check_name("node id", heartbeat.node)
        self._put_heartbeat(
            keys=[self._key(agent, "heartbeats")],
            args=[node, heartbeat.to_json(), self._changed(agent)],
        )

    @_translated
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        flat = self._heartbeats(keys=[self._key(agent, "heartbeats")], args=[MAX_RECORD_BYTES])
        return heartbeats_in(flat, reporter(self._reported, agent, "heartbeat"))

    @_translated
    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._put_heartbeat(
            keys=[self._key(agent, "heartbeats")],
            args=[check_name("node id", node), "", self._changed(agent)],
        )

    # -- events ------------------------------------------------------------

    @_translated
    def append_event(self, agent: str, event: Event) -> None:
        node = check_name("node id", event.node)
        self._append_event(
            keys=[self._key(agent, "events", node), self._key(agent, "event-counts")],
            args=[node, event.to_json(), self.events_per_node, self._changed(agent)],
        )

    @_translated
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        answer = self._read_events(
            keys=[self._key(agent, "event-counts")],
            args=[self._key(agent, "events", ""), MAX_RECORD_BYTES],
        )
        logs: dict[str, list[Any]] = {}
        for item in answer if isinstance(answer, list) else []:
            # The script sends only names and lists of the shape we write; checked again here.
            if isinstance(item, list) and len(item) == 2 and isinstance(item[1], list):
                node = node_name(item[0])
                if node is not None:
                    logs[node] = item[1]
        report = reporter(self._reported, agent, "event")
        events: list[Event] = []
        for node in sorted(logs):
            cursor = after.get(node, 0)
            events.extend(e for e in events_in(node, logs[node], report) if e.n > cursor)
        return events

    @_translated
    def forget_node(self, agent: str, node: str) -> None:
        self._forget.forget(agent, node)

    # -- watch and tail ----------------------------------------------------

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[LeaseRecord | None]:
        """Yield on every message on the agent's channel; reconnect when the link drops.

        A watch of the lease yields the record each message carries (None if it
        does not parse). A watch outlives a Redis restart: it reconnects with a
        bounded backoff and then yields once, since changes made meanwhile were
        announced to nobody. A PING after a quiet spell finds a link that died
        silently.
        """
        name = "changed" if not lease_only else "term-changed" if terms_only else "lease-changed"
        channel = self._key(agent, name)
        delay, reconnected = _WATCH_RETRY_S[0], False
        while True:
            client = self._connection.async_client()
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(channel)
                    _honour_swallowed_cancel()
                    delay = _WATCH_RETRY_S[0]
                    if reconnected:
                        yield None
                    while True:
                        message = await pubsub.get_message(timeout=_WATCH_PING_S)
                        _honour_swallowed_cancel()
                        if message is None:
                            await pubsub.ping()
                            _honour_swallowed_cancel()
                        elif message["type"] == "message":
                            yield _lease_in(message["data"]) if lease_only else None
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.debug("redis watch of %s: %s; reconnecting in %.1f s", agent, exc, delay)
            finally:
                await client.aclose()
            reconnected = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_RETRY_S[1])

    def tail(self, agent: str) -> RedisTail:
        """Follow the agent's events and heartbeats, fetching only events not read yet."""
        keys = [self._key(agent, "event-counts"), self._key(agent, "heartbeats")]
        events = self._key(agent, "events", "")

        def fetch(counts: list[str]) -> Any:
            with self._connection.errors_translated("read"):
                return self._tail(keys=keys, args=[events, MAX_RECORD_BYTES, *counts])

        report = functools.partial(reporter, self._reported, agent)
        return RedisTail(fetch, report("heartbeat"), report("event"))

    @_translated
    def check(self) -> None:
        """StoreUnavailable unless the server answers a PING."""
        self._redis.ping()

    def report(self) -> StoreReport:
        return StoreReport(cheap_watch=True)  # one idle pub/sub connection

    def close(self) -> None:
        self._redis.close()


def _honour_swallowed_cancel() -> None:
    """Raise the cancellation redis-py swallowed, so that cancelling a watch ends it.

    redis-py (8.1) can lose a cancel that lands inside subscribe(): the task
    is left "cancelling" but runs on, and whoever awaits its end waits for
    ever. Nothing here catches a CancelledError, so a task that is still
    cancelling was asked to stop and has not.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _lease_in(data: Any) -> LeaseRecord | None:
    """The lease record a message of a lease channel carries (None if it does not parse)."""
    if not isinstance(data, bytes) or len(data) > MAX_RECORD_BYTES:
        return None
    try:
        return LeaseRecord.from_json(data)
    except CorruptRecord:
        return None  # the node's read reports it
