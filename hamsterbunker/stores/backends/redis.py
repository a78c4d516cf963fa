"""The Redis backend: ``redis://[user:password@]host:port/db[?prefix=NAME]`` (``rediss://`` for TLS).

Every key of one backend carries one Redis Cluster hash tag, ``{P}`` for the
prefix P (default ``hamsterbunker``), so that one script may touch them all on
one shard::

    {P}:index        sorted set: every stored key, all scored 0, so that
                     ZRANGEBYLEX lists them in key order
    {P}:k:KEY        string: the value of KEY
    {P}:changed      (a pub/sub channel) what each commit changed

A key is stored when it is in the index and its value is a string; anything
else found there reads as absent. Every operation, a get and a scan too, is one
run of one Lua script (``redis_script``). Durability, the watch's messages and
the earlier store's layout: docs/design.md, "Network backends".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio

from ...core.errors import ConfigError, StoreError
from ...core.read_bounds import ReadBound
from ..backend import (
    Capability,
    Get,
    Notice,
    Put,
    Scan,
    ScanResult,
    ScanTaker,
    TooLarge,
    Txn,
    TxnResult,
    key_problem,
    prefix_end,
)
from ..base import StoreGuarantees
from .earlier import earlier_store
from .redis_connection import RedisConnection
from .redis_script import TXN

__all__ = ["CARRIED_BYTES", "GUARANTEES", "RedisBackend"]

log = logging.getLogger(__name__)

GUARANTEES = StoreGuarantees(
    mutual_exclusion="one Lua script per commit on one Redis primary: its compares, writes and "
    "reads are one atomic step. Replication is asynchronous: after a failover the new primary "
    "may miss the latest commits, and a compare may hold again against a value since replaced",
    durability="as the server is configured: appendonly yes with appendfsync always makes every "
    "acknowledged commit durable; everysec can lose about a second on an OS crash; RDB "
    "snapshots or no persistence lose everything since the last snapshot; a failover can "
    "lose acknowledged commits (asynchronous replicas)",
    across_hosts="yes: every node that reaches the primary (rediss:// for TLS); one store's keys "
    "share one Redis Cluster hash slot, but the client follows no Cluster redirects",
)

# The largest value a notice carries: a lease record (its history and control too), a
# heartbeat, not a checkpoint, since every watcher receives every message.
CARRIED_BYTES = 8192
_MESSAGE_BYTES = 32 * 1024  # one commit's message; a bigger change is told as "*"
_JUNK_LOOKED = 1000  # members holding no key one scan may pass over, beside its count
_WATCH_PING_S = 5.0  # a watch quiet this long PINGs its link
_WATCH_RETRY_S = (0.1, 2.0)  # the bounds of the watch's reconnection backoff

_Arg = bytes | str | int


class RedisBackend:
    """Keys to bytes in one Redis database, under a hash-tagged key prefix."""

    guarantees = GUARANTEES
    capabilities = frozenset({Capability.ATOMIC_READS, Capability.CHEAP_WATCH})
    script = TXN  # the commit script (a test runs it with a shebang, under Cluster rules)

    def __init__(self, url: str) -> None:
        self._connection = RedisConnection(url)
        self.url = self._connection.url
        tag = "{" + self._connection.prefix + "}"  # check_name: no braces in a prefix
        self._index, self._values, self._channel = f"{tag}:index", f"{tag}:k:", f"{tag}:changed"
        self._earlier = f"{self._connection.prefix}:cluster"  # the earlier store's cluster record
        self._earlier_looked = False
        self._redis = self._connection.client()
        if self._redis.connection_pool.connection_kwargs.get("decode_responses"):
            self._redis.close()
            raise ConfigError(f"store URL {self.url!r}: values are bytes: no decode_responses")
        # Loaded by the first call (EVALSHA, and SCRIPT LOAD when the server has not got it).
        self._txn = self._redis.register_script(self.script)
        self.warnings: list[str] = self._connection.persistence_warnings(self._redis)

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        read = Get(key, max_bytes)
        return _got(read, self._run(Txn(reads=[read]))[1])

    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        read = Scan(prefix, bound, after)
        return _scanned(read, self._run(Txn(reads=[read]))[1])

    def commit(self, txn: Txn) -> TxnResult:
        answer = self._run(txn)
        reads = [
            _got(read, found) if isinstance(read, Get) else _scanned(read, found)
            for read, found in zip(txn.reads, answer[1:], strict=True)
        ]
        return TxnResult(answer[0] == 1, reads)

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """A notice for each key under prefix a commit changed; a gap after each reconnection
        (made again with a bounded backoff: changes meanwhile were announced to nobody)."""
        delay, reconnected = _WATCH_RETRY_S[0], False
        while True:
            client = self._connection.async_client()
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self._channel)
                    _honour_swallowed_cancel()
                    delay = _WATCH_RETRY_S[0]
                    if reconnected:
                        yield Notice(None)
                    while True:
                        message = await pubsub.get_message(timeout=_WATCH_PING_S)
                        _honour_swallowed_cancel()
                        if message is None:
                            await pubsub.ping()
                            _honour_swallowed_cancel()
                        elif message["type"] == "message":
                            for notice in _notices_in(message["data"], prefix):
                                yield notice
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.debug("redis watch of %s: %s; reconnecting in %.1f s", self.url, exc, delay)
            except redis.RedisError as exc:  # refused (an ACL), not an outage to wait out
                raise StoreError(f"redis store watch of {self.url}: {exc}") from exc
            finally:
                await client.aclose()
            reconnected = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_RETRY_S[1])

    def check(self) -> None:
        """StoreUnavailable, naming the store, unless the server answers a PING."""
        with self._connection.errors_translated(f"check of {self.url}"):
            self._redis.ping()

    def close(self) -> None:
        self._redis.close()

    def _run(self, txn: Txn) -> list[Any]:
        """The script's answer to txn: [succeeded, read, ...] (redis_script)."""
        args = self._args(txn)  # blobs joined here: a maker's error comes out before any I/O
        if not self._earlier_looked:
            self._refuse_an_earlier_store()
        with self._connection.errors_translated(f"commit of {self.url}"):
            answer = self._txn(keys=[self._index], args=args)
        if not isinstance(answer, list) or len(answer) != 1 + len(txn.reads):
            raise StoreError(f"redis store {self.url}: the commit script answered {answer!r:.80}")
        return answer

    def _refuse_an_earlier_store(self) -> None:
        """ConfigError if the earlier Redis store's cluster record is under the prefix."""
        with self._connection.errors_translated(f"open of {self.url}"):
            try:
                found = self._redis.exists(self._earlier)
            except redis.ResponseError as exc:
                # Refused (an ACL allowing only {P}:*, a Cluster node that does not hold it):
                # no earlier store could be read through this client either.
                log.debug("redis store %s: %s not looked for: %s", self.url, self._earlier, exc)
                found = 0
        if found:
            raise earlier_store(f"Redis store {self.url}", f"its key {self._earlier}")
        self._earlier_looked = True

    def _args(self, txn: Txn) -> list[_Arg]:
        """The script's arguments: its settings, then txn's operations (redis_script)."""
        args: list[_Arg] = [
            self._values, self._channel, CARRIED_BYTES, _JUNK_LOOKED, _MESSAGE_BYTES
        ]  # fmt: skip
        for compare in txn.compares:
            _check_key(compare.key)
            if compare.value is None:
                args += ["absent", compare.key]
            else:
                args += ["eq", compare.key, compare.value]
        for write in txn.all_writes:
            if isinstance(write, Put):
                _check_key(write.key)
                args += ["put", write.key, bytes(write.value)]
            elif write.end is None:
                args += ["del", write.start]
            else:
                args += ["delrange", "[" + write.start, "(" + write.end]
        for read in txn.reads:
            if isinstance(read, Get):
                _check_key(read.key)
                args += ["get", read.key, read.max_bytes]
                continue
            low = "(" + read.after if read.after >= read.prefix else "[" + read.prefix
            high = "(" + prefix_end(read.prefix) if read.prefix else "+"
            sizes = (read.bound.count, read.bound.entry_bytes, read.bound.total_bytes)
            args += ["scan", read.prefix, low, high, *sizes]
        return args


