"""PostgresBackend beyond the backend contract: URLs, a server gone, frozen or crashed, what
a raw writer plants, commits that race hard, key order, and the watch across a restart.

The contract every backend keeps runs on PostgreSQL in test_backend_contract.py. Servers
listen on 127.0.0.1 only (tests/support/postgres_server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

psycopg = pytest.importorskip("psycopg")

from hamsterbunker.core.errors import ConfigError, StoreUnavailable  # noqa: E402 (after the importorskip)
from hamsterbunker.core.read_bounds import ReadBound  # noqa: E402
from hamsterbunker.stores.backend import (  # noqa: E402
    Compare,
    DeleteRange,
    Notice,
    Put,
    ScanResult,
    TooLarge,
    Txn,
    prefix_end,
)
from hamsterbunker.stores.backends.postgres import PostgresBackend  # noqa: E402
from hamsterbunker.stores.backends.postgres_connection import (  # noqa: E402
    connect,
    parse_postgres_url,
)
from hamsterbunker.stores.urls import redacted_url  # noqa: E402
from tests.support import each_ended, process_state, wait_until  # noqa: E402
from tests.support.postgres_server import PostgresServer, shared_postgres  # noqa: E402

WIDE = ReadBound(100, 1024, 100 * 1024)


@pytest.fixture
def private_server() -> Iterator[Callable[..., PostgresServer]]:
    """Start servers of this test's own (to stop, freeze or crash); all stopped at the end."""
    with each_ended(PostgresServer.start, PostgresServer.stop) as start:
        yield start


@pytest.fixture
def opened() -> Iterator[Callable[[str], PostgresBackend]]:
    """Open PostgresBackends; all closed at the end."""
    with each_ended(PostgresBackend, PostgresBackend.close) as open_one:
        yield open_one


def put(backend: PostgresBackend, key: str, value: bytes) -> None:
    assert backend.commit(Txn(writes=[Put(key, value)])).succeeded


# -- URLs ----------------------------------------------------------------------


def test_the_url_gives_table_and_timeout_and_libpq_the_rest() -> None:
    """table and timeout are ours; user, password, host, database and options go to libpq."""
    target = parse_postgres_url(
        "postgresql://u:p%40ss@db.example:6543/hb?table=prod&timeout=2.5&sslmode=disable"
    )
    assert (target.table, target.timeout) == ("prod", 2.5)
    assert psycopg.conninfo.conninfo_to_dict(target.conninfo) == {
        "user": "u", "password": "p@ss", "host": "db.example", "port": "6543", "dbname": "hb",
        "sslmode": "disable", "connect_timeout": "3", "application_name": "hamsterbunker",
    }  # fmt: skip
    several = parse_postgres_url("postgres://h1:5432,[::1]:5433/hb")
    assert (several.table, several.timeout) == ("hamsterbunker", 5.0)
    assert psycopg.conninfo.conninfo_to_dict(several.conninfo)["host"] == "h1,::1"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://u:s3cret@h/0", "not a postgresql://"),
        ("postgresql://u:s3cret@/db", "is not host:port"),
        ("postgresql://u:s3cret@h:99999/db", "is not host:port"),
        ("postgresql://u:s3cret@h/db/more", "one database name"),
        ("postgresql://u:s3/cret@h/db", "an @ after the host"),
        ("postgresql://u:s3cret%zz@h/db", "percent-encoding"),
        ("postgresql://u:s3cret@[::1/db", "not a URL"),
        ("postgresql://u:s3cret@h/db#top", "no #fragment"),
        ("postgresql://u:s3cret@h/db?table=Prod-1", "table must be"),
        ("postgresql://u:s3cret@h/db?timeout=0", "timeout must be"),
        ("postgresql://u:s3cret@h/db?timeout=soon", "timeout must be"),
        ("postgresql://u:s3cret@h/db?sslmode=sometimes", "sslmode must be"),
        ("postgresql://u:s3cret@h/db?sslrootcert=/nonexistent/ca.pem", "does not exist"),
        ("postgresql://u:s3cret@h/db?colour=blue", 'invalid URI query parameter: "colour"'),
        ("postgresql://u@h/db?password=s3cret&colour=blue", "colour"),
    ],
)
def test_a_bad_url_is_one_config_error_line_without_the_password(url: str, why: str) -> None:
    """A URL that cannot work is refused before any connection, in one line, no password in it."""
    with pytest.raises(ConfigError) as caught:
        PostgresBackend(url)
    message = str(caught.value)
    assert why in message
    assert "s3cret" not in message and "\n" not in message


