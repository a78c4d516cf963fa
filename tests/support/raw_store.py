"""Writing a store as someone without the secret would: raw bytes under the backend's own names.

Tests of hostile and damaged store contents need to put bytes where a node
reads them, past the store contract (which only writes what it validated).
``RawRecords`` writes a record-layer store (what file://, redis:// and etcd://
URLs open, the memory store too) through its backend, under the layer's keys
(``stores.layer.keys``), so the same test runs on every backend: ``BACKENDS``
and the ``backend_store`` fixture open one from a URL. ``raw_view`` gives the
same access to a store a test already opened, for the store contract suite.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import pytest

from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.records import CheckpointInfo
from hamsterbunker.stores import file_store_path, open_store
from hamsterbunker.stores.backend import Backend, DeleteRange, Put, Txn, key_problem, prefix_end
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import CLUSTER, AgentKeys

__all__ = [
    "BACKENDS",
    "RawRecords",
    "RawStore",
    "backend_store",
    "file_key",
    "file_keys",
    "raw_at",
    "raw_view",
]


class RawStore(Protocol):
    url: str

    def checkpoint(self, agent: str, seq: int, epoch: int) -> bytes: ...

    def put_checkpoint(self, agent: str, seq: int, epoch: int, data: bytes) -> None:
        """Store data as checkpoint (seq, epoch), listed as such: a new entry or an overwrite."""

    def put_lease(self, agent: str, data: bytes) -> None: ...

    def put_heartbeat(self, agent: str, node: str, data: bytes) -> None: ...

    def add_event(self, agent: str, node: str, data: bytes) -> None: ...

    def put_cluster(self, data: bytes) -> None: ...

    def put_acceptance(self, agent: str, data: bytes) -> None: ...

    def put_effect(self, agent: str, seq: int, index: int, kind: str, data: bytes) -> None:
        """Store data as the effect-journal record (seq, index, kind), read back as such."""

    def drop_effects(self, agent: str, seq: int) -> None:
        """Delete the effect journal of step seq (``rm -r agents/<agent>/effects`` and the like)."""

    def close(self) -> None: ...


class RawRecords:
    """A record-layer store's backend, written under the layer's keys (``stores.layer.keys``)."""

    def __init__(self, store: RecordStore | Backend, *, owned: bool = False) -> None:
        """Raw access to store's backend (a store a test opened), or to a backend; owned: the
        backend is this view's, closed with it."""
        self.backend = store.backend if isinstance(store, RecordStore) else store
        self.url = self.backend.url
        self._owned = owned

    def put(self, key: str, data: bytes) -> None:
        """Store data under key; under a name that is no backend key, as ``plant`` does."""
        if key_problem(key) is not None:
            self.plant(key, data)
            return
        assert self.backend.commit(Txn(writes=[Put(key, data)])).succeeded

    def plant(self, name: str, data: bytes) -> None:
        """Store data under name as a client writing the store directly would, where the
        backend's commit refuses a name that is no key (file: a file under ``kv/``; Redis:
        an index member and its value); the others store any name."""
        from hamsterbunker.stores.backends.file import FileBackend
        from hamsterbunker.stores.backends.redis import RedisBackend

        backend = self.backend
        if isinstance(backend, FileBackend):
            path = backend.root / "kv" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        elif isinstance(backend, RedisBackend):
            backend._redis.set(backend._values + name, data)
            backend._redis.zadd(backend._index, {name: 0})
        else:
            assert self.backend.commit(Txn(writes=[Put(name, data)])).succeeded

    def checkpoint(self, agent: str, seq: int, epoch: int) -> bytes:
        key = self._checkpoint_key(agent, seq, epoch)
        data = None if key is None else self.backend.get(key, 2**31)
        assert isinstance(data, bytes), f"no checkpoint {seq} of epoch {epoch} stored"
        return data

    def put_checkpoint(self, agent: str, seq: int, epoch: int, data: bytes) -> None:
        """data as checkpoint seq of epoch, in place of one stored (its time kept)."""
        keys = AgentKeys(agent)
        stored = self._checkpoint_key(agent, seq, epoch)
        was = None if stored is None else keys.checkpoint_info(stored)
        written = 0.0 if was is None else was.written
        info = CheckpointInfo(epoch=epoch, seq=seq, size=len(data), written=written)
        named = f"{keys.ckpt}{seq:020d}-{epoch:010d}-"
        writes = [DeleteRange(named, prefix_end(named)), Put(keys.checkpoint(info), data)]
        assert self.backend.commit(Txn(writes=writes)).succeeded

    def _checkpoint_key(self, agent: str, seq: int, epoch: int) -> str | None:
        """The key of checkpoint seq of epoch (its name says its size and time too)."""
        named = f"{AgentKeys(agent).ckpt}{seq:020d}-{epoch:010d}-"
        found = self.backend.scan(named, ReadBound(10, 0, 0))
        names = [key for key, _ in found.items] + [each.key for each in found.too_large]
        return min(names, default=None)

    def put_lease(self, agent: str, data: bytes) -> None:
        self.put(AgentKeys(agent).lease, data)

    def put_heartbeat(self, agent: str, node: str, data: bytes) -> None:
        self.put(AgentKeys(agent).beat(node), data)

    def add_event(self, agent: str, node: str, data: bytes) -> None:
        self.put(AgentKeys(agent).event(node, 10**15 + uuid.uuid4().int % 10**15), data)

    def put_cluster(self, data: bytes) -> None:
        self.put(CLUSTER, data)

    def put_acceptance(self, agent: str, data: bytes) -> None:
        self.put(AgentKeys(agent).acceptance, data)

    def put_effect(self, agent: str, seq: int, index: int, kind: str, data: bytes) -> None:
        keys = AgentKeys(agent)
        self.put(f"{keys.step(seq)}{index:04d}-{kind}", data)

    def drop_effects(self, agent: str, seq: int) -> None:
        step = AgentKeys(agent).step(seq)
        self.backend.commit(Txn(writes=[DeleteRange(step, prefix_end(step))]))

    def close(self) -> None:
        if self._owned:
            self.backend.close()


