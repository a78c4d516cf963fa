"""The Redis store: ``redis://[user:password@]host:port/db[?prefix=NAME]`` (``rediss://`` for TLS).

One Redis primary at one address (replicas behind it are fine, and a failover
that moves that address, by DNS or a proxy; Sentinel discovery is not built
in, and Redis Cluster is not supported, since a script touches several keys of
one agent). Every key starts with the prefix (default ``hamsterbunker``)::

    P:cluster                          the cluster record (SET NX)
    P:agent:A:lease                    hash: record (JSON), version, fence
    P:agent:A:checkpoints              hash: seq -> {epoch, size, written}
    P:agent:A:blobs                    hash: seq -> sealed bytes
    P:agent:A:acceptance               the loss-acceptance record (``hb accept-loss``; SET)
    P:agent:A:heartbeats               hash: node -> heartbeat JSON
    P:agent:A:event-counts             hash: node -> events appended so far
    P:agent:A:events:NODE              list of event JSON, trimmed to the newest N

``cas_lease`` and ``put_checkpoint`` are Lua scripts, which Redis runs one at
a time with nothing interleaved: the lease's version is compared and the
record written in one step, and a checkpoint is written only if the ``fence``
field stored beside the lease record (holder, session, epoch) equals the
writer's, in the same step.

Nothing stored is trusted (DESIGN.md invariant 10): a checkpoint field that is
not a seq as we write one, or a description that does not decode, is skipped
by the scripts (never a Lua error), logged once and left out of listings; only
a checkpoint of the writer's own epoch at or above its seq refuses a write.
Values are measured (``STRLEN``/``HSTRLEN``) before they are fetched, so a
huge one is a CorruptRecord without being read: checkpoints above
``MAX_CHECKPOINT_BYTES``, records above ``MAX_RECORD_BYTES``. Whatever Redis does not promise (replication is
asynchronous; durability is whatever ``appendonly``/``appendfsync`` say) is
stated in ``GUARANTEES`` and checked, where the server lets us, at open.

The wake-up hint is pub/sub: every write publishes on ``P:agent:A:changed``
(and a lease write also on ``P:agent:A:lease-changed``) in the same script or
transaction. Keyspace notifications would need ``notify-keyspace-events`` in
the server's configuration, which managed Redis often forbids; our own
messages need nothing, and a lost one costs only a tick.

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
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import ConfigError, CorruptRecord, Fenced, LeaseConflict, StoreError, StoreUnavailable
from ..failpoints import failpoint
from ..limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_RECORD_BYTES,
    MAX_SEQ,
    check_checkpoint_bounds,
)
from ..records import (
    CheckpointInfo,
    ClusterRecord,
    Event,
    Heartbeat,
    LeaseRecord,
    check_name,
)
from ..tail import TailRead
from . import _redis_scripts as _scripts
from ._reported import ReportedOnce
from ._tls import describe_tls_failure, tls_error_in, tls_files_problem
from .base import Fence, StoreGuarantees, describe_fence_text, fence_text

__all__ = ["GUARANTEES", "RedisStore", "RedisTail"]

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

DEFAULT_PREFIX = "hamsterbunker"
DEFAULT_TIMEOUT_S = 2.0
# The watch's pub/sub connection: how long to wait for a message before a PING
# proves the link alive, and the bounds of its reconnection backoff.
_WATCH_PING_S = 5.0
_WATCH_RETRY_S = (0.1, 2.0)

P = ParamSpec("P")
R = TypeVar("R")


def _redis_errors_as_store_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Translate redis-py's errors at the store boundary, keeping the reason.

    The message names the server; a refused TLS handshake says which side's
    certificate was not accepted, in words rather than OpenSSL's.
    """

    @functools.wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            owner = args[0]  # a RedisStore, or a RedisTail of one
            store = owner._store if isinstance(owner, RedisTail) else owner
            assert isinstance(store, RedisStore)
            where = f"redis store {method.__name__} ({store.server})"
            if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
                raise StoreError(f"{where}: refused: {exc}") from exc
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
                # ReadOnlyError: we reached a replica (a failover in progress).
                tls = tls_error_in(exc)
                why = str(exc) if tls is None else store.describe_tls(tls)
                raise StoreUnavailable(f"{where}: {why}") from exc
            raise StoreError(f"{where}: {exc}") from exc

    return translated


def _raw(value: bytes | str) -> bytes:
    """A reply as bytes (our clients never decode; this only narrows redis-py's types)."""
    return value if isinstance(value, bytes) else value.encode()