def test_the_shown_url_keeps_table_and_tls_mode_and_hides_the_password() -> None:
    """The backend's url names its table and sslmode, never a password (it connects lazily)."""
    url = "postgresql://u:s3cret@127.0.0.1:1/db?table=prod&sslmode=disable&password=s3cret"
    assert PostgresBackend(url).url == (
        "postgresql://u:***@127.0.0.1:1/db?table=prod&sslmode=disable&password=***"
    )


# -- a server gone, frozen or crashed ------------------------------------------


def test_a_server_gone_is_store_unavailable_naming_the_store(
    private_server: Callable[..., PostgresServer], opened: Callable[[str], PostgresBackend]
) -> None:
    """Every call to a stopped server is StoreUnavailable naming the redacted URL, in one
    line; once it is back, the same client carries on, and what was committed is there."""
    server = private_server()
    url = server.url()
    backend = opened(url)
    put(backend, "a/k", b"kept")
    server.halt()
    calls: list[Callable[[], object]] = [
        backend.check,
        lambda: backend.get("a/k", 10),
        lambda: backend.scan("a/", WIDE),
        lambda: backend.commit(Txn(writes=[Put("a/k", b"lost")])),
        opened(url).check,  # a client that never reached it
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            call()
        message = str(caught.value)
        assert redacted_url(url) in message and server.password not in message
        assert "\n" not in message and time.monotonic() - started < 5
    server.start_again()
    backend.check()
    assert backend.get("a/k", 10) == b"kept"


def test_a_frozen_server_is_store_unavailable_within_the_timeout(
    private_server: Callable[..., PostgresServer], opened: Callable[[str], PostgresBackend]
) -> None:
    """A server that stops answering (SIGSTOP) gives StoreUnavailable after the URL's
    timeout, not a hang; the client works again once the server does."""
    server = private_server()
    backend = opened(server.url(query="timeout=0.5"))
    put(backend, "a/k", b"v")  # a pooled connection to a backend process that will freeze
    assert server.process is not None
    server.signal_all(signal.SIGSTOP)
    wait_until(lambda: process_state(server.process.pid) == "T", "the server to stop")
    for call in (lambda: backend.get("a/k", 10), lambda: backend.commit(Txn())):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"no answer within 0\.5 s|timeout expired"):
            call()
        assert time.monotonic() - started < 4.0
    server.signal_all(signal.SIGCONT)
    assert backend.get("a/k", 10) == b"v"


def test_a_commit_cut_off_midway_leaves_the_store_as_before(
    opened: Callable[[str], PostgresBackend],
) -> None:
    """A commit that outlives its timeout (here: waiting on a row a raw client locked) is
    StoreUnavailable, and none of its writes, made before the wait, is there."""
    server = shared_postgres()
    table = f"cut_off_{uuid.uuid4().hex}"
    backend = opened(server.url(table, query="timeout=0.5"))
    put(backend, "a/2", b"before")
    with psycopg.connect(server.raw_conninfo()) as raw:
        raw.execute(f"SELECT 1 FROM {table} WHERE key = 'a/2' FOR UPDATE")
        with pytest.raises(StoreUnavailable, match=r"no answer within 0\.5 s"):
            backend.commit(Txn(writes=[Put("a/1", b"after"), Put("a/2", b"after")]))
        raw.rollback()
    assert backend.get("a/1", 10) is None and backend.get("a/2", 10) == b"before"


