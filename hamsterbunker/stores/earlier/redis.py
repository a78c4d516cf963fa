"""Reading a store the earlier Redis store wrote, for ``hb migrate-store``: reads only.

That store kept every record under the URL's prefix P (A an agent)::

    P:cluster                  string: the cluster record
    P:agent:A:lease            hash: record (JSON), version, fence, term
    P:agent:A:checkpoints      hash: seq -> description (CheckpointInfo JSON)
    P:agent:A:blobs            hash: seq -> sealed checkpoint
    P:agent:A:effects:SEQ      hash: "<index>:<kind>" -> sealed effect-journal record
    P:agent:A:acceptance       string: the loss-acceptance record
    P:agent:A:heartbeats       hash: node -> heartbeat JSON
    P:agent:A:inbox:pending    hash: number -> sealed submission, while unconsumed
    P:agent:A:inbox:numbers    sorted set: the unconsumed numbers, scored by number
    P:agent:A:inbox:ids        hash: request id -> its number (pending, or consumed and kept)
    P:agent:A:inbox:consumed   hash: number -> request id of a kept consumed submission
    P:agent:A:inbox:replies    hash: number -> sealed reply (absent: consumed without one)

Each read answers as that store's did, junk included, with plain commands. A value is
measured (STRLEN, HSTRLEN) before it is fetched, and fetched under WATCH of its key, so
that one that changed meanwhile aborts the read (StoreError) rather than being fetched
whatever its size (``BoundedReads``). A hash of checkpoints or heartbeats holding more
than a read looks at is refused (CorruptRecord): a part could miss the newest.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis

from ...core.errors import ConfigError, CorruptRecord, StoreError, UnreadableLease
from ...core.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINTS_LISTED,
    MAX_NODES_READ,
    MAX_NUMBER,
    MAX_RECORD_BYTES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_SEQ,
    check_request_id,
)
from ...core.read_bounds import EFFECTS_READ, HEARTBEATS_READ, INBOX_READ, BoundedRead
from ...records import CheckpointInfo, ClusterRecord, Heartbeat, LeaseRecord, check_name
from ...records.parsing import NAME_PATTERN
from .._reported import ReportedOnce
from ..backends.redis_connection import RedisConnection
from ..base import MAX_LISTED_AGENTS, AdmissionState, parse_lease
from . import common

__all__ = ["EarlierRedis", "open_earlier_redis"]

log = logging.getLogger(__name__)

_SCAN_COUNT, _SCAN_CALLS = 1000, 200  # list_agents: keys per SCAN call, and the most calls
_NUMBER = re.compile(rb"[1-9][0-9]{0,15}")  # a seq or inbox number as the store wrote one
_VERSION, _VERSION_CAP = re.compile(rb"0|[1-9][0-9]{0,18}"), 24  # a lease version field
_HEARTBEAT_NAMES = 4 * MAX_NODES_READ  # node names looked at, of which the lowest are read

P = ParamSpec("P")
R = TypeVar("R")
Value = bytes | int | None  # a value fetched, its size (over its cap: not fetched), or absent


def open_earlier_redis(url: str) -> EarlierRedis:
    """The earlier Redis store at url, never made; ConfigError if the prefix holds none."""
    reader = EarlierRedis(RedisConnection(url))
    try:
        reader.check_layout()
    except BaseException:
        reader.close()
        raise
    return reader


def _translated(
    method: Callable[Concatenate[EarlierRedis, P], R],
) -> Callable[Concatenate[EarlierRedis, P], R]:
    """redis-py's errors as store errors, naming the read (RedisConnection.errors_translated)."""

    @functools.wraps(method)
    def translated(self: EarlierRedis, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._connection.errors_translated(method.__name__):
            return method(self, *args, **kwargs)

    return translated


def text(value: Any) -> str:
    """A reply as text: bytes a store writer chose may not be UTF-8."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(value: Value) -> int | None:
    """A seq or inbox number as the store wrote one (1..MAX_SEQ), or None."""
    return common.seq_named(_NUMBER, value) if isinstance(value, bytes) else None


def _checkpoint_info(field: bytes, doc: Value) -> CheckpointInfo:
    """A checkpoints hash entry as CheckpointInfo; CorruptRecord for anything else."""
    seq = _number(field)
    if seq is None:
        raise CorruptRecord(f"checkpoint field {field[:40]!r} is not a seq in 1..{MAX_SEQ}")
    if not isinstance(doc, bytes):
        raise CorruptRecord(f"checkpoint {seq} has a description of {doc} bytes")
    return CheckpointInfo.from_json(doc, seq)


class BoundedReads:
    """Reads of one Redis database, each within the bounds its caller names."""

    def __init__(self, client: Any, url: str) -> None:
        self._redis = client  # redis-py's replies are untyped
        self._url = url

    def type(self, key: str) -> str:
        return text(self._redis.type(key))

    def string(self, key: str, what: str, limit: int) -> bytes | None:
        """The string at key (None if absent); CorruptRecord if of another type or over limit."""
        kind = self.type(key)
        if kind == "none":
            return None
        if kind != "string":
            raise CorruptRecord(f"{what} is stored as a Redis {kind}, not as this store writes it")
        pipe = self._redis.pipeline(transaction=True)
        size, data = pipe.strlen(key).getrange(key, 0, limit).execute()  # limit + 1 bytes at most
        if size > limit:
            raise common.over_limit(what, size, limit)
        return bytes(data)

    def values(
        self, wanted: Sequence[tuple[str, bytes, int]], budget: int | None = None
    ) -> tuple[list[Value], bool]:
        """Hash fields (key, field, cap) measured, then fetched under WATCH: each a value, its
        size when over its cap (unread), or None when absent. The fetch stops before the
        first value that would pass budget bytes in all (then True)."""
        if not wanted:
            return [], False
        with self._redis.pipeline(transaction=True) as watched:
            watched.watch(*{key for key, _, _ in wanted})
            measure = self._redis.pipeline(transaction=False)  # after the WATCH: any change counts
            for key, field, _cap in wanted:
                measure.hstrlen(key, field)
            sizes: list[int] = measure.execute()
            fetch: list[bool] = []
            total = 0
            for (_key, _field, cap), size in zip(wanted, sizes, strict=True):
                if size <= cap and budget is not None and total + size > budget:
                    break
                fetch.append(size <= cap)
                total += size if size <= cap else 0
            watched.multi()
            for (key, field, _cap), one in zip(wanted, fetch, strict=False):
                if one:
                    watched.hget(key, field)
            try:
                fetched = iter(watched.execute())
            except redis.WatchError:
                raise StoreError(
                    f"redis store {self._url}: {wanted[0][0]} changed while it was read: "
                    "stop every node of this store first"
                ) from None
        values = [next(fetched) if one else size for one, size in zip(fetch, sizes, strict=False)]
        return values, len(fetch) < len(wanted)

    def names(self, key: str, most: int, what: str) -> list[bytes]:
        """The field names of hash key (none if absent or of another type), values unread;
        CorruptRecord if it holds more than most."""
        if self.type(key) != "hash":
            return []
        count = self._redis.hlen(key)
        if count > most:
            raise CorruptRecord(
                f"{what} holds {count} entries, above the {most} a read looks at: not as the "
                "store wrote them"
            )
        return list(self._redis.hrandfield(key, most) or [])


class EarlierRedis:
    """The earlier Redis store under one prefix of one database, read (``SourceStore``)."""

    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection
        self.url, self.prefix = connection.url, connection.prefix
        self._redis: Any = connection.client()  # redis-py's replies are untyped
        self._reads = BoundedReads(self._redis, self.url)
        self._reported = ReportedOnce(log)

    def _key(self, agent: str, *parts: str) -> str:
        return ":".join((self.prefix, "agent", check_name("agent id", agent), *parts))

    def _warn(self, agent: str, why: str, *args: object) -> None:
        """Log once what a read of agent's records left out."""
        self._reported.warn(
            (agent, why, *args), "redis store %s: %s: " + why, self.url, agent, *args
        )

    @_translated
    def check_layout(self) -> None:
        """ConfigError unless the prefix holds the earlier store's cluster record."""
        if self._redis.exists(f"{self.prefix}:cluster"):
            return
        if self._redis.exists(f"{{{self.prefix}}}:index"):
            raise common.already_migrated(f"Redis store {self.url}", f"key {{{self.prefix}}}:index")
        raise ConfigError(
            f"Redis store {self.url} holds no store an earlier version wrote (no key "
            f"{self.prefix}:cluster): check the database number and the prefix"
        )

    def _odd(self, agent: str, kinds: dict[str, str]) -> bool:
        """Whether a key is of another type than kinds names (absent is fine), said once."""
        for key, kind in kinds.items():
            found = self._reads.type(key)
            if found not in (kind, "none"):
                self._warn(agent, "%s is a Redis %s", key, found)
                return True
        return False

    # -- the reads ------------------------------------------------------------

    @_translated
    def read_cluster(self) -> ClusterRecord | None:
        data = self._reads.string(f"{self.prefix}:cluster", "cluster record", MAX_RECORD_BYTES)
        return None if data is None else ClusterRecord.from_json(data)

    @_translated
    def list_agents(self) -> list[str]:
        start = f"{self.prefix}:agent:"
        pattern = re.sub(r"([\\*?\[\]])", r"\\\1", start) + "*"  # the prefix matches itself
        found: set[str] = set()
        cursor = 0
        for _call in range(_SCAN_CALLS):
            cursor, keys = self._redis.scan(cursor, match=pattern, count=_SCAN_COUNT)
            for key in keys:
                name = text(key).removeprefix(start).split(":", 1)[0]
                if NAME_PATTERN.fullmatch(name):
                    found.add(name)
            if cursor == 0 or len(found) >= MAX_LISTED_AGENTS:
                break
        return sorted(found)[:MAX_LISTED_AGENTS]

    @_translated
    def read_lease(self, agent: str) -> LeaseRecord | None:
        key = self._key(agent, "lease")
        kind = self._reads.type(key)
        if kind == "none":
            return None
        if kind != "hash":
            raise UnreadableLease(f"lease record is stored as a Redis {kind}", kind)
        (record, version), _ = self._reads.values(
            [(key, b"record", MAX_RECORD_BYTES), (key, b"version", MAX_RECORD_BYTES)]
        )
        # What the earlier store named what it found by (its replace_unreadable_lease took it).
        found = "hash " + " ".join(
            f"size:{v}" if isinstance(v, int) else hashlib.sha1(v or b"").hexdigest()
            for v in (record, version)
        )
        sizes = [v if isinstance(v, int) else len(v or b"") for v in (record, version)]
        if isinstance(record, int):
            too_big = common.over_limit("lease record", sizes[0], MAX_RECORD_BYTES)
            raise UnreadableLease(str(too_big), found)
        if sizes[1] > _VERSION_CAP:
            too_big = common.over_limit("lease record's version field", sizes[1], _VERSION_CAP)
            raise UnreadableLease(str(too_big), found)
        parsed = parse_lease(record or b"", lambda: found)
        version = version if isinstance(version, bytes) else b""
        if not _VERSION.fullmatch(version) or int(version) > MAX_NUMBER:
            raise UnreadableLease(
                f"lease record's version field {version!r} is not a version", found
            )
        return replace(parsed, version=int(version))

    @_translated
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        key = self._key(agent, "heartbeats")
        names = self._reads.names(key, _HEARTBEAT_NAMES, f"heartbeats of {agent!r}")
        nodes = sorted(names, key=text)[: HEARTBEATS_READ.count]  # the lowest node ids
        values, _ = self._reads.values([(key, node, HEARTBEATS_READ.entry_bytes) for node in nodes])
        stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
        for node, value in zip(nodes, values, strict=True):
            if value is not None:  # one over the limit reads as empty, so reported and skipped
                stored.offer(text(node), value if isinstance(value, bytes) else b"")

        def report(node: str, exc: Exception) -> None:
            self._warn(agent, "ignoring an unreadable heartbeat of %s: %s", node[:64], str(exc))

        return common.heartbeats(stored, report)

    @_translated
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        key = self._key(agent, "checkpoints")
        if self._odd(agent, {key: "hash"}):
            return []
        fields = self._reads.names(key, MAX_CHECKPOINTS_LISTED, f"checkpoints of {agent!r}")
        docs, _ = self._reads.values([(key, field, MAX_RECORD_BYTES) for field in fields])
        found = []
        for field, doc in zip(fields, docs, strict=True):
            try:
                if doc is not None:  # None: gone since it was listed
                    found.append(_checkpoint_info(field, doc))
            except CorruptRecord as exc:
                self._warn(agent, "leaving out checkpoint entry %r: %s", text(field)[:40], str(exc))
        return common.newest_first(found)

    @_translated
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        keys = [self._key(agent, "checkpoints"), self._key(agent, "blobs")]
        gone = common.no_longer_retained(agent, info)
        if any(self._reads.type(key) != "hash" for key in keys):
            raise gone
        field = str(info.seq).encode()
        (doc, blob), _ = self._reads.values(
            [(keys[0], field, MAX_RECORD_BYTES), (keys[1], field, MAX_CHECKPOINT_BYTES)]
        )
        if doc is None or blob is None or _checkpoint_info(field, doc).epoch != info.epoch:
            raise gone
        if isinstance(blob, int):
            raise CorruptRecord(
                f"checkpoint {info.seq} of {agent!r} is {blob} bytes, above the limit of "
                f"{MAX_CHECKPOINT_BYTES} bytes: not read"
            )
        return blob

    @_translated
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        key = self._key(agent, "effects", str(seq))
        if self._odd(agent, {key: "hash"}):
            return {}
        # Only the names the store wrote, each by name: whatever else was planted costs nothing.
        cap = EFFECTS_READ.entry_bytes
        values, _ = self._reads.values(
            [(key, f"{i}:{k}".encode(), cap) for i, k in common.EVERY_EFFECT]
        )
        journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
        for name, value in zip(common.EVERY_EFFECT, values, strict=True):
            if isinstance(value, int):
                self._warn(agent, "effect record %s of step %d: %d bytes, unread", name, seq, value)
            elif value is not None and not journal.offer(name, value) and journal.full:
                break
        return dict(journal.entries)

    @_translated
    def read_acceptance(self, agent: str) -> bytes | None:
        what = f"loss-acceptance record of {agent!r}"
        return self._reads.string(self._key(agent, "acceptance"), what, MAX_RECORD_BYTES)

    @_translated
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        pending, numbers = (self._key(agent, "inbox", name) for name in ("pending", "numbers"))
        if self._odd(agent, {pending: "hash", numbers: "zset"}):
            return []
        ours = []
        above = f"({max(int(after), 0)}"
        listed = self._redis.zrangebyscore(
            numbers, above, "+inf", start=0, num=INBOX_READ.count, withscores=True
        )
        for member, score in listed:
            number = _number(member)
            if number is None or number != score:
                self._warn(agent, "left out inbox number %r: not the store's", member[:40])
            else:
                ours.append(number)
        cap = INBOX_READ.entry_bytes
        values, stopped = self._reads.values(
            [(pending, str(n).encode(), cap) for n in ours], INBOX_READ.total_bytes
        )
        found: list[tuple[int, bytes]] = []
        for number, value in zip(ours, values, strict=False):
            if isinstance(value, int):
                self._warn(agent, "left out submission %d: %d bytes, over the limit", number, value)
            elif value is not None:
                found.append((number, value))
        if stopped:
            self._warn(agent, "stopped reading the inbox at %d bytes", INBOX_READ.total_bytes)
        return found

    @_translated
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        ids, consumed, replies = (
            self._key(agent, "inbox", n) for n in ("ids", "consumed", "replies")
        )
        if self._odd(agent, {ids: "hash", consumed: "hash", replies: "hash"}):
            return None
        (named,), _ = self._reads.values([(ids, request_id.encode(), 16)])
        number = _number(named)
        if number is None:
            if named is not None:
                self._warn(agent, "request id %r names no number: unknown", request_id[:64])
            return None
        field = str(number).encode()
        (recorded, reply), _ = self._reads.values(
            [(consumed, field, MAX_REQUEST_ID_CHARS), (replies, field, MAX_REPLY_BYTES)]
        )
        if recorded is None:
            return AdmissionState(number, consumed=False, reply=None)
        if recorded != request_id.encode():
            self._warn(agent, "consumed submission %d is recorded under another request id", number)
            return AdmissionState(number, consumed=True, reply=None)
        if isinstance(reply, int):
            self._warn(agent, "the reply to submission %d is %d bytes: not read", number, reply)
            reply = None
        return AdmissionState(number, consumed=True, reply=reply)

    @_translated
    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids admitted and kept, at most most of them, junk names passed over
        (as the earlier store, at most twice most names are looked at)."""
        key = self._key(agent, "inbox", "ids")
        if self._odd(agent, {key: "hash"}) or most < 1:
            return []
        names = [text(name) for name in self._redis.hrandfield(key, 2 * most) or []]
        return sorted(name for name in names if check_request_id(name) is None)[:most]

    def close(self) -> None:
        self._redis.close()
