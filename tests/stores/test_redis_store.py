"""A Redis store beyond the shared contract: URLs, a dead or frozen server, TLS, connections.

The contract every backend keeps runs on Redis in tests/stores/contract; this file
checks what only a Redis-backed store can get wrong. Servers listen on
127.0.0.1 only (tests/support/redis_server.py).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

redis = pytest.importorskip("redis")

from hamsterbunker.core.errors import (  # noqa: E402 (after the importorskip)
    ConfigError,
    Fenced,
    StoreError,
    StoreUnavailable,
)
from hamsterbunker.stores import open_store  # noqa: E402
from hamsterbunker.stores.backends.redis import RedisBackend  # noqa: E402
from hamsterbunker.stores.backends.redis_connection import parse_redis_url  # noqa: E402
from hamsterbunker.stores.base import Fence  # noqa: E402
from hamsterbunker.stores.interface import Store  # noqa: E402
from hamsterbunker.stores.layer import RecordStore  # noqa: E402
from tests.support import each_ended, process_state, wait_until  # noqa: E402
from tests.support.records import lease  # noqa: E402
from tests.support.records import network_event as event  # noqa: E402
from tests.support.records import network_heartbeat as heartbeat  # noqa: E402
from tests.support.redis_server import RedisServer, mutual_tls_args, redis_url  # noqa: E402
from tests.support.server_process import free_port, stop_thawed  # noqa: E402
from tests.support.store_watch import next_wake  # noqa: E402
from tests.support.tls_certs import make_certificates  # noqa: E402

# -- helpers -----------------------------------------------------------------


@pytest.fixture
def private_server() -> Iterator[Callable[..., RedisServer]]:
    """Start servers of this test's own (to stop, freeze or configure); all stopped at the end."""
    with each_ended(RedisServer.start, stop_thawed) as start:
        yield start


def _record_store(url: str, **settings: Any) -> RecordStore:
    return RecordStore(RedisBackend(url), **settings)


@pytest.fixture
def opened() -> Iterator[Callable[..., RecordStore]]:
    """Open record-layer stores on Redis backends; all closed at the end."""
    with each_ended(_record_store, RecordStore.close) as open_one:
        yield open_one


@pytest.fixture
def by_url() -> Iterator[Callable[..., Store]]:
    """Open stores by URL, as hb does (``open_store``: the record layer); closed at the end."""
    with each_ended(open_store, Store.close) as open_one:
        yield open_one


# -- URLs ----------------------------------------------------------------------


def test_url_gives_prefix_database_and_redis_options() -> None:
    """The prefix is ours; db, credentials and every other option are left to redis-py."""
    client_url, prefix = parse_redis_url(
        "redis://u:p%40ss@127.0.0.1:6390/3?prefix=prod&socket_timeout=0.5"
    )
    assert prefix == "prod"
    assert client_url == "redis://u:p%40ss@127.0.0.1:6390/3?socket_timeout=0.5"
    assert parse_redis_url("redis://127.0.0.1")[1] == "hamsterbunker"


def test_rediss_url_passes_the_certificates_to_redis_py(tmp_path: Path) -> None:
    """rediss:// with ssl_ca_certs, ssl_certfile and ssl_keyfile makes TLS connections with them."""
    certs = make_certificates(tmp_path)  # the files are loaded at open: they must be real ones
    ca, cert, key = (str(certs[name]) for name in ("ca.crt", "client.crt", "client.key"))
    url = f"rediss://127.0.0.1:1/0?ssl_ca_certs={ca}&ssl_certfile={cert}&ssl_keyfile={key}"
    store = RedisBackend(url)
    try:
        pool = store._redis.connection_pool
        assert pool.connection_class is redis.SSLConnection
        options = pool.connection_kwargs
        assert (options["ssl_ca_certs"], options["ssl_certfile"], options["ssl_keyfile"]) == (
            ca,
            cert,
            key,
        )
    finally:
        store.close()


def test_password_is_not_shown(private_server: Callable[..., RedisServer]) -> None:
    """store.url and errors show the password as ***; a wrong one is a StoreError."""
    server = private_server("--requirepass", "s3cret")
    store = open_store(f"redis://:s3cret@127.0.0.1:{server.port}/0?prefix=p")
    try:
        assert "s3cret" not in store.url and "***" in store.url
        assert store.read_lease("a") is None
    finally:
        store.close()
    wrong = open_store(f"redis://:nope@127.0.0.1:{server.port}/0?prefix=p")
    try:
        with pytest.raises(StoreError) as caught:
            wrong.read_lease("a")
        assert "nope" not in str(caught.value)
    finally:
        wrong.close()


def test_missing_redis_py_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without redis-py, a redis:// URL tells how to install it."""
    monkeypatch.setitem(sys.modules, "redis", None)
    for name in [n for n in sys.modules if n.startswith("hamsterbunker.stores.backends.redis")]:
        monkeypatch.delitem(sys.modules, name)  # the backend and its connection module
    with pytest.raises(ConfigError, match=r"hamsterbunker\[redis\]"):
        open_store("redis://127.0.0.1:6379/0")


# -- a server that is gone or frozen ---------------------------------------------


def test_frozen_server_is_store_unavailable_within_the_socket_timeout(
    private_server: Callable[..., RedisServer], opened: Callable[..., RecordStore]
) -> None:
    """A server that stops answering (SIGSTOP) gives StoreUnavailable after socket_timeout, not a hang."""
    server = private_server()
    store = opened(server.url(query="socket_timeout=0.3&socket_connect_timeout=0.3"))
    store.cas_lease("a", None, lease("n1", 1))
    server.process.send_signal(signal.SIGSTOP)
    # Stopping the server takes a moment: a call before that is answered.
    wait_until(lambda: process_state(server.process.pid) == "T", "the server to stop")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.read_lease("a")
    assert time.monotonic() - started < 3.0
    server.process.send_signal(signal.SIGCONT)


