"""The Redis backend beyond the contract: outages, planted contents, Cluster rules, the watch.

The contract runs on Redis in test_backend_contract.py; this file checks what
only the Redis backend can get wrong. A "raw" client is plain redis-py on the
same database, writing what a store writer without the secret may write.
Servers listen on 127.0.0.1 only (tests/support/redis_server.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis

from hamsterbunker.core.errors import ConfigError, StoreError, StoreUnavailable
from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.stores.backend import (
    Compare,
    DeleteRange,
    Get,
    Notice,
    Put,
    Scan,
    ScanResult,
    TooLarge,
    Txn,
)
from hamsterbunker.stores.backends.redis import CARRIED_BYTES, RedisBackend
from hamsterbunker.stores.backends.redis_connection import parse_redis_url
from hamsterbunker.stores.backends.redis_script import TXN
from tests.support import each_ended, wait_until
from tests.support.redis_server import RedisServer, redis_url
from tests.support.server_process import stop_thawed

WIDE = ReadBound(100, 1024, 100 * 1024)


@pytest.fixture
def private_server() -> Iterator[Callable[..., RedisServer]]:
    """Start servers of this test's own (to stop or configure); all stopped at the end."""
    with each_ended(RedisServer.start, stop_thawed) as start:
        yield start


@pytest.fixture
def opened() -> Iterator[Callable[..., RedisBackend]]:
    """Open backends; all closed at the end."""
    with each_ended(RedisBackend, RedisBackend.close) as open_one:
        yield open_one


class Raw:
    """A plain redis-py client on a backend's database, and the names of its keys."""

    def __init__(self, url: str) -> None:
        client_url, prefix = parse_redis_url(url)
        self.client = redis.Redis.from_url(client_url)
        self.index, self.channel = f"{{{prefix}}}:index", f"{{{prefix}}}:changed"
        self.tag = f"{{{prefix}}}:"

    def value_key(self, key: str) -> str:
        return f"{self.tag}k:{key}"

    def plant(self, key: str, value: bytes, score: float = 0) -> None:
        """A value and its index member, as a put makes them (or with another score)."""
        self.client.set(self.value_key(key), value)
        self.client.zadd(self.index, {key: score})


@pytest.fixture
def url() -> str:
    return redis_url()


@pytest.fixture
def raw(url: str) -> Iterator[Raw]:
    planted = Raw(url)
    yield planted
    planted.client.close()


def put(backend: RedisBackend, key: str, value: bytes) -> None:
    assert backend.commit(Txn(writes=[Put(key, value)])).succeeded


def keys(result: ScanResult) -> list[str]:
    return [key for key, _value in result.items]


# -- outages -------------------------------------------------------------------


def test_a_stopped_server_is_store_unavailable_naming_the_store(
    private_server: Callable[..., RedisServer], opened: Callable[..., RedisBackend]
) -> None:
    """With the server gone, every call is a StoreUnavailable that names the store's URL."""
    server = private_server()
    backend = opened(server.url(prefix="gone", query="socket_connect_timeout=0.5"))
    put(backend, "a/k", b"v")
    server.stop()
    for call in (
        backend.check,
        lambda: backend.get("a/k", 10),
        lambda: backend.commit(Txn(writes=[Put("a/k", b"w")])),
    ):
        with pytest.raises(StoreUnavailable, match="prefix=gone") as caught:
            call()
        assert backend.url in str(caught.value)


def test_a_commit_cut_off_before_its_answer_is_whole_or_not_made(
    private_server: Callable[..., RedisServer], opened: Callable[..., RedisBackend]
) -> None:
    """A commit whose answer times out is a StoreError; the store then holds all of it or none."""
    server = private_server()
    url = server.url(query="socket_timeout=0.3")
    backend, raw = opened(url), Raw(url)
    raw.client.client_pause(10_000, all=False)  # scripts wait, GETs do not
    writes = [Put(f"a/{n}", b"v") for n in range(3)]
    with pytest.raises(StoreError):
        backend.commit(Txn(writes=writes))
    raw.client.client_unpause()
    found = [raw.client.exists(raw.value_key(write.key)) for write in writes]
    assert found in ([0] * 3, [1] * 3)
    assert backend.get("a/0", 10) == (b"v" if found[0] else None)