def _text(value: Any) -> str:
    """A reply as text for messages: bytes a store writer chose may not be UTF-8."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# A seq as put_checkpoint writes it in a field name: no sign, no leading zero.
_SEQ_FIELD = re.compile(rb"[1-9][0-9]{0,15}")


def _checkpoint_info(field: bytes, doc: bytes | int) -> CheckpointInfo:
    """A checkpoints hash entry as CheckpointInfo; CorruptRecord for anything else.

    doc is the description, or its length (an int) when the server found it over
    the record limit and did not send it.
    """
    if not _SEQ_FIELD.fullmatch(field) or int(field) > MAX_SEQ:
        raise CorruptRecord(f"checkpoint field {field[:40]!r} is not a seq in 1..{MAX_SEQ}")
    seq = int(field)
    if isinstance(doc, int):
        raise CorruptRecord(f"checkpoint {seq} has a description of {doc} bytes")
    return CheckpointInfo.from_json(doc, seq)


def _bounded(answer: list[Any], what: str, limit: int) -> bytes | None:
    """The value of a BOUNDED_GET or BOUNDED_HGET answer: None if absent, CorruptRecord if huge."""
    if not answer:
        return None
    if len(answer) == 2:  # {'type', kind}
        raise CorruptRecord(
            f"{what} is stored as a Redis {_text(answer[1])}, not as this store writes it"
        )
    if isinstance(answer[0], int):
        raise CorruptRecord(f"{what} is {answer[0]} bytes, above the limit of {limit} bytes")
    return _raw(answer[0])


# The redis-py options that name files: checked at parse time, so a wrong path
# is one clear line at start rather than "Error 2 connecting ... No such file".
_TLS_FILES = {
    "ssl_certfile": "file",
    "ssl_keyfile": "file",
    "ssl_ca_certs": "file",
    "ssl_ca_path": "directory",
}


def parse_redis_url(url: str) -> tuple[str, str]:
    """Split a store URL into the URL redis-py gets and our key prefix; ConfigError if bad."""
    shown = _redacted(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise ConfigError(f"store URL {shown!r}: {exc}") from exc
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"store URL {shown!r}: not a redis:// or rediss:// URL")
    if not parts.hostname:
        raise ConfigError(f"store URL {shown!r}: a Redis URL needs a host (redis://host:6379/0)")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"store URL {shown!r}: the path is the database number, not {db!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    tls_options = sorted({key for key, _value in query if key.startswith("ssl_")})
    if parts.scheme == "redis" and tls_options:
        raise ConfigError(
            f"store URL {shown!r}: {', '.join(tls_options)} are TLS options: use rediss://"
        )
    for key, value in query:
        kind = _TLS_FILES.get(key)
        if kind == "file" and not os.path.isfile(value):
            raise ConfigError(f"store URL {shown!r}: {key} file {value} does not exist")
        if kind == "directory" and not os.path.isdir(value):
            raise ConfigError(f"store URL {shown!r}: {key} directory {value} does not exist")
    options = dict(query)
    problem = tls_files_problem(
        ca=("ssl_ca_path", options["ssl_ca_path"])
        if "ssl_ca_path" in options
        else ("ssl_ca_certs", options.get("ssl_ca_certs")),
        cert=("ssl_certfile", options.get("ssl_certfile")),
        key=("ssl_keyfile", options.get("ssl_keyfile")),
        password=options.get("ssl_password"),
    )
    if problem is not None:
        raise ConfigError(f"store URL {shown!r}: {problem}")
    prefixes = [value for key, value in query if key == "prefix"]
    prefix = check_name("Redis key prefix", prefixes[-1] if prefixes else DEFAULT_PREFIX)
    rest = urlencode([(key, value) for key, value in query if key != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


def _redacted(url: str) -> str:
    """The URL without its password, for display."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that does not parse)"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RedisStore:
    """A store in one Redis database, under a key prefix."""

    guarantees = GUARANTEES

    def __init__(
        self,
        url: str,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        create: bool = True,  # nothing to create: records appear on the first write
    ) -> None:
        if keep_checkpoints < 1 or events_per_node < 1:
            raise ConfigError("keep_checkpoints and events_per_node must be at least 1")
        self._client_url, self.prefix = parse_redis_url(url)
        self.url = _redacted(url)
        parts = urlsplit(self._client_url)
        host = parts.hostname or ""
        self.server = (
            f"[{host}]:{parts.port or 6379}" if ":" in host else f"{host}:{parts.port or 6379}"
        )
        self.keep_checkpoints = keep_checkpoints
        self.events_per_node = events_per_node
        self._options: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
        query = dict(parse_qsl(urlsplit(self._client_url).query))
        for option in ("socket_timeout", "socket_connect_timeout"):
            if option not in query:
                self._options[option] = DEFAULT_TIMEOUT_S
        try:
            self._redis = redis.Redis.from_url(self._client_url, **self._options)
            # Connections are made lazily; making one object (no I/O) checks the
            # options now, so a misspelt one is a ConfigError at start, not later.
            self._redis.connection_pool.make_connection()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"store URL {self.url!r}: {exc}") from exc
        self._cas_lease = self._redis.register_script(_scripts.CAS_LEASE)
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
        self.warnings: list[str] = self._check_persistence()

    def describe_tls(self, error: ssl.SSLError) -> str:
        """What a TLS failure of a connection to this store's server means, in one line."""
        options = dict(parse_qsl(urlsplit(self._client_url).query))
        return describe_tls_failure(
            error,
            ca=options.get("ssl_ca_certs") or options.get("ssl_ca_path"),
            ca_option="ssl_ca_path" if "ssl_ca_path" in options else "ssl_ca_certs",
            cert=options.get("ssl_certfile"),
            cert_option="ssl_certfile",
        )

    def _check_persistence(self) -> list[str]:
        """Warn when the server's settings can lose acknowledged checkpoints (best effort)."""
        try:
            settings: dict[str, str] = {}
            for name in ("appendonly", "appendfsync", "maxmemory-policy"):
                settings.update(
                    {_text(k): _text(v) for k, v in self._redis.config_get(name).items()}
                )
        except redis.ResponseError as exc:  # CONFIG is often disabled on managed Redis
            return [
                f"Redis store {self.url}: cannot read the server's persistence settings ({exc}); "
                "make sure it runs with appendonly yes and appendfsync always"
            ]
        except redis.RedisError as exc:  # unreachable now; the nodes will say so soon enough
            log.debug("redis store %s: persistence not checked: %s", self.url, exc)
            return []
        warnings = []
        if settings.get("appendonly") != "yes":
            warnings.append(
                f"Redis store {self.url}: appendonly is off, so a restart of Redis loses every "
                "lease and checkpoint written since its last snapshot. Set appendonly yes and "
                "appendfsync always."
            )
        elif settings.get("appendfsync") != "always":
            warnings.append(
                f"Redis store {self.url}: appendfsync is {settings.get('appendfsync')}, so a "
                "crash of the machine can lose acknowledged checkpoints. Set appendfsync always."
            )
        if settings.get("maxmemory-policy", "").startswith("allkeys-"):
            warnings.append(
                f"Redis store {self.url}: maxmemory-policy {settings['maxmemory-policy']} may "
                "evict leases and checkpoints. Use noeviction."
            )
        return warnings

    # -- keys --------------------------------------------------------------

    def _key(self, agent: str, *parts: str) -> str:
        return ":".join((self.prefix, "agent", check_name("agent id", agent), *parts))

    def _changed(self, agent: str) -> str:
        return self._key(agent, "changed")

    # -- cluster -----------------------------------------------------------

    @_redis_errors_as_store_errors
    def read_cluster(self) -> ClusterRecord | None:
        answer = self._bounded_get(keys=[f"{self.prefix}:cluster"], args=[MAX_RECORD_BYTES])
        data = _bounded(answer, "cluster record", MAX_RECORD_BYTES)
        return None if data is None else ClusterRecord.from_json(data)

    @_redis_errors_as_store_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        key = f"{self.prefix}:cluster"
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(key, record.to_json(), nx=True)
        pipe.get(key)
        _created, stored = pipe.execute()
        if stored is None:
            raise StoreError(f"cluster record under {self.prefix} vanished")
        return ClusterRecord.from_json(_raw(stored))

    # -- lease -------------------------------------------------------------

    @_redis_errors_as_store_errors
    def read_lease(self, agent: str) -> LeaseRecord | None:
        answer = self._bounded_hget(
            keys=[self._key(agent, "lease")], args=["record", MAX_RECORD_BYTES]
        )
        data = _bounded(answer, "lease record", MAX_RECORD_BYTES)
        return None if data is None else LeaseRecord.from_json(data)

    @_redis_errors_as_store_errors
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        # The new version is the stored one + 1: the script writes it only when
        # the stored version is expected_version, so computing it here is exact.
        stored = replace(new, version=(expected_version or 0) + 1)
        answer = self._cas_lease(
            keys=[self._key(agent, "lease")],
            args=[
                "" if expected_version is None else str(expected_version),
                stored.to_json(),
                fence_text(stored.holder, stored.session, stored.epoch),
                str(stored.version),
                self._changed(agent),
                self._key(agent, "lease-changed"),
            ],
        )
        if answer[0] == b"conflict":
            now = _text(answer[1]) or None
            raise LeaseConflict(f"lease of {agent!r} is at version {now}, not {expected_version}")
        return stored

    # -- checkpoints -------------------------------------------------------

    @_redis_errors_as_store_errors
    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: bytes) -> CheckpointInfo:
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob))
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(blob), written=time.time())
        failpoint("checkpoint.before_commit")
        answer = self._put_checkpoint(
            keys=[
                self._key(agent, "lease"),
                self._key(agent, "checkpoints"),
                self._key(agent, "blobs"),
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
            ],
        )
        if answer[0] == b"fenced":
            raise Fenced(
                f"checkpoint {seq} of {fence.holder} under epoch {fence.epoch} refused: "
                f"the lease is now {describe_fence_text(_raw(answer[1]) or None)}"
            )
        if answer[0] == b"seq":
            raise StoreError(
                f"checkpoint sequence must increase: {seq} is not above {_text(answer[1])}, "
                f"stored under this epoch ({fence.epoch})"
            )
        return info

    @_redis_errors_as_store_errors
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        flat = self._list_checkpoints(
            keys=[self._key(agent, "checkpoints")], args=[MAX_RECORD_BYTES]
        )
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
                found.append(
                    _checkpoint_info(_raw(field), doc if isinstance(doc, int) else _raw(doc))
                )
            except CorruptRecord as exc:
                # Not ours to judge further (the runtime authenticates what is listed):
                # left out, and said once.
                self._reported.warn(
                    (agent, "checkpoint", _raw(field), hash(doc)),
                    "redis store %s: leaving out checkpoint entry %r of %s: %s",
                    self.url,
                    _text(field)[:40],
                    agent,
                    exc,
                )
        return sorted(found, key=lambda info: (info.seq, info.epoch), reverse=True)

    @_redis_errors_as_store_errors
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        answer = self._read_checkpoint(
            keys=[self._key(agent, "checkpoints"), self._key(agent, "blobs")],
            args=[str(info.seq), MAX_RECORD_BYTES, MAX_CHECKPOINT_BYTES],
        )
        if not answer:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        doc, blob = answer
        field = str(info.seq).encode()
        if _checkpoint_info(field, doc if isinstance(doc, int) else _raw(doc)).epoch != info.epoch:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        if isinstance(blob, int):
            raise CorruptRecord(
                f"checkpoint {info.seq} of {agent!r} is {blob} bytes, above the limit of "
                f"{MAX_CHECKPOINT_BYTES} bytes: not read"
            )
        return _raw(blob)

    # -- loss acceptance ---------------------------------------------------

    @_redis_errors_as_store_errors
    def read_acceptance(self, agent: str) -> bytes | None:
        answer = self._bounded_get(keys=[self._key(agent, "acceptance")], args=[MAX_RECORD_BYTES])
        return _bounded(answer, f"loss-acceptance record of {agent!r}", MAX_RECORD_BYTES)

    @_redis_errors_as_store_errors
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

    @_redis_errors_as_store_errors
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        node = check_name("node id", heartbeat.node)
        self._put_heartbeat(
            keys=[self._key(agent, "heartbeats")],
            args=[node, heartbeat.to_json(), self._changed(agent)],
        )

    @_redis_errors_as_store_errors
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        flat = self._heartbeats(keys=[self._key(agent, "heartbeats")], args=[MAX_RECORD_BYTES])
        return self._heartbeats_of(agent, flat)

    def _heartbeats_of(self, agent: str, flat: Any) -> list[Heartbeat]:
        """The heartbeats in a flat HGETALL-shaped reply, by node id; damaged ones logged once."""
        beats: list[Heartbeat] = []
        if not isinstance(flat, list):
            return beats
        for node, data in zip(flat[::2], flat[1::2], strict=False):
            beat = self._heartbeat(agent, node, data)
            if beat is not None:
                beats.append(beat)
        return sorted(beats, key=lambda beat: beat.node)

    def _heartbeat(self, agent: str, node: Any, data: Any) -> Heartbeat | None:
        """node's heartbeat, or None (logged once) for one that does not parse or is another's."""
        if not isinstance(node, bytes) or not isinstance(data, bytes):
            return None
        try:
            beat = Heartbeat.from_json(data)
        except CorruptRecord as exc:
            self._reported.warn(
                (agent, "heartbeat", node, hash(data)),
                "ignoring an unreadable heartbeat of %s: %s",
                _text(node)[:64],
                exc,
            )
            return None
        return beat if beat.node == _text(node) else None

    def _event(self, agent: str, node: str, line: Any) -> Event | None:
        """An event of node, or None (logged once) for one that does not parse or is another's."""
        if not isinstance(line, bytes):
            return None
        try:
            event = Event.from_json(line)
        except CorruptRecord as exc:
            self._reported.warn(
                (agent, "event", node, hash(line)),
                "ignoring an unreadable event of %s: %s",
                node,
                exc,
            )
            return None
        return event if event.node == node else None

    @_redis_errors_as_store_errors
    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._put_heartbeat(
            keys=[self._key(agent, "heartbeats")],
            args=[check_name("node id", node), "", self._changed(agent)],
        )

    # -- events ------------------------------------------------------------

    @_redis_errors_as_store_errors
    def append_event(self, agent: str, event: Event) -> None:
        node = check_name("node id", event.node)
        self._append_event(
            keys=[self._key(agent, "events", node), self._key(agent, "event-counts")],
            args=[node, event.to_json(), self.events_per_node, self._changed(agent)],
        )

    @_redis_errors_as_store_errors
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
                node = _node_name(item[0])
                if node is not None:
                    logs[node] = item[1]
        events: list[Event] = []
        for node in sorted(logs):
            cursor = after.get(node, 0)
            parsed = (self._event(agent, node, line) for line in logs[node])
            events.extend(e for e in parsed if e is not None and e.n > cursor)
        return events

    # -- watch and tail ----------------------------------------------------

    async def watch(self, agent: str, *, lease_only: bool = False) -> AsyncIterator[None]:
        """Yield on every message on the agent's channel; reconnect when the link drops.

        A watch outlives a Redis restart: it reconnects with a bounded backoff
        and then yields once, since changes made meanwhile were announced to
        nobody. A PING after a quiet spell finds a link that died silently.
        """
        channel = self._key(agent, "lease-changed" if lease_only else "changed")
        delay, reconnected = _WATCH_RETRY_S[0], False
        while True:
            client = redis.asyncio.from_url(self._client_url, **self._options)
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(channel)
                    delay = _WATCH_RETRY_S[0]
                    if reconnected:
                        yield None
                    while True:
                        message = await pubsub.get_message(timeout=_WATCH_PING_S)
                        if message is None:
                            await pubsub.ping()
                        elif message["type"] == "message":
                            yield None
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.debug("redis watch of %s: %s; reconnecting in %.1f s", agent, exc, delay)
            finally:
                await client.aclose()
            reconnected = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_RETRY_S[1])

    def tail(self, agent: str) -> RedisTail:
        """Follow the agent's events and heartbeats, fetching only events not read yet."""
        return RedisTail(self, agent)

    def close(self) -> None:
        self._redis.close()


