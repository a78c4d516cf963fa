"""Backends for the store contract suite (tests/stores/contract/test_store_contract.py).

Every test in the suite runs once per backend named in ``BACKENDS``. Adding a
backend means writing one factory and adding it to that dict:

    def _records_etcd(tmp_path: Path) -> Opener:
        url = etcd_url()                   # a fresh, empty prefix per test
        return _on(lambda: EtcdBackend(url))   # the record layer over a new client

A factory gets the test's tmp_path and returns an *opener*: a callable that
opens a new, independent client on one underlying store, empty at the start
of the test. Each call must be a separate client (its own connection, its own
file descriptors) wherever the backend allows it, so that races between the
clients in the suite are races between real clients. A factory that cannot
run here (no server) should call ``pytest.skip``.

Three more tables hold what only some backends have, each keyed by backend:
``GONE`` (a store that can be taken away: a server stopped, a directory
removed), ``SPACES`` (stores side by side under prefixes, with a raw view of
every key) and ``BAD_URLS``. The memory store has none of these.

The suite relies on three small bounds, which each factory must configure:
``KEEP_CHECKPOINTS`` retained checkpoints, ``KEEP_REPLIES`` kept consumed
submissions, and an event log per node that
keeps at least ``EVENT_BOUND`` and at most ``2 * EVENT_BOUND`` of the newest
events.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hamsterbunker.stores.backend import Backend
from hamsterbunker.stores.interface import Store
from hamsterbunker.testing import MemoryStore

Opener = Callable[[], Store]

KEEP_CHECKPOINTS = 3
EVENT_BOUND = 10
KEEP_REPLIES = 4


def _memory(tmp_path: Path) -> Opener:
    shared = MemoryStore(
        keep_checkpoints=KEEP_CHECKPOINTS, events_per_node=EVENT_BOUND, keep_replies=KEEP_REPLIES
    )
    # One process only: every "client" is the same object, raced from threads.
    return lambda: shared


def _on(open_backend: Callable[[], Backend]) -> Opener:
    """An opener of record-layer clients, each over a backend client open_backend opens."""
    from hamsterbunker.stores.layer import RecordStore

    return lambda: RecordStore(
        open_backend(),
        keep_checkpoints=KEEP_CHECKPOINTS,
        events_per_node=EVENT_BOUND,
        keep_replies=KEEP_REPLIES,
    )


def _records_memory(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.memory import MemoryBackend

    backend = MemoryBackend()  # one map; each client its own record layer on it
    return _on(lambda: backend)


def _records_file(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.file import FileBackend

    # A generous lock timeout: eight racing clients fsync while holding the lock,
    # and a slow CI disk must not turn a lost race into StoreUnavailable.
    return _on(lambda: FileBackend(tmp_path / "records", lock_timeout=30.0))


def _records_redis(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.redis import RedisBackend
    from tests.support.redis_server import redis_url

    # Generous timeouts, as the file store's lock timeout above: the bound tests plant and
    # read tens of MiB, which a loaded CI machine may take seconds to move.
    url = redis_url("socket_timeout=30")
    return _on(lambda: RedisBackend(url))


def _records_etcd(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.etcd import EtcdBackend
    from tests.support.etcd_server import etcd_url

    url = etcd_url("timeout=30")  # as records-redis' timeout
    return _on(lambda: EtcdBackend(url))


def _records_postgres(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.postgres import PostgresBackend
    from tests.support.postgres_server import postgres_url

    url = postgres_url()
    return _on(lambda: PostgresBackend(url))


BACKENDS: dict[str, Callable[[Path], Opener]] = {
    "memory": _memory,
    "records-memory": _records_memory,
    "records-file": _records_file,
    "records-redis": _records_redis,
    "records-etcd": _records_etcd,
    "records-postgres": _records_postgres,
}


@pytest.fixture(params=list(BACKENDS))
def open_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Open another independent client on this test's store (closed at teardown)."""
    opener = BACKENDS[request.param](tmp_path)
    opened: list[Store] = []

    def open_one() -> Store:
        client = opener()
        opened.append(client)
        return client

    yield open_one
    for client in opened:
        client.close()


# The backends whose lease watch yields the record each change carries (etcd's watch
# events, Redis' messages); the others yield None, a hint to read.
CARRIES_LEASE = {"memory", "records-etcd", "records-memory", "records-redis"}
# The backends whose take_lease reads for the restore in the same atomic step.
READS_AS_IT_TAKES = {"memory", "records-memory", "records-file", "records-redis", "records-etcd",
                     "records-postgres"}  # fmt: skip