@pytest.mark.parametrize("delay_s", [0.0, 0.005, 0.02])
def test_a_server_killed_during_a_commit_keeps_all_of_it_or_none(
    private_server: Callable[..., RedisServer], opened: Callable[..., RedisBackend], delay_s: float
) -> None:
    """SIGKILL of a server with appendfsync always, at moments within a big commit: all or none."""
    durable = ("--appendonly", "yes", "--appendfsync", "always")
    server = private_server(*durable)
    url = server.url(prefix="p", query="socket_timeout=5")
    writes = [Put(f"a/{n:03}", bytes([n]) * 65536) for n in range(100)]
    backend = opened(url)
    failed: list[BaseException] = []

    def commit() -> None:
        try:
            backend.commit(Txn(writes=writes))
        except StoreError as exc:
            failed.append(exc)

    thread = threading.Thread(target=commit)
    thread.start()
    time.sleep(delay_s)  # the moment of the crash: what is tried, not a wait
    server.kill()
    thread.join(timeout=30)
    private_server(*durable, port=server.port, workdir=server.workdir)
    found = opened(url).scan("a/", ReadBound(200, 65536, 200 * 65536))
    whole = [(write.key, write.value) for write in writes]
    assert not found.more
    # Acknowledged, it is durable; unanswered, it may have been made or not, but whole.
    assert found.items in ([], whole) if failed else found.items == whole


# -- planted contents ------------------------------------------------------------


def test_a_planted_huge_value_never_leaves_the_server(
    private_server: Callable[..., RedisServer], opened: Callable[..., RedisBackend]
) -> None:
    """An 8 MiB value is reported TooLarge by get, scan and a commit's reads without being sent."""
    url = private_server().url()
    backend, raw = opened(url), Raw(url)
    raw.plant("a/huge", b"x" * (8 << 20))

    def sent() -> int:
        return int(raw.client.info("stats")["total_net_output_bytes"])

    before = sent()
    assert backend.get("a/huge", 100) == TooLarge("a/huge", 8 << 20)
    scanned = backend.scan("a/", ReadBound(10, 100, 1000))
    assert scanned.items == [] and scanned.too_large == [TooLarge("a/huge", 8 << 20)]
    answer = backend.commit(Txn(reads=[Get("a/huge", 10), Scan("a/", ReadBound(1, 10, 10))]))
    assert isinstance(answer.reads[0], TooLarge)
    assert sent() - before < 64 * 1024