def test_a_client_fallen_silent_inside_a_commit_stalls_no_other_commit(
    opened: Callable[[str], PostgresBackend],
) -> None:
    """A node cut off midway through a commit (a partition: the server hears nothing more,
    not even a close) leaves its transaction open, its rows locked: the server ends it
    after the URL's timeout, so the next node's commits to those rows go through, and
    none of the silent one's writes is kept."""
    server = shared_postgres()
    table = f"silent_{uuid.uuid4().hex}"
    url = server.url(table, query="timeout=0.5")
    backend = opened(url)
    put(backend, "a/2", b"before")
    silent = connect(parse_postgres_url(url))
    try:
        silent.execute("BEGIN")
        silent.execute(f"UPDATE {table} SET value = 'silent' WHERE key = 'a/2'")
        started, written = time.monotonic(), False
        while not written and time.monotonic() - started < 10:
            with contextlib.suppress(StoreUnavailable):  # waited on the silent one's lock
                written = backend.commit(Txn(writes=[Put("a/2", b"after")])).succeeded
        assert written, "a commit still stalled 10 s after the silent client's last word"
        assert time.monotonic() - started < 5
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            silent.execute("COMMIT")  # the server ended its session
    finally:
        silent.close()
    assert backend.get("a/2", 10) == b"after"


def test_commits_acknowledged_before_a_crash_are_all_there_and_none_by_halves(
    private_server: Callable[..., PostgresServer], opened: Callable[[str], PostgresBackend]
) -> None:
    """SIGKILL of the whole server while a client commits two keys at a time: after crash
    recovery both keys hold the same number, at least the last one acknowledged (the
    server's default is synchronous_commit off: the backend's own setting keeps them)."""
    server = private_server("synchronous_commit=off")
    backend = opened(server.url())
    killer = threading.Timer(0.05, server.kill)
    acknowledged = 0
    for n in range(1, 1_000_000):
        if n == 50:
            killer.start()
        try:
            backend.commit(Txn(writes=[Put("a/x", b"%d" % n), Put("a/y", b"%d" % n)]))
        except StoreUnavailable:
            break
        acknowledged = n
    killer.join(timeout=30)
    server.start_again()
    x, y = backend.get("a/x", 20), backend.get("a/y", 20)
    assert isinstance(x, bytes) and x == y and int(x) >= acknowledged >= 49


# -- what a raw writer plants ---------------------------------------------------


def test_planted_rows_never_make_a_read_pass_its_bound(
    opened: Callable[[str], PostgresBackend],
) -> None:
    """Huge values, over-long and non-ASCII keys and NULLs planted by a raw client: reads
    keep to their bounds, report huge values unread, and page on to the end."""
    server = shared_postgres()
    table = f"planted_{uuid.uuid4().hex}"
    backend = opened(server.url(table))
    put(backend, "p/0", b"fine")  # the table exists
    with psycopg.connect(server.raw_conninfo(), autocommit=True) as raw:
        raw.execute(f"ALTER TABLE {table} ALTER value DROP NOT NULL")
        raw.execute(
            f"INSERT INTO {table} SELECT 'p/' || lpad(i::text, 4, '0'), "
            f"convert_to(repeat('x', i * 97), 'UTF8') FROM generate_series(1, 300) AS i"
        )
        raw.execute(
            f"INSERT INTO {table} VALUES ('p/0050a', convert_to(repeat('y', 30000000), 'UTF8')),"
            f" ('p/' || repeat('k', 5000), 'long key'), ('p/\u00e9t\u00e9', 'not ascii'),"
            f" ('p/0100a', NULL)"
        )
    assert isinstance(backend.get("p/0050a", 1024 * 1024), TooLarge)
    assert backend.get("p/0100a", 10) is None
    for bound in (ReadBound(7, 5000, 20000), ReadBound(50, 2000, 10**6), ReadBound(3, 200, 300)):
        after, pages = "", 0
        while True:
            page = backend.scan("p/", bound, after)
            taken = [value for _key, value in page.items]
            assert len(taken) + len(page.too_large) <= bound.count
            assert all(len(v) <= bound.entry_bytes for v in taken)
            assert sum(map(len, taken)) <= bound.total_bytes
            assert all(t.size > bound.entry_bytes for t in page.too_large)
            keys = [key for key, _value in page.items] + [t.key for t in page.too_large]
            pages += 1
            if not page.more:
                break
            assert keys, "a scan that says more must take something, or it pages for ever"
            after = max(keys)
        assert pages < 400
    # A range delete takes the planted rows too (a key too long to notify included).
    backend.commit(Txn(writes=[DeleteRange("p/", prefix_end("p/"))]))
    assert backend.scan("p/", WIDE) == ScanResult()