@pytest.fixture
def backend(request: pytest.FixtureRequest, open_client: Opener) -> str:
    """The name of this test's backend (a key of BACKENDS)."""
    name: str = request.node.callspec.params["open_client"]
    return name


@pytest.fixture
def store(open_client: Opener) -> Store:
    """The first client on this test's (empty) store."""
    return open_client()


@pytest.fixture
def open_second(open_client: Opener) -> Opener:
    """Open a second (third, ...) independent client on the same store as ``store``."""
    return open_client


# -- a store that can be taken away -------------------------------------------------


@dataclass(frozen=True)
class Gone:
    """A store of this test's own, and how to take it away under its client."""

    store: Store
    take_away: Callable[[], None]
    # What each StoreUnavailable must say (re.search): the store and the reason.
    says: str
    # Whether every call fails once it is gone, not only check(): a networked store's
    # server, and the file store's directory (never read as an empty store).
    every_call_fails: bool


def _records_file_gone(tmp_path: Path, ended: contextlib.ExitStack) -> Gone:
    from hamsterbunker.stores.layer.files import FileStore as RecordFileStore

    root = tmp_path / "gone"
    store = RecordFileStore(root)
    ended.callback(store.close)
    return Gone(
        store,
        lambda: shutil.rmtree(root),
        says=f"^store directory {root}: No such file or directory$",
        every_call_fails=True,
    )


def _redis_gone(tmp_path: Path, ended: contextlib.ExitStack) -> Gone:
    from hamsterbunker.stores.backends.redis import RedisBackend
    from tests.support.redis_server import RedisServer
    from tests.support.server_process import stop_thawed

    server = RedisServer.start()
    ended.callback(stop_thawed, server)
    store = _on(lambda: RedisBackend(server.url()))()
    ended.callback(store.close)
    return Gone(store, server.stop, says="redis store", every_call_fails=True)


def _etcd_gone(tmp_path: Path, ended: contextlib.ExitStack) -> Gone:
    from hamsterbunker.stores.backends.etcd import EtcdBackend
    from tests.support.etcd_server import EtcdServer
    from tests.support.server_process import stop_thawed

    server = EtcdServer.start()
    ended.callback(stop_thawed, server)
    store = _on(lambda: EtcdBackend(server.url()))()
    ended.callback(store.close)
    return Gone(
        store,
        server.stop,
        says="etcd store.*: cannot connect: Connection refused$",  # the reason, in words
        every_call_fails=True,
    )


GONE: dict[str, Callable[[Path, contextlib.ExitStack], Gone]] = {
    "records-file": _records_file_gone,
    "redis": _redis_gone,
    "etcd": _etcd_gone,
}


@pytest.fixture(params=list(GONE))
def gone(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gone]:
    """A store of this test's own (a private server, a directory), still there."""
    with contextlib.ExitStack() as ended:
        yield GONE[request.param](tmp_path, ended)


# -- stores side by side under prefixes -------------------------------------------------


@dataclass(frozen=True)
class Spaces:
    """Stores under named prefixes in one shared space, and a raw view of that space."""

    open: Callable[[str], Store]  # a store under the prefix named
    keys: Callable[[], list[str]]  # every key (file: every file path) in the space
    agent_prefix: Callable[[str, str], str]  # (prefix name, agent): where its keys start
    prefix: Callable[[str], str]  # prefix name: where all of its keys start
    # (prefix name, agent): the keys of an agent's outside its prefix (its entry in the index
    # of agents) and the backend's own (a lock, a log, an index of keys).
    beside: Callable[[str, str], set[str]] = lambda _name, _agent: set()


def _records_file_spaces(tmp_path: Path, ended: contextlib.ExitStack) -> Spaces:
    from hamsterbunker.stores.layer.files import FileStore

    space = tmp_path / "space"  # the store's root is its prefix: stores side by side
    space.mkdir()

    def opened(name: str) -> Store:
        store = FileStore(space / name)
        ended.callback(store.close)
        return store

    def keys() -> list[str]:
        return sorted(
            os.path.relpath(os.path.join(folder, name), space)
            for folder, _dirs, names in os.walk(space)
            for name in names
        )

    return Spaces(
        open=opened,
        keys=keys,
        agent_prefix=lambda name, agent: f"{name}/kv/agents/{agent}/",
        prefix=lambda name: f"{name}/",
        beside=lambda name, agent: {f"{name}/kv/index/{agent}", f"{name}/.lock", f"{name}/.redo"},
    )


