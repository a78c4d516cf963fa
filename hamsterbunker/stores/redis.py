"""The Redis store: ``redis://[user:password@]host:port/db[?prefix=NAME]`` (``rediss://`` for TLS).

One Redis primary at one address (replicas behind it are fine, and a failover
that moves that address, by DNS or a proxy; Sentinel discovery is not built
in, and Redis Cluster is not supported, since a script touches several keys of
one agent). Every key starts with the prefix (default ``hamsterbunker``)::

    P:cluster                          the cluster record (SET NX)
    P:agent:A:lease                    hash: record (JSON), version, fence
    P:agent:A:checkpoints              hash: seq -> {epoch, size, written}
    P:agent:A:blobs                    hash: seq -> sealed bytes
    P:agent:A:heartbeats               hash: node -> heartbeat JSON
    P:agent:A:event-counts             hash: node -> events appended so far
    P:agent:A:events:NODE              list of event JSON, trimmed to the newest N

``cas_lease`` and ``put_checkpoint`` are Lua scripts, which Redis runs one at
a time with nothing interleaved: the lease's version is compared and the
record written in one step, and a checkpoint is written only if the ``fence``
field stored beside the lease record (holder, session, epoch) equals the
writer's, in the same step. Whatever Redis does not promise (replication is
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
import json
import logging
import os
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
from ..records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from ..tail import TailRead
from ._tls import describe_tls_failure, tls_error_in, tls_files_problem
from .base import Fence, StoreGuarantees

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

# KEYS: lease hash. ARGV: expected version ('' for none), record JSON, fence,
# new version, channels to publish on. Returns {'ok'} or {'conflict', version}.
_CAS_LEASE = """
local current = redis.call('HGET', KEYS[1], 'version') or ''
if current ~= ARGV[1] then
  return {'conflict', current}
end
redis.call('HSET', KEYS[1], 'record', ARGV[2], 'fence', ARGV[3], 'version', ARGV[4])
for i = 5, #ARGV do
  redis.call('PUBLISH', ARGV[i], 'lease')
end
return {'ok'}
"""

# KEYS: lease hash, checkpoint info hash, blob hash. ARGV: fence, seq, info JSON,
# blob, how many to keep, channel. Returns {'ok'}, {'fenced', stored fence} or
# {'seq', newest stored seq}.
_PUT_CHECKPOINT = """
local fence = redis.call('HGET', KEYS[1], 'fence') or ''
if fence ~= ARGV[1] then
  return {'fenced', fence}
end
local seq = tonumber(ARGV[2])
local kept = redis.call('HKEYS', KEYS[2])
for _, s in ipairs(kept) do
  if tonumber(s) >= seq then
    return {'seq', s}
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
table.insert(kept, ARGV[2])
table.sort(kept, function(a, b) return tonumber(a) > tonumber(b) end)
for i = tonumber(ARGV[5]) + 1, #kept do
  redis.call('HDEL', KEYS[2], kept[i])
  redis.call('HDEL', KEYS[3], kept[i])
end
redis.call('PUBLISH', ARGV[6], 'checkpoint')
return {'ok'}
"""

# KEYS: event counts hash, heartbeats hash. ARGV: events key prefix, then
# (node, count already read) pairs. Returns the heartbeats, then for each node
# with new events {node, count, events}. One script, so the counts and the
# lists are read at one moment (the list keys are derived here, which is why
# Redis Cluster is not supported).
_TAIL = """
local seen = {}
for i = 2, #ARGV, 2 do
  seen[ARGV[i]] = tonumber(ARGV[i + 1])
end
local out = {redis.call('HGETALL', KEYS[2])}
local counts = redis.call('HGETALL', KEYS[1])
for i = 1, #counts, 2 do
  local node, count = counts[i], tonumber(counts[i + 1])
  local new = count - (seen[node] or 0)
  if new > 0 then
    table.insert(out, {node, counts[i + 1], redis.call('LRANGE', ARGV[1] .. node, -new, -1)})
  end
