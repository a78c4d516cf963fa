"""What only the etcd backend has: its server gone, keys and values planted behind its back,
one etcd Txn per commit, etcd's request limit, and a watch that replays what it missed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, cast

import pytest
from etcd3gw.client import Etcd3Client

from hamsterbunker.core.errors import StoreError, StoreUnavailable
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
from hamsterbunker.stores.backends import etcd_watch
from hamsterbunker.stores.backends.etcd import EtcdBackend
from hamsterbunker.stores.backends.etcd_connection import parse_etcd_url
from tests.support import each_ended, wait_until
from tests.support.etcd_server import EtcdServer, shared_etcd
from tests.support.server_process import free_port, stop_thawed

WAIT_S = 30.0
WIDE = ReadBound(100, 1024, 100 * 1024)


@pytest.fixture
def private_server() -> Iterator[Callable[[], EtcdServer]]:
    """Start servers of this test's own (to stop or restart); all stopped at the end."""
    with each_ended(EtcdServer.start, stop_thawed) as start:
        yield start


@pytest.fixture
def opened() -> Iterator[Callable[[str], EtcdBackend]]:
    """Open etcd backends; all closed at the end."""
    with each_ended(EtcdBackend, EtcdBackend.close) as open_one:
        yield open_one


def raw_client(server: EtcdServer) -> Etcd3Client:
    """A plain etcd3gw client, to change keys behind the backend's back."""
    return Etcd3Client(host="127.0.0.1", port=server.port, timeout=5, api_path="/v3/")


def raw_key(url: str, key: str | bytes) -> bytes:
    """The etcd key the backend of url keeps key at."""
    return (
        parse_etcd_url(url).prefix.encode()
        + b"/"
        + (key if isinstance(key, bytes) else key.encode())
    )


def revision(raw: Etcd3Client) -> int:
    return int(raw.status()["header"]["revision"])


def put(backend: EtcdBackend, key: str, value: bytes) -> None:
    assert backend.commit(Txn(writes=[Put(key, value)])).succeeded


def txns_of(
    backend: EtcdBackend, monkeypatch: pytest.MonkeyPatch, then: Callable[[], object] = list
) -> list[dict[str, Any]]:
    """The answers of the etcd txns backend sends from now on; then() after each."""
    answers: list[dict[str, Any]] = []
    connection = backend._connection
    original = connection.txn

    def txn(*args: Any) -> dict[str, Any]:
        answers.append(original(*args))
        then()
        return answers[-1]

    monkeypatch.setattr(connection, "txn", txn)
    return answers


# -- the server gone ---------------------------------------------------------------


def test_a_stopped_server_is_store_unavailable_naming_it(
    private_server: Callable[[], EtcdServer], opened: Callable[[str], EtcdBackend]
) -> None:
    """Every operation on a stopped etcd is a StoreUnavailable that names the endpoint."""
    server = private_server()
    backend = opened(server.url())
    put(backend, "a/k", b"v")
    server.halt()
    for operation in (
        lambda: backend.get("a/k", 10),
        lambda: backend.scan("a/", WIDE),
        lambda: backend.commit(Txn(writes=[Put("a/k", b"w")])),
        backend.check,
    ):
        with pytest.raises(StoreUnavailable, match=server.endpoint):
            operation()
    server.start_again()
    assert backend.get("a/k", 10) == b"v"  # nothing half-written, and the backend goes on


def test_check_tries_every_endpoint_and_names_them_all(
    opened: Callable[[str], EtcdBackend],
) -> None:
    """check passes while one endpoint answers; with none, its message names every one."""
    live, dead = shared_etcd().endpoint, f"127.0.0.1:{free_port()}"
    opened(f"etcd://{dead},{live}/hb-test/check").check()
    other = f"127.0.0.1:{free_port()}"
    with pytest.raises(StoreUnavailable) as caught:
        opened(f"etcd://{dead},{other}/hb-test/check").check()
    assert dead in str(caught.value) and other in str(caught.value)


# -- planted contents ----------------------------------------------------------------