def test_keys_sort_by_code_point_whatever_the_database_collation(
    opened: Callable[[str], PostgresBackend],
) -> None:
    """The test server's collation is ICU's en-US (lower case first, punctuation by its own
    order): the table's COLLATE "C" still lists keys in code point order."""
    backend = opened(shared_postgres().url())
    listed = ["a/-x", "a/.x", "a/0", "a/B", "a/_x", "a/a"]
    for key in reversed(listed):
        put(backend, key, b"v")
    assert [key for key, _value in backend.scan("a/", WIDE).items] == listed


# -- racing ---------------------------------------------------------------------


def test_hard_racing_commits_never_run_out_of_retries(
    opened: Callable[[str], PostgresBackend],
) -> None:
    """Eight clients each commit 25 times at once, every commit a compare-and-set of one
    counter plus a blind write of one hot key: SERIALIZABLE aborts many, none fails for good."""
    url = shared_postgres().url()
    clients = [opened(url) for _ in range(8)]
    put(clients[0], "a/counter", b"0")
    errors: list[BaseException] = []

    def add(client: PostgresBackend, name: str) -> None:
        try:
            for _ in range(25):
                while True:
                    now = client.get("a/counter", 20)
                    assert isinstance(now, bytes)
                    txn = Txn(
                        compares=[Compare("a/counter", now)],
                        writes=[
                            Put("a/counter", b"%d" % (int(now) + 1)),
                            Put("a/hot", name.encode()),
                        ],
                    )
                    if client.commit(txn).succeeded:
                        break
                client.commit(Txn(writes=[Put("a/hot", name.encode())]))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(c, f"c{i}")) for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert clients[0].get("a/counter", 20) == b"200"


def test_clients_making_the_table_at_once_all_succeed(
    opened: Callable[[str], PostgresBackend],
) -> None:
    """Eight clients of a new table calling at the same moment: each one's CREATE TABLE IF
    NOT EXISTS may race the others', and none fails for it."""
    url = shared_postgres().url()
    clients = [opened(url) for _ in range(8)]
    start, errors = threading.Barrier(8), []

    def first_call(client: PostgresBackend) -> None:
        start.wait(timeout=30)
        try:
            client.check()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=first_call, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors


# -- the watch ------------------------------------------------------------------


def test_a_watch_says_a_gap_after_the_server_restarts_then_hears_changes(
    private_server: Callable[..., PostgresServer], opened: Callable[[str], PostgresBackend]
) -> None:
    """A watch whose connection was lost says Notice(None) once it listens again (what
    changed meanwhile went unheard), then hears each changed key, deletions included."""
    server = private_server()
    url = server.url()
    writer, watcher = opened(url), opened(url)
    put(writer, "w/old", b"x")

    async def notices_across_a_restart() -> list[Notice]:
        notices = watcher.watch("w/")
        try:
            first = asyncio.ensure_future(anext(notices))
            await asyncio.sleep(0.3)  # the watch is in place
            await asyncio.to_thread(server.halt)
            await asyncio.to_thread(server.start_again)
            heard = [await asyncio.wait_for(first, timeout=30)]
            # Gaps while it cannot listen and once it can; then the changes it heard.
            for n in range(100):
                await asyncio.to_thread(put, writer, f"w/new{n}", b"y")
                heard.append(await asyncio.wait_for(anext(notices), timeout=30))
                if heard[-1].key is not None:
                    break
            await asyncio.to_thread(writer.commit, Txn(writes=[DeleteRange("w/old")]))
            while heard[-1].key != "w/old" and len(heard) < 300:
                heard.append(await asyncio.wait_for(anext(notices), timeout=30))
            return heard
        finally:
            await notices.aclose()

    heard = asyncio.run(notices_across_a_restart())
    assert heard[0] == Notice(None) and heard[-1] == Notice("w/old")
    assert all(n.key is None or n.key.startswith("w/new") for n in heard[1:-1])
