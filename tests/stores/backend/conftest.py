"""Backends for the backend contract suite (test_backend_contract.py).

Every test runs once per entry of ``BACKENDS``: a factory that gets the test's
tmp_path and returns an *opener*, a callable opening another independent client
on one backend that is empty at the start of the test (its own connection or
file descriptors wherever the backend allows, so that races in the suite are
races between real clients). A factory that cannot run here (no server) skips,
except in CI, where the server helpers fail instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hamsterbunker.stores.backend import Backend
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.stores.backends.memory import MemoryBackend
from hamsterbunker.stores.backends.redis import RedisBackend
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

Opener = Callable[[], Backend]


def _memory(tmp_path: Path) -> Opener:
    shared = MemoryBackend()
    return lambda: shared  # one process only: every client is the same object


def _file(tmp_path: Path) -> Opener:
    return lambda: FileBackend(tmp_path / "store")  # each client its own descriptors


def _redis(tmp_path: Path) -> Opener:
    url = redis_url()  # a fresh prefix on the session's server: empty
    return lambda: RedisBackend(url)


def _etcd(_tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.etcd import EtcdBackend  # needs the etcd extra

    url = etcd_url()  # the session's server, under a prefix of this test's own
    return lambda: EtcdBackend(url)


def _postgres(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.backends.postgres import PostgresBackend
    from tests.support.postgres_server import postgres_url

    url = postgres_url()  # a table of its own on the session's server
    return lambda: PostgresBackend(url)


BACKENDS: dict[str, Callable[[Path], Opener]] = {
    "memory": _memory,
    "file": _file,
    "redis": _redis,
    "etcd": _etcd,
    "postgres": _postgres,
}
# The backends whose records outlive every client (a reopened client reads them).
DURABLE: set[str] = {"file", "redis", "etcd", "postgres"}


@pytest.fixture(params=list(BACKENDS))
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Open another independent client on this test's backend (closed at teardown)."""
    opener = BACKENDS[request.param](tmp_path)
    opened: list[Backend] = []

    def open_one() -> Backend:
        client = opener()
        opened.append(client)
        return client

    yield open_one
    for client in opened:
        client.close()


@pytest.fixture
def backend_name(request: pytest.FixtureRequest, open_backend: Opener) -> str:
    name: str = request.node.callspec.params["open_backend"]
    return name


@pytest.fixture
def backend(open_backend: Opener) -> Backend:
    """The first client on this test's (empty) backend."""
    return open_backend()
