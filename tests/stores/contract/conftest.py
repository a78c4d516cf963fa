"""Backends for the store contract suite (tests/stores/contract/test_store_contract.py).

Every test in the suite runs once per backend named in ``BACKENDS``. Adding a
backend (etcd, Redis) means writing one factory and adding it to that dict:

    def _etcd(tmp_path: Path) -> Opener:
        prefix = f"/hb-test/{uuid.uuid4().hex}"      # fresh, empty store per test
        return lambda: EtcdStore(ETCD_URL, prefix=prefix,
                                 keep_checkpoints=KEEP_CHECKPOINTS, ...)

A factory gets the test's tmp_path and returns an *opener*: a callable that
opens a new, independent client on one underlying store, empty at the start
of the test. Each call must be a separate client (its own connection, its own
file descriptors) wherever the backend allows it, so that races between the
clients in the suite are races between real clients. A factory that cannot
run here (no server) should call ``pytest.skip``.

The suite relies on two small bounds, which each factory must configure:
``KEEP_CHECKPOINTS`` retained checkpoints, and an event log per node that
keeps at least ``EVENT_BOUND`` and at most ``2 * EVENT_BOUND`` of the newest
events (a segmented log may keep a partial second segment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hamsterbunker.stores.base import Store
from hamsterbunker.stores.file import FileStore
from hamsterbunker.testing import MemoryStore

Opener = Callable[[], Store]

KEEP_CHECKPOINTS = 3
EVENT_BOUND = 10


def _file(tmp_path: Path) -> Opener:
    root = tmp_path / "store"
    # A generous lock timeout: eight racing clients fsync while holding the lock,
    # and a slow CI disk must not turn a lost race into StoreUnavailable.
    return lambda: FileStore(
        root,
        keep_checkpoints=KEEP_CHECKPOINTS,
        events_per_segment=EVENT_BOUND,
        lock_timeout=30.0,
    )


def _memory(tmp_path: Path) -> Opener:
    shared = MemoryStore(keep_checkpoints=KEEP_CHECKPOINTS, events_per_node=EVENT_BOUND)
    # One process only: every "client" is the same object, raced from threads.
    return lambda: shared


def _redis(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.redis import RedisStore

    from ..redis_server import redis_url

    url = redis_url()  # the session's redis-server, under a prefix of this test's own
    return lambda: RedisStore(url, keep_checkpoints=KEEP_CHECKPOINTS, events_per_node=EVENT_BOUND)


def _etcd(tmp_path: Path) -> Opener:
    from hamsterbunker.stores.etcd import EtcdStore

    from ..etcd_server import etcd_url

    url = etcd_url()  # the session's etcd, under a prefix of this test's own
    return lambda: EtcdStore(url, keep_checkpoints=KEEP_CHECKPOINTS, events_per_node=EVENT_BOUND)


BACKENDS: dict[str, Callable[[Path], Opener]] = {
    "file": _file,
    "memory": _memory,
    "redis": _redis,
    "etcd": _etcd,
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


@pytest.fixture
def store(open_client: Opener) -> Store:
    """The first client on this test's (empty) store."""
    return open_client()


@pytest.fixture
def open_second(open_client: Opener) -> Opener:
    """Open a second (third, ...) independent client on the same store as ``store``."""
    return open_client