def _redis_spaces(tmp_path: Path, ended: contextlib.ExitStack) -> Spaces:
    import redis

    from hamsterbunker.stores.backends.redis import RedisBackend
    from tests.support.redis_server import shared_redis

    server = shared_redis()
    db = 7  # this test's own database on the shared server: every key in it is ours
    raw = redis.Redis(host="127.0.0.1", port=server.port, db=db)
    raw.flushdb()
    ended.callback(raw.close)
    ended.callback(raw.flushdb)

    def opened(name: str) -> Store:
        store = _on(lambda: RedisBackend(server.url(prefix=name, db=db)))()
        ended.callback(store.close)
        return store

    return Spaces(
        open=opened,
        keys=lambda: sorted(key.decode() for key in raw.keys("*")),
        agent_prefix=lambda name, agent: f"{{{name}}}:k:agents/{agent}/",
        prefix=lambda name: f"{{{name}}}:",
        beside=lambda name, agent: {f"{{{name}}}:k:index/{agent}", f"{{{name}}}:index"},
    )


def _etcd_spaces(tmp_path: Path, ended: contextlib.ExitStack) -> Spaces:
    from etcd3gw.client import Etcd3Client

    from hamsterbunker.stores.backends.etcd import EtcdBackend
    from tests.support.etcd_server import shared_etcd

    server = shared_etcd()
    base = f"hb-test/{time.monotonic_ns()}"  # this test's own: every key below it is ours
    raw = Etcd3Client(host="127.0.0.1", port=server.port, timeout=5, api_path="/v3/")

    def opened(name: str) -> Store:
        store = _on(lambda: EtcdBackend(server.url(prefix=f"{base}/{name}")))()
        ended.callback(store.close)
        return store

    return Spaces(
        open=opened,
        keys=lambda: sorted(meta["key"].decode() for _v, meta in raw.get_prefix(f"/{base}/")),
        agent_prefix=lambda name, agent: f"/{base}/{name}/agents/{agent}/",
        prefix=lambda name: f"/{base}/{name}/",
        beside=lambda name, agent: {f"/{base}/{name}/index/{agent}"},
    )


SPACES: dict[str, Callable[[Path, contextlib.ExitStack], Spaces]] = {
    "records-file": _records_file_spaces,
    "redis": _redis_spaces,
    "etcd": _etcd_spaces,
}


@pytest.fixture(params=list(SPACES))
def spaces(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Spaces]:
    with contextlib.ExitStack() as ended:
        yield SPACES[request.param](tmp_path, ended)


# -- URLs no store can be opened with ------------------------------------------------------

# backend -> {test id: URL}. Each is refused at open, before any connection is tried.
BAD_URLS: dict[str, dict[str, str]] = {
    "file": {
        "remote-host": "file://host/srv/store",
        "relative-path": "file:relative/dir",
    },
    "redis": {
        "no-host": "redis://",
        "bad-port": "redis://127.0.0.1:notaport/0",
        "bad-db": "redis://127.0.0.1:6379/zero",
        "bad-prefix": "redis://127.0.0.1:6379/0?prefix=../x",
        "unknown-option": "redis://127.0.0.1:6379/0?no_such_option=1",
        "bad-value": "redis://127.0.0.1:6379/0?socket_timeout=soon",
        "tls-file-missing": "rediss://127.0.0.1:6379/0?ssl_certfile=/no/such/client.crt",
        "tls-directory-missing": "rediss://127.0.0.1:6379/0?ssl_ca_path=/no/such/directory",
        "tls-option-without-rediss": "redis://127.0.0.1:6379/0?ssl_ca_certs=/etc/hostname",
    },
    "etcd": {
        "no-prefix": "etcd://127.0.0.1:2379",
        "root-prefix": "etcd://127.0.0.1:2379/",
        "bad-port": "etcd://127.0.0.1:port/p",
        "port-out-of-range": "etcd://127.0.0.1:99999/p",
        "bare-ipv6": "etcd://::1:2379/p",
        "empty-endpoint": "etcd://127.0.0.1:2379,/p",
        "password": "etcd://user:pw@127.0.0.1/p",
        "tls-option-without-etcds": "etcd://127.0.0.1/p?ca=/etc/hostname",
        "cert-without-key": "etcds://127.0.0.1/p?cert=/etc/hostname",
        "missing-ca-file": "etcds://127.0.0.1/p?ca=/no/such/ca.pem",
        "unknown-option": "etcd://127.0.0.1/p?bogus=1",
        "bad-timeout": "etcd://127.0.0.1/p?timeout=soon",
        "zero-timeout": "etcd://127.0.0.1/p?timeout=0",
    },
}

# backend -> how a password goes into its URLs, for those that take one: it is never shown.
WITH_PASSWORD: dict[str, Callable[[str], str]] = {
    "redis": lambda url: url.replace("redis://", "redis://user:s3cret@", 1),
}