def raw_view(store: Store) -> RawStore:
    """Raw access to store, a client a test opened (closing the view leaves it open)."""
    if isinstance(store, RecordStore):
        return RawRecords(store)
    raise AssertionError(f"no raw view of {store!r}")


def file_key(root: Path, key: str) -> Path:
    """The file in which a file store at root keeps key (``stores.backends.file``)."""
    return root / "kv" / key


def file_keys(root: Path) -> list[str]:
    """Every key a file store at root holds (none in a store opened but never written)."""
    kv = root / "kv"
    return sorted(str(p.relative_to(kv)) for p in kv.rglob("*") if not p.is_dir())


def raw_at(url: str) -> RawRecords:
    """Raw access to the record-layer store a file://, redis:// or etcd:// URL names, through
    a backend client of its own (closed with the view)."""
    scheme = urlsplit(url).scheme
    backend: Backend
    if scheme == "file":
        from hamsterbunker.stores.backends.file import FileBackend

        backend = FileBackend(file_store_path(url))
    elif scheme in ("redis", "rediss"):
        from hamsterbunker.stores.backends.redis import RedisBackend

        backend = RedisBackend(url)
    else:
        from hamsterbunker.stores.backends.etcd import EtcdBackend

        assert scheme in ("etcd", "etcds"), f"no raw access to {url}"
        backend = EtcdBackend(url)
    return RawRecords(backend, owned=True)


def _file(tmp_path: Path) -> RawStore:
    return raw_at((tmp_path / "store").as_uri())


def _redis(tmp_path: Path) -> RawStore:
    from .redis_server import redis_url

    return raw_at(redis_url())


def _etcd(tmp_path: Path) -> RawStore:
    from .etcd_server import etcd_url

    return raw_at(etcd_url())


BACKENDS: dict[str, Callable[[Path], RawStore]] = {"file": _file, "redis": _redis, "etcd": _etcd}


@pytest.fixture(params=list(BACKENDS))
def backend_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RawStore]:
    """A fresh, empty store of each backend (by URL), with raw access to its contents."""
    raw = BACKENDS[request.param](tmp_path)
    open_store(raw.url).close()  # a file store's directory exists from here on
    try:
        yield raw
    finally:
        raw.close()