end
return out
"""

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


def _fence_text(holder: str | None, session: str, epoch: int) -> str:
    """The form in which a lease's fence is stored and a writer's fence compared."""
    return json.dumps([holder, session, epoch])


def _describe_fence(stored: bytes) -> str:
    if not stored:
        return "no lease"
    holder, _session, epoch = json.loads(stored)
    return f"epoch {epoch} released" if holder is None else f"epoch {epoch} held by {holder}"


def _raw(value: bytes | str) -> bytes:
    """A reply as bytes (our clients never decode; this only narrows redis-py's types)."""
    return value if isinstance(value, bytes) else value.encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
        self._cas_lease = self._redis.register_script(_CAS_LEASE)
        self._put_checkpoint = self._redis.register_script(_PUT_CHECKPOINT)
        self._tail = self._redis.register_script(_TAIL)
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
        data = self._redis.get(f"{self.prefix}:cluster")
        return None if data is None else ClusterRecord.from_json(_raw(data))

    @_redis_errors_as_store_errors
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        key = f"{self.prefix}:cluster"
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(key, record.to_json(), nx=True)
        pipe.get(key)
        _created, stored = pipe.execute()
        return ClusterRecord.from_json(stored)

    # -- lease -------------------------------------------------------------

    @_redis_errors_as_store_errors
    def read_lease(self, agent: str) -> LeaseRecord | None:
        data = self._redis.hget(self._key(agent, "lease"), "record")
        return None if data is None else LeaseRecord.from_json(_raw(data))

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
                _fence_text(stored.holder, stored.session, stored.epoch),
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
        info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(blob), written=time.time())
        failpoint("checkpoint.before_commit")
        answer = self._put_checkpoint(
            keys=[
                self._key(agent, "lease"),
                self._key(agent, "checkpoints"),
                self._key(agent, "blobs"),
            ],
            args=[
                _fence_text(fence.holder, fence.session, fence.epoch),
                str(seq),
                json.dumps({"epoch": info.epoch, "size": info.size, "written": info.written}),
                bytes(blob),
                self.keep_checkpoints,
                self._changed(agent),
            ],
        )
        if answer[0] == b"fenced":
            raise Fenced(
                f"checkpoint {seq} of {fence.holder} under epoch {fence.epoch} refused: "
                f"the lease is now {_describe_fence(answer[1])}"
            )
        if answer[0] == b"seq":
            raise StoreError(
                f"checkpoint sequence must increase: {seq} is not above {_text(answer[1])}"
            )
        return info

    @_redis_errors_as_store_errors
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        stored = self._redis.hgetall(self._key(agent, "checkpoints"))
        found = [_checkpoint_info(_raw(seq), _raw(doc)) for seq, doc in stored.items()]
        return sorted(found, key=lambda info: info.seq, reverse=True)

    @_redis_errors_as_store_errors
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hget(self._key(agent, "checkpoints"), str(info.seq))
        pipe.hget(self._key(agent, "blobs"), str(info.seq))
        doc, blob = pipe.execute()
        if doc is None or blob is None or _checkpoint_info(info.seq, doc).epoch != info.epoch:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        return bytes(blob)

    # -- heartbeats --------------------------------------------------------

    @_redis_errors_as_store_errors
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        node = check_name("node id", heartbeat.node)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self._key(agent, "heartbeats"), node, heartbeat.to_json())
        pipe.publish(self._changed(agent), "heartbeat")
        pipe.execute()

    @_redis_errors_as_store_errors
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        stored = self._redis.hgetall(self._key(agent, "heartbeats"))
        beats = [_heartbeat(_raw(node), _raw(data)) for node, data in sorted(stored.items())]
        return [beat for beat in beats if beat is not None]

    @_redis_errors_as_store_errors
    def remove_heartbeat(self, agent: str, node: str) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(self._key(agent, "heartbeats"), check_name("node id", node))
        pipe.publish(self._changed(agent), "heartbeat")
        pipe.execute()

    # -- events ------------------------------------------------------------

    @_redis_errors_as_store_errors
    def append_event(self, agent: str, event: Event) -> None:
        node = check_name("node id", event.node)
        events = self._key(agent, "events", node)
        pipe = self._redis.pipeline(transaction=True)
        pipe.rpush(events, event.to_json())
        pipe.ltrim(events, -self.events_per_node, -1)
        pipe.hincrby(self._key(agent, "event-counts"), node, 1)
        pipe.publish(self._changed(agent), "event")
        pipe.execute()

    @_redis_errors_as_store_errors
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        nodes = sorted(_text(node) for node in self._redis.hkeys(self._key(agent, "event-counts")))
        pipe = self._redis.pipeline(transaction=False)
        for node in nodes:
            pipe.lrange(self._key(agent, "events", node), 0, -1)
        events: list[Event] = []
        for node, lines in zip(nodes, pipe.execute(), strict=True):
            cursor = after.get(node, 0)
            parsed = (_event(node, line) for line in lines)
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
            args=[store._key(agent, "events", ""), *pairs],
        )
        flat = answer[0]
        beats = [_heartbeat(node, data) for node, data in zip(flat[::2], flat[1::2], strict=True)]
        events: list[Event] = []
        for raw_node, count, lines in sorted(answer[1:]):
            node = _text(raw_node)
            self._seen[node] = int(count)
            events.extend(e for e in (_event(node, line) for line in lines) if e is not None)
        return TailRead(events, sorted((b for b in beats if b), key=lambda b: b.node))


def _checkpoint_info(seq: bytes | int, doc: bytes) -> CheckpointInfo:
    try:
        fields = json.loads(doc)
        return CheckpointInfo(
            epoch=int(fields["epoch"]),
            seq=int(seq),
            size=int(fields["size"]),
            written=float(fields["written"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(f"checkpoint {_text(seq)} has an unreadable description") from exc


def _heartbeat(node: bytes, data: bytes) -> Heartbeat | None:
    """node's heartbeat, or None (logged) for one that does not parse or is another node's."""
    try:
        beat = Heartbeat.from_json(data)
    except CorruptRecord as exc:
        log.warning("ignoring an unreadable heartbeat of %s: %s", _text(node), exc)
        return None
    return beat if beat.node == _text(node) else None


def _event(node: str, line: bytes) -> Event | None:
    """An event of node, or None (logged) for one that does not parse or is another node's."""
    try:
        event = Event.from_json(line)
    except CorruptRecord as exc:
        log.warning("ignoring an unreadable event of %s: %s", node, exc)
        return None
    return event if event.node == node else None