def test_planted_values_over_the_bounds_are_never_returned(
    opened: Callable[[str], EtcdBackend],
) -> None:
    """Values a raw client planted over entry_bytes, or past total_bytes, are left out."""
    server = shared_etcd()
    url = server.url()
    raw = raw_client(server)
    raw.put(raw_key(url, "a/0"), b"small")
    for n in range(1, 4):
        raw.put(raw_key(url, f"a/{n}"), bytes(200_000))
    for n in range(16):
        raw.put(raw_key(url, f"a/x{n:02}"), b"x" * 1000)
    backend = opened(url)
    assert backend.get("a/1", 1024) == TooLarge("a/1", 200_000)
    result = backend.scan("a/", ReadBound(100, 1024, 3500))
    assert [t.key for t in result.too_large] == ["a/1", "a/2", "a/3"]
    assert sum(len(value) for _key, value in result.items) <= 3500 and result.more
    assert result.items[0] == ("a/0", b"small") and len(result.items) == 4


def test_a_planted_key_that_is_no_backend_key_counts_and_is_read_past(
    opened: Callable[[str], EtcdBackend],
) -> None:
    """A key of bytes that are not UTF-8 is one entry of a scan, and a scan reads on after it."""
    server = shared_etcd()
    url = server.url()
    raw_client(server).put(raw_key(url, b"a/\xff\xfe"), b"junk")
    backend = opened(url)
    put(backend, "a/1", b"one")
    first = backend.scan("a/", ReadBound(1, 10, 100))
    assert first.items == [("a/1", b"one")] and first.more
    junk = backend.scan("a/", ReadBound(1, 10, 100), after="a/1")
    [(key, value)] = junk.items
    assert value == b"junk" and not junk.more
    assert backend.scan("a/", WIDE, after=key) == ScanResult()