def test_planted_members_and_keys_never_pass_a_bound_nor_fail_a_read(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """Members that hold no key are passed over and dropped; values outside the index are absent."""
    backend = opened(url)
    put(backend, "a/1", b"one")
    put(backend, "a/2", b"two")
    junk = ["a/ bad", "a/../b", "a/" + "x" * 2000, "a/\u00e9", "a//c"]
    for member in junk:
        raw.plant(member, b"junk")
    raw.client.zadd(raw.index, {"a/ghost": 0})  # a member without a value
    raw.client.zadd(raw.index, {"a/hash": 0})
    raw.client.hset(raw.value_key("a/hash"), "f", "v")  # a value of another type
    raw.client.set(raw.value_key("a/outside"), b"not indexed")
    raw.plant("a/late", b"late", score=5)  # out of lex order until put back
    raw.plant("zzz", b"first", score=-1)  # would hide every other member from a range

    bound = ReadBound(10, 100, 1000)
    result = backend.scan("a/", bound)
    assert keys(result) == ["a/1", "a/2", "a/late"] and not result.more
    assert sum(len(value) for _key, value in result.items) <= bound.total_bytes
    for member in [*junk, "a/ghost", "a/hash"]:
        assert raw.client.zscore(raw.index, member) is None  # gone from the index
    for key in ("a/ghost", "a/hash", "a/outside"):
        assert backend.get(key, 100) is None
    absent = Txn(compares=[Compare("a/outside", None), Compare("a/hash", None)])
    assert backend.commit(absent).succeeded
    put(backend, "a/hash", b"replaced")
    assert backend.get("a/hash", 100) == b"replaced"


def test_a_scan_through_many_planted_members_is_bounded_and_goes_on(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """5,000 members without values cost each scan a bounded look; later scans get past them."""
    backend = opened(url)
    raw.client.zadd(raw.index, {f"a/{n:05}": 0 for n in range(5000)})
    put(backend, "a/real", b"v")
    bound = ReadBound(10, 100, 1000)
    results = [backend.scan("a/", bound)]
    while results[-1].more:  # nothing taken yet, so each scan starts from the prefix again
        assert len(results) < 10, "the scans never got past the planted members"
        results.append(backend.scan("a/", bound))
    assert len(results) >= 2
    assert [keys(result) for result in results] == [[]] * (len(results) - 1) + [["a/real"]]
    assert raw.client.zcard(raw.index) == 1


def test_an_index_of_another_type_reads_as_empty_and_a_put_replaces_it(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """A string where the index belongs hides nothing and breaks nothing: the next put fixes it."""
    backend = opened(url)
    put(backend, "a/1", b"one")
    raw.client.delete(raw.index)
    raw.client.rpush(raw.index, b"a/1")
    assert backend.get("a/1", 10) is None and backend.scan("a/", WIDE) == ScanResult()
    put(backend, "a/2", b"two")
    assert raw.client.type(raw.index) == b"zset"
    assert keys(backend.scan("a/", WIDE)) == ["a/2"]


def test_a_key_that_is_not_one_is_refused_before_anything_is_sent(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """A put of a key a scan could never list is a ValueError, and nothing of its commit is made."""
    backend = opened(url)
    with pytest.raises(ValueError, match="not a name"):
        backend.commit(Txn(writes=[Put("a/ok", b"v"), Put("a/not ok", b"v")]))
    assert raw.client.exists(raw.index) == 0


# -- the script ---------------------------------------------------------------------


class ClusterRules(RedisBackend):
    """The same script, flagged (``#!lua``) so that Redis holds it to one Cluster slot."""

    script = "#!lua\n" + TXN


def test_every_key_the_script_touches_is_in_the_stores_hash_slot(
    private_server: Callable[..., RedisServer],
) -> None:
    """On a Cluster node, every operation (and every repair of planted junk) stays in one slot."""
    server = private_server("--cluster-enabled", "yes")
    url = server.url()
    raw = Raw(url)
    raw.client.cluster("ADDSLOTSRANGE", 0, 16383)
    wait_until(lambda: raw.client.cluster("INFO")["cluster_state"] == "ok", "the cluster")
    with pytest.raises(redis.ResponseError, match="same slot"):  # the rules are on
        raw.client.eval("#!lua\nreturn redis.call('GET', '{other}:x')", 1, raw.index)
    backend = ClusterRules(url)
    try:
        raw.plant("a/late", b"v", score=3)
        raw.client.zadd(raw.index, {"a/ghost": 0, "a/ bad": 0})
        put(backend, "a/1", b"one")
        txn = Txn(
            compares=[Compare("a/1", b"one"), Compare("a/none", None)],
            writes=[Put("a/2", b"two"), DeleteRange("a/1"), DeleteRange("a/0", "a/2")],
            reads=[Get("a/2", 10), Scan("a/", WIDE)],
        )
        assert backend.commit(txn).succeeded
        assert keys(backend.scan("a/", WIDE)) == ["a/2", "a/late"]
    finally:
        backend.close()
    stored = set(raw.client.keys("*"))
    assert stored and stored == set(raw.client.keys(raw.tag + "*"))


def test_the_script_is_loaded_again_when_the_server_lost_it(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """After SCRIPT FLUSH (or a restart) the next call loads the script and goes on."""
    backend = opened(url)
    put(backend, "a/1", b"one")
    raw.client.script_flush()
    assert backend.get("a/1", 10) == b"one"


def test_decoded_replies_are_refused(url: str) -> None:
    """Values are bytes: a URL asking redis-py to decode replies is a ConfigError."""
    with pytest.raises(ConfigError, match="decode_responses"):
        RedisBackend(url + "&decode_responses=true")


def test_persistence_that_can_lose_commits_is_warned_about(
    private_server: Callable[..., RedisServer], opened: Callable[..., RedisBackend]
) -> None:
    """appendonly no is warned about at open; appendfsync always is not."""
    assert "appendonly is off" in opened(private_server().url()).warnings[0]
    durable = private_server("--appendonly", "yes", "--appendfsync", "always")
    assert opened(durable.url()).warnings == []


# -- the watch -------------------------------------------------------------------------


async def watching(watch: AsyncIterator[Notice], raw: Raw) -> asyncio.Future[Notice]:
    """The watch's first notice, asked for once its subscription is in place."""
    first = asyncio.ensure_future(anext(watch))
    deadline = time.monotonic() + 10
    while dict(await asyncio.to_thread(raw.client.pubsub_numsub, raw.channel)) == {
        raw.channel.encode(): 0
    }:
        assert time.monotonic() < deadline, "the watch never subscribed"
        await asyncio.sleep(0.01)
    return first


def test_a_watch_carries_small_values_and_passes_over_junk_messages(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """Notices under the prefix only: a small put's value, a big put's or a delete's key alone."""
    writer, watcher = opened(url), opened(url)
    big = b"x" * (CARRIED_BYTES + 1)

    async def notices() -> list[Notice]:
        watch = watcher.watch("w/")
        try:
            first = await watching(watch, raw)
            for junk in (b"not a key", b"w/k\n" + b"x" * (1 << 20), b"w/\xff"):
                await asyncio.to_thread(raw.client.publish, raw.channel, junk)
            for txn in (
                Txn(writes=[Put("x/elsewhere", b"no")]),
                Txn(writes=[Put("w/k", b"small")]),
                Txn(writes=[Put("w/k", big)]),
                Txn(writes=[DeleteRange("w/", "w0")]),
            ):
                await asyncio.to_thread(writer.commit, txn)
            found = [await asyncio.wait_for(first, 10)]
            for _ in range(2):
                found.append(await asyncio.wait_for(anext(watch), 10))
            return found
        finally:
            await watch.aclose()  # type: ignore[attr-defined]

    assert asyncio.run(notices()) == [Notice("w/k", b"small"), Notice("w/k"), Notice("w/k")]


def test_a_commit_is_told_in_one_message_and_a_huge_one_as_a_gap(
    url: str, raw: Raw, opened: Callable[..., RedisBackend]
) -> None:
    """Every key a commit changed, in one message (a watcher wakes once per commit, not per
    key); a commit whose changes are over a message's bound tells "anything may have
    changed", a gap."""
    writer, watcher = opened(url), opened(url)
    many = [Put(f"w/many/{i:05d}", b"v" * 200) for i in range(200)]  # some 44 KiB told
    listener = raw.client.pubsub(ignore_subscribe_messages=True)

    async def notices() -> list[Notice]:
        watch = watcher.watch("w/")
        try:
            first = await watching(watch, raw)  # before the listener: it counts subscribers
            listener.subscribe(raw.channel)
            wait_until(
                lambda: dict(raw.client.pubsub_numsub(raw.channel))[raw.channel.encode()] == 2,
                "the listener to subscribe",
            )
            await asyncio.to_thread(
                writer.commit,
                Txn(writes=[Put("w/a", b"one"), Put("x/b", b"elsewhere"), DeleteRange("w/c")]),
            )
            await asyncio.to_thread(writer.commit, Txn(writes=[Put("w/c", b"three")]))
            await asyncio.to_thread(writer.commit, Txn(writes=many))
            found = [await asyncio.wait_for(first, 10)]
            for _ in range(2):
                found.append(await asyncio.wait_for(anext(watch), 10))
            return found
        finally:
            await watch.aclose()  # type: ignore[attr-defined]

    assert asyncio.run(notices()) == [Notice("w/a", b"one"), Notice("w/c", b"three"), Notice(None)]
    messages = []
    deadline = time.monotonic() + 10
    while len(messages) < 3 and time.monotonic() < deadline:
        message = listener.get_message(timeout=1)
        if message is not None:
            messages.append(message["data"])
    listener.close()
    # One message a commit, every key it changed (DeleteRange("w/c") removed nothing).
    assert messages == [b"w/a 3\nonex/b 9\nelsewhere", b"w/c 5\nthree", b"*"]


def test_a_watch_says_there_was_a_gap_after_the_server_restarts(
    private_server: Callable[..., RedisServer], opened: Callable[..., RedisBackend]
) -> None:
    """A watch outlives a restart of its server: a gap notice once it is back, then notices again."""
    server = private_server()
    url = server.url(prefix="p")
    writer, watcher = opened(url), opened(url)

    async def main() -> list[Notice]:
        watch = watcher.watch("w/")
        try:
            first = await watching(watch, Raw(url))
            await asyncio.to_thread(put, writer, "w/1", b"one")
            found = [await asyncio.wait_for(first, 10)]
            await asyncio.to_thread(server.stop)
            private_server(port=server.port)  # the same address, empty again
            found.append(await asyncio.wait_for(anext(watch), 30))
            await asyncio.to_thread(put, writer, "w/2", b"two")
            found.append(await asyncio.wait_for(anext(watch), 10))
            return found
        finally:
            await watch.aclose()  # type: ignore[attr-defined]

    assert asyncio.run(main()) == [Notice("w/1", b"one"), Notice(None), Notice("w/2", b"two")]