def _check_key(key: str) -> None:
    """ValueError for a key that is not one: a scan would never list it (a caller's mistake)."""
    problem = key_problem(key)
    if problem is not None:
        raise ValueError(problem)


def _got(read: Get, found: Any) -> bytes | TooLarge | None:
    """A get's answer: [] for no value, [size] when over max_bytes, else [value]."""
    match found:
        case []:
            return None
        case [int(size)]:
            return TooLarge(read.key, size)
        case [bytes(value)] if len(value) <= read.max_bytes:
            return value
        case [bytes(value)]:  # the script measured it first: never, but never returned either
            return TooLarge(read.key, len(value))
    raise StoreError(f"redis store: the commit script answered a get with {found!r:.80}")


def _scanned(read: Scan, found: Any) -> ScanResult:
    """A scan's answer, [more, key, value or size, ...], taken again within its bound."""
    if not isinstance(found, list) or not found or len(found) % 2 != 1:
        raise StoreError(f"redis store: the commit script answered a scan with {found!r:.80}")
    taker = ScanTaker(read.bound)
    for name, value in zip(found[1::2], found[2::2], strict=True):
        key = name.decode("ascii", "replace") if isinstance(name, bytes) else ""
        # A member planted out of order is passed over until the script has it in place.
        if key <= read.after or not key.startswith(read.prefix) or key_problem(key):
            continue
        if taker.full:
            return taker.result(more=True)
        if isinstance(value, int):
            taker.left_out(key, value)
        elif isinstance(value, bytes):
            taker.take(key, value)
    return taker.result(more=found[0] == 1)


def _notices_in(data: Any, prefix: str) -> list[Notice]:
    """What one message on the channel says under prefix (redis_script): a notice for each
    key a commit changed, with its value where carried; a gap for ``*``; nothing for junk."""
    if data == b"*":
        return [Notice(None)]
    if not isinstance(data, bytes) or len(data) > _MESSAGE_BYTES:
        return []
    found, at = [], 0
    while at < len(data):
        end = data.find(b"\n", at)
        name, space, size = data[at : max(end, at)].partition(b" ")
        key = name.decode("ascii", "replace")
        if end < 0 or key_problem(key) is not None or (space and not size.isdigit()):
            return []
        value, at = None, end + 1
        if space:
            value, at = data[at : at + int(size)], at + int(size)
            if len(value) != int(size):
                return []
        if key.startswith(prefix):
            found.append(Notice(key, value))
    return found


def _honour_swallowed_cancel() -> None:
    """Raise the cancellation redis-py (8.1) lost inside subscribe(), so that cancelling a
    watch ends it: nothing here catches CancelledError, so a task still "cancelling" was
    asked to stop and has not."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