def test_a_scan_in_pages_reads_the_store_as_of_its_first(
    opened: Callable[[str], EtcdBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes made between a scan's pages are not seen: every page reads one revision."""
    url = shared_etcd().url()
    backend, other = opened(url), opened(url)
    for n in range(6):
        put(backend, f"a/{n}", b"v")

    def between(pages: int) -> Txn:
        return Txn(writes=[DeleteRange("a/4"), Put(f"a/{pages}x", b"new")])

    answers = txns_of(backend, monkeypatch, then=lambda: other.commit(between(len(answers))))
    result = backend.scan("a/", ReadBound(10, 2**19, 2**20))  # pages of two values
    assert [key for key, _value in result.items] == [f"a/{n}" for n in range(6)]
    assert len(answers) == 3


# -- one Txn per commit ------------------------------------------------------------


def test_a_commit_is_one_txn_that_moves_the_revision_once(
    opened: Callable[[str], EtcdBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts, deletes, compares and reads of one commit go in one request and one revision."""
    server = shared_etcd()
    backend = opened(server.url())
    put(backend, "a/old", b"x")
    raw = raw_client(server)
    sent = txns_of(backend, monkeypatch)
    before = revision(raw)
    result = backend.commit(
        Txn(
            compares=[Compare("a/old", b"x"), Compare("a/none", None)],
            writes=[Put("a/1", b"one"), Put("a/2", b"two"), DeleteRange("a/old")],
            reads=[Get("a/1", 10), Scan("a/", WIDE)],
        )
    )
    assert result.succeeded and len(sent) == 1
    assert revision(raw) == before + 1  # this test process alone writes to its shared server


def test_a_commit_past_etcds_operations_per_txn_reads_after_it_as_of_it(
    opened: Callable[[str], EtcdBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More writes and reads than etcd takes in one txn: the writes in one, the reads after
    it at its revision, as they were when its compares failed, after its writes else."""
    url = shared_etcd().url()
    backend, other = opened(url), opened(url)
    put(backend, "a/flag", b"on")
    sent = txns_of(backend, monkeypatch, then=lambda: put(other, "a/000", b"later"))
    reads: list[Get | Scan] = [Get(f"a/{n:03}", 10) for n in range(60)]
    writes = [Put(f"a/{n:03}", b"v") for n in range(100)]
    failed = backend.commit(Txn([Compare("a/flag", b"off")], writes, reads))
    assert not failed.succeeded and failed.reads == [None] * 60  # a/000 came after: unseen
    done = backend.commit(Txn([Compare("a/flag", b"on")], writes, [*reads, Scan("a/", WIDE)]))
    assert done.succeeded and done.reads[:60] == [b"v"] * 60
    listed = done.reads[60]
    assert isinstance(listed, ScanResult) and len(listed.items) == 100 and listed.more
    assert len(sent) == 4 and backend.get("a/000", 10) == b"later"


def test_writes_past_etcds_operations_per_txn_are_refused_clearly(
    opened: Callable[[str], EtcdBackend],
) -> None:
    """A commit of more writes than etcd takes in one txn is a StoreError naming the setting."""
    backend = opened(shared_etcd().url())
    with pytest.raises(StoreError, match="--max-txn-ops"):
        backend.commit(Txn(writes=[Put(f"a/{n:03}", b"v") for n in range(200)]))
    assert backend.scan("a/", WIDE) == ScanResult()


def test_a_scan_of_names_only_is_one_request(
    opened: Callable[[str], EtcdBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan that takes no value bytes (names only) reads its small values in one page."""
    backend = opened(shared_etcd().url())
    backend.commit(Txn(writes=[Put(f"a/{n:04}", b"") for n in range(120)]))
    sent = txns_of(backend, monkeypatch)
    assert len(backend.scan("a/", ReadBound(4096, 0, 0)).items) == 120 and len(sent) == 1


def test_a_delete_range_then_puts_inside_it_is_one_txn_etcd_takes(
    opened: Callable[[str], EtcdBackend],
) -> None:
    """etcd refuses a put inside its own txn's delete-range: the range is cut around it."""
    backend = opened(shared_etcd().url())
    for key in ["a/1", "a/2", "a/3"]:
        put(backend, key, b"old")
    assert backend.commit(
        Txn(writes=[Put("a/3", b"gone"), DeleteRange("a/", "a0"), Put("a/2", b"new")])
    ).succeeded
    assert backend.scan("a/", WIDE).items == [("a/2", b"new")]


def test_a_killed_server_leaves_each_commit_whole_or_absent(
    private_server: Callable[[], EtcdServer], opened: Callable[[str], EtcdBackend]
) -> None:
    """Commits of two keys each, while etcd is SIGKILLed: after it, every pair or neither."""
    server = private_server()
    backend = opened(server.url())
    written: list[int] = []
    stop = threading.Event()

    def write_pairs() -> None:
        for n in range(100_000):
            if stop.is_set():
                return
            try:
                backend.commit(Txn(writes=[Put(f"p/{n:06}/a", b"a"), Put(f"p/{n:06}/b", b"b")]))
            except StoreError:
                return
            written.append(n)

    writer = threading.Thread(target=write_pairs)
    writer.start()
    wait_until(lambda: len(written) > 20, "some commits")
    server.process.kill()
    server.process.wait(timeout=10)
    stop.set()
    writer.join(timeout=WAIT_S)
    assert not writer.is_alive()
    server.start_again()
    keys = [key for key, _value in backend.scan("p/", ReadBound(100_000, 10, 10**7)).items]
    pairs = {key.split("/")[1] for key in keys}
    assert len(keys) == 2 * len(pairs) and len(pairs) >= len(written)


# -- etcd's request limit ----------------------------------------------------------


@pytest.mark.parametrize("size", [1_600_000, 3_000_000], ids=["over-request-limit", "over-grpc"])
def test_a_commit_over_the_request_limit_is_refused_clearly(
    opened: Callable[[str], EtcdBackend], size: int
) -> None:
    """A value over etcd's request limit is a StoreError naming its size and the setting,
    and nothing of its commit is written."""
    backend = opened(shared_etcd().url())
    with pytest.raises(StoreError) as caught:
        backend.commit(Txn(writes=[Put("a/small", b"x"), Put("a/big", bytes(size))]))
    assert not isinstance(caught.value, StoreUnavailable)
    assert f"{size} bytes" in str(caught.value) and "--max-request-bytes" in str(caught.value)
    assert backend.get("a/small", 10) is None
    put(backend, "a/big", bytes(1_400_000))  # below the default limit: taken
    assert backend.get("a/big", 1_400_000) == bytes(1_400_000)


# -- the watch ---------------------------------------------------------------------


async def watching(backend: EtcdBackend, prefix: str) -> AsyncGenerator[Notice, None]:
    """A watch of prefix once it is in place (a marker it was told of): its notices."""
    notices = cast(AsyncGenerator[Notice, None], backend.watch(prefix))
    first = asyncio.ensure_future(anext(notices))
    for _attempt in range(100):
        await asyncio.to_thread(put, backend, prefix + "ready", b"")
        done, _pending = await asyncio.wait({first}, timeout=0.2)
        if done:
            return notices
    pytest.fail("the watch told nothing in 20 s")


async def told(notices: AsyncIterator[Notice], count: int) -> list[Notice]:
    """The next count notices but markers (bounded wait)."""
    found: list[Notice] = []
    while len(found) < count:
        notice = await asyncio.wait_for(anext(notices), WAIT_S)
        if notice.key is None or not notice.key.endswith("/ready"):
            found.append(notice)
    return found


def test_notices_carry_values_and_deletions(opened: Callable[[str], EtcdBackend]) -> None:
    """A put's notice carries its value (a large one is read to know); a deletion's, None."""
    url = shared_etcd().url()
    writer, watcher = opened(url), opened(url)

    async def run() -> list[Notice]:
        notices = await watching(watcher, "w/")
        try:
            put(writer, "x/elsewhere", b"no")
            put(writer, "w/k", b"yes")
            put(writer, "w/big", bytes(100_000))
            writer.commit(Txn(writes=[DeleteRange("w/k")]))
            return await told(notices, 3)
        finally:
            await notices.aclose()

    assert asyncio.run(run()) == [Notice("w/k", b"yes"), Notice("w/big", None), Notice("w/k")]


Gate = tuple[threading.Event, threading.Event]


def hold_watch_setups(backend: EtcdBackend, monkeypatch: pytest.MonkeyPatch) -> Gate:
    """Renew the backend's watch streams every 0.2 s, each through a gate: (gate, held),
    held set while a renewal waits at the closed gate (its old stream already closed)."""
    monkeypatch.setattr(etcd_watch, "WATCH_RENEW_S", 0.2)
    gate, held = threading.Event(), threading.Event()
    gate.set()
    connection = backend._connection
    original = connection.client

    def client(index: int, read_timeout: float | None = None) -> Etcd3Client:
        if not gate.is_set():
            held.set()
            gate.wait(WAIT_S)
        return original(index, read_timeout)

    monkeypatch.setattr(connection, "client", client)
    return gate, held


def test_a_renewed_watch_replays_what_came_between(
    opened: Callable[[str], EtcdBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes made while no stream was open, deletions too, are told when one is again."""
    url = shared_etcd().url()
    writer, watcher = opened(url), opened(url)
    gate, held = hold_watch_setups(watcher, monkeypatch)
    put(writer, "w/gone", b"x")

    async def run() -> list[Notice]:
        notices = await watching(watcher, "w/")
        try:
            gate.clear()
            assert await asyncio.to_thread(held.wait, WAIT_S)
            put(writer, "w/new", b"n")
            writer.commit(Txn(writes=[DeleteRange("w/gone")]))
            gate.set()
            return await told(notices, 2)
        finally:
            await notices.aclose()

    assert asyncio.run(run()) == [Notice("w/new", b"n"), Notice("w/gone")]


def test_a_watch_gap_etcd_compacted_is_told_as_a_gap(
    private_server: Callable[[], EtcdServer],
    opened: Callable[[str], EtcdBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Changes etcd compacted away before a stream was open again come as Notice(None)."""
    server = private_server()
    url = server.url()
    writer, watcher = opened(url), opened(url)
    gate, held = hold_watch_setups(watcher, monkeypatch)
    raw = raw_client(server)

    async def run() -> list[Notice]:
        notices = await watching(watcher, "w/")
        try:
            gate.clear()
            assert await asyncio.to_thread(held.wait, WAIT_S)
            put(writer, "w/1", b"1")
            put(writer, "w/2", b"2")
            raw.post(raw.get_url("/kv/compaction"), json={"revision": revision(raw)})
            gate.set()
            gap = await told(notices, 1)
            put(writer, "w/3", b"3")
            return gap + await told(notices, 1)
        finally:
            await notices.aclose()

    assert asyncio.run(run()) == [Notice(None), Notice("w/3", b"3")]


def test_a_watch_goes_on_after_its_server_restarts(
    private_server: Callable[[], EtcdServer],
    opened: Callable[[str], EtcdBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watch whose stream broke (etcd restarted) tells the changes made after it."""
    monkeypatch.setattr(etcd_watch, "WATCH_RENEW_S", 0.5)
    server = private_server()
    url = server.url()
    writer, watcher = opened(url), opened(url)

    async def run() -> list[Notice]:
        notices = await watching(watcher, "w/")
        try:
            await asyncio.to_thread(server.restart)
            put(writer, "w/after", b"a")
            return await told(notices, 1)
        finally:
            await notices.aclose()

    assert asyncio.run(run()) == [Notice("w/after", b"a")]