def test_watch_outlives_a_server_restart(
    private_server: Callable[..., RedisServer], opened: Callable[..., RecordStore]
) -> None:
    """A watch whose server restarts reconnects and wakes again (it never raises)."""
    server = private_server()
    store, writer = opened(server.url(prefix="p")), opened(server.url(prefix="p"))

    async def main() -> None:
        watcher = store.watch("a", lease_only=True)
        try:
            await next_wake(watcher, writer)
            server.stop()
            private_server(port=server.port)  # the same address, empty again
            await next_wake(watcher, writer)
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


# -- TLS -------------------------------------------------------------------------


def test_rediss_with_client_certificates(
    tmp_path: Path,
    private_server: Callable[..., RedisServer],
    opened: Callable[..., RecordStore],
) -> None:
    """Over TLS with client certificates the store works; without them, or with a wrong CA, it refuses."""
    certs = make_certificates(tmp_path)
    tls_port = free_port()
    private_server(*mutual_tls_args(tls_port, certs))
    base = f"rediss://127.0.0.1:{tls_port}/0?prefix=tls&socket_timeout=2"
    client = f"&ssl_certfile={certs['client.crt']}&ssl_keyfile={certs['client.key']}"
    store = opened(f"{base}&ssl_ca_certs={certs['ca.crt']}{client}")
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"sealed")
    assert [i.seq for i in store.list_checkpoints("a")] == [1]
    writer = opened(f"{base}&ssl_ca_certs={certs['ca.crt']}{client}")

    async def watch_once() -> None:
        watcher = store.watch("a")
        try:
            await next_wake(watcher, writer)
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(watch_once())
    assert store.read_lease("a") != held

    no_client_cert = opened(f"{base}&ssl_ca_certs={certs['ca.crt']}")
    with pytest.raises(StoreError):
        no_client_cert.read_lease("a")
    wrong_ca = opened(f"{base}&ssl_ca_certs={certs['other-ca.crt']}{client}")
    with pytest.raises(StoreError) as refused:  # a setting to fix, not an outage to wait out
        wrong_ca.read_lease("a")
    assert not isinstance(refused.value, StoreUnavailable)


# -- fencing, settings -------------------------------------------------------------


def test_fenced_error_names_the_current_holder(opened: Callable[..., RecordStore]) -> None:
    """Fenced says which epoch and node the lease has moved to."""
    store = opened(redis_url())
    first = store.cas_lease("a", None, lease("n1", 1))
    store.cas_lease("a", first.version, lease("n2", 2, session="s2"))
    with pytest.raises(Fenced, match="epoch 2 held by n2"):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"late")


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ((), "appendonly is off"),
        (("--appendonly", "yes", "--appendfsync", "everysec"), "appendfsync is everysec"),
        (("--appendonly", "yes", "--appendfsync", "always"), None),
        (
            ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "allkeys-lru"),
            "may evict",
        ),
        (("--rename-command", "CONFIG", ""), "cannot read the server's persistence settings"),
    ],
    ids=["no-aof", "everysec", "always", "allkeys-lru", "config-disabled"],
)
def test_persistence_settings_are_warned_about(
    private_server: Callable[..., RedisServer],
    opened: Callable[..., RecordStore],
    settings: tuple[str, ...],
    warned: str | None,
) -> None:
    """Settings that can lose acknowledged checkpoints (or that we cannot read) give a warning."""
    store = opened(private_server(*settings).url())
    if warned is None:
        assert store.warnings == []
    else:
        assert len(store.warnings) == 1 and warned in store.warnings[0], store.warnings


# -- the monitor -------------------------------------------------------------------


def test_monitor_follows_a_redis_store(by_url: Callable[..., Store]) -> None:
    """hb-tui's monitor shows a Redis store's holder and events, and follows new ones."""
    pytest.importorskip("textual")
    from hamsterbunker_tui.app import MonitorApp

    from tests.tui.screen import screen_text, until

    url = redis_url()
    store = by_url(url)
    store.cas_lease("a", None, replace(lease("n1", 1), ttl_ms=60_000))
    store.put_heartbeat("a", replace(heartbeat("n1"), role="active", time=time.time()))
    store.append_event("a", event("n1", 1))

    async def scenario() -> None:
        app = MonitorApp(by_url(url, create=False), "a")
        async with app.run_test(size=(150, 45)) as pilot:
            await until(pilot, "the holder", lambda: "holder  n1" in screen_text(app))
            assert "agent.step" in screen_text(app)
            store.append_event("a", replace(event("n1", 2), type="lease.renew_failed"))
            await until(pilot, "the new event", lambda: "lease.renew_failed" in screen_text(app))

    asyncio.run(scenario())


def test_more_concurrent_calls_than_connections_wait_for_one_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch, private_server: Callable[..., RedisServer]
) -> None:
    """A process keeping many agents calls one client from many threads: the client keeps
    at most MAX_CONNECTIONS open, and past that a call waits for one. Against a server
    that takes 4 clients, a client opening one per thread would be refused."""
    import threading

    from hamsterbunker.stores.backends import redis_connection as connection

    monkeypatch.setattr(connection, "MAX_CONNECTIONS", 2)
    server = private_server("--maxclients", "4")
    store = open_store(f"redis://127.0.0.1:{server.port}/0")
    store.cas_lease("a", None, lease("n1", 1))
    failures: list[BaseException] = []

    def read_many() -> None:
        try:
            for _ in range(30):
                assert store.read_lease("a") is not None
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=read_many) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    store.close()
    assert failures == []