class RedisTail:
    """A tail that remembers, per node, how many events it has read (the event counts)."""

    def __init__(self, store: RedisStore, agent: str) -> None:
        self._store = store
        self._agent = agent
        self._seen: dict[str, int] = {}

    @_redis_errors_as_store_errors
    def read(self) -> TailRead:
        store, agent = self._store, self._agent
        pairs = [str(value) for item in sorted(self._seen.items()) for value in item]
        answer = store._tail(
            keys=[store._key(agent, "event-counts"), store._key(agent, "heartbeats")],
            args=[store._key(agent, "events", ""), MAX_RECORD_BYTES, *pairs],
        )
        if not isinstance(answer, list) or not answer:
            return TailRead([], [])
        beats = store._heartbeats_of(agent, answer[0])
        logs: dict[str, tuple[int, list[Any]]] = {}
        for item in answer[1:]:
            # The script sends only counts and names as we write them; checked again here.
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], list)):
                continue
            node, count = _node_name(item[0]), item[1]
            if node is not None and isinstance(count, int) and 0 <= count <= MAX_SEQ:
                logs[node] = (count, item[2])
        events: list[Event] = []
        for node in sorted(logs):
            count, lines = logs[node]
            self._seen[node] = count
            parsed = (store._event(agent, node, line) for line in lines)
            events.extend(e for e in parsed if e is not None)
        return TailRead(events, beats)


def _node_name(raw: Any) -> str | None:
    """A node id read from the store, or None if it is not one check_name accepts."""
    if not isinstance(raw, bytes):
        return None
    try:
        return check_name("node id", raw.decode("ascii"))
    except (UnicodeDecodeError, ConfigError):
        return None
