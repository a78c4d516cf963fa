"""FileStore behaviour beyond the shared contract: files on disk, look-alikes, sync folders, locks.

The contract every backend keeps is in tests/stores/contract, and what the file
backend does below the record layer (crashes mid-commit, planted junk, its lock
file) in tests/stores/backend/test_file_backend.py; this file checks what the
record layer's file store (``stores.layer.files``) can get wrong in a directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import importlib
import multiprocessing
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import pytest

from hamsterbunker.core.errors import (
    Fenced,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
    StoreUnsafe,
)
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.backends import file as file_backend
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.raw_store import file_key
from tests.support.records import cluster, event, fence_of, heartbeat, lease

WAIT_S = 30.0
KEYS = AgentKeys("a")

# The same lock the file backend takes: an OFD write lock on the whole of the root's .lock.
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)


# -- helpers -----------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(root, keep_checkpoints=3, events_per_node=4)


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith("tmp-hb-")]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- temporary files ---------------------------------------------------------


def test_no_temporary_files_remain_after_writes(store: FileStore, root: Path) -> None:
    """Every write, failed ones included, leaves no tmp-hb-* file behind."""
    store.create_cluster(cluster(1))
    FileStore(root).create_cluster(cluster(2))  # loses: its temp file must go too
    held = store.cas_lease("a", None, lease("n1", 1))
    with pytest.raises(LeaseConflict):
        store.cas_lease("a", None, lease("n2", 2))
    for seq in range(1, 6):
        store.put_checkpoint("a", fence_of(held), seq, b"x" * 300_000)  # each in a temp file
    with pytest.raises(StoreError):
        store.put_checkpoint("a", fence_of(held), 2, b"not above")
    with pytest.raises(Fenced):
        store.put_checkpoint("a", Fence("n9", "s9", 9), 99, b"stale" * 100_000)
    for _ in range(3):
        store.put_heartbeat("a", heartbeat("n1"))
    for n in range(1, 12):
        store.append_event("a", event("n1", n))
    assert file_key(root, "cluster").exists()
    assert _temp_files(root) == []


# -- editor and sync-conflict look-alikes ------------------------------------

_SYNC = "sync-conflict-20240101-123456"


def lookalikes(name: str) -> list[str]:
    """What editors, sync tools and a crashed writer leave beside a file called name."""
    return [
        f"{name}~",
        f".#{name}",
        f"{name} (conflicted copy)",
        f"{name}.{_SYNC}-ABCDEFG",
        f".syncthing.{name}.tmp",
        f"{name}.swp",
        f".{name}.swp",
        f"{name}.orig",
        "tmp-hb-0123456789ab",  # a temp file left by a crash
    ]


def _only_name(folder: Path) -> str:
    [name] = os.listdir(folder)
    return name


def test_checkpoint_lookalikes_are_ignored(store: FileStore, root: Path) -> None:
    """A look-alike file beside a checkpoint is neither listed nor read, nor blocks the next."""
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(held), 1, b"real")
    folder = file_key(root, KEYS.ckpt)
    for name in lookalikes(_only_name(folder)):
        (folder / name).write_bytes(b"planted")
    listed = store.list_checkpoints("a")
    assert [(i.epoch, i.seq) for i in listed] == [(1, 1)]
    assert store.read_checkpoint("a", listed[0]) == b"real"
    store.put_checkpoint("a", fence_of(held), 2, b"next")
    assert [i.seq for i in store.list_checkpoints("a")] == [2, 1]


def test_heartbeat_lookalikes_are_ignored(store: FileStore, root: Path) -> None:
    """A look-alike beside a heartbeat is not listed as a heartbeat."""
    store.put_heartbeat("a", heartbeat("n1"))
    # A conflict copy holds a whole, valid record: here one naming a node that does not exist.
    for name in lookalikes("n1"):
        (file_key(root, KEYS.beats) / name).write_bytes(heartbeat("ghost").to_json())
    assert store.list_heartbeats("a") == [heartbeat("n1")]


def test_event_lookalikes_are_ignored(store: FileStore, root: Path) -> None:
    """A look-alike beside an event contributes no events."""
    store.append_event("a", event("n1", 1))
    folder = file_key(root, KEYS.node_events("n1"))
    for name in lookalikes(_only_name(folder)):
        (folder / name).write_bytes(event("ghost", 1).to_json())
    assert store.read_events("a") == [event("n1", 1)]


def test_lease_lookalikes_are_ignored(store: FileStore, root: Path) -> None:
    """A look-alike of the lease changes neither read_lease nor compare-and-set."""
    held = store.cas_lease("a", None, lease("n1", 1))
    for name in lookalikes("lease"):
        (file_key(root, KEYS.base) / name).write_bytes(b"{not json")
    assert store.read_lease("a") == held
    assert store.cas_lease("a", held.version, lease("n1", 1)).version == held.version + 1


# -- synced folders ----------------------------------------------------------


@pytest.mark.parametrize("marker", [".stfolder", ".dropbox"])
def test_marker_in_the_store_directory_is_refused(root: Path, marker: str) -> None:
    """A store directory that is itself a synced folder raises StoreUnsafe."""
    root.mkdir()
    (root / marker).mkdir()
    with pytest.raises(StoreUnsafe, match="synced folder"):
        FileStore(root)


def test_marker_in_a_parent_directory_is_refused(tmp_path: Path) -> None:
    """A store directory anywhere below a Syncthing folder raises StoreUnsafe, making nothing."""
    synced = tmp_path / "Sync"
    (synced / "work" / "deep").mkdir(parents=True)
    (synced / ".stfolder").mkdir()
    with pytest.raises(StoreUnsafe):
        FileStore(synced / "work" / "deep" / "store")
    assert list((synced / "work" / "deep" / "store").rglob("*")) == []


def test_unsynced_directory_is_accepted(tmp_path: Path) -> None:
    """A plain local directory opens, with a file:// URL."""
    opened = FileStore(tmp_path / "store")
    assert opened.url == (tmp_path / "store").absolute().as_uri()


# -- the lock ----------------------------------------------------------------


def _hold_lock(lock_path: str, held: EventType, release: EventType) -> None:
    """Child process: take the store's lock as the file backend does, and keep it until told."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
        held.set()
        release.wait(WAIT_S)
    finally:
        os.close(fd)


@pytest.fixture
def lock_holder(root: Path) -> Iterator[tuple[EventType, EventType]]:
    """Start a child process holding the store's lock; yields (held, release)."""
    FileStore(root)  # a node's open makes the root and its lock file
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_lock, args=(str(root / ".lock"), held, release))
    child.start()
    try:
        assert held.wait(WAIT_S), "the child never took the lock"
        yield held, release
    finally:
        release.set()
        child.join(WAIT_S)
        if child.is_alive():
            child.kill()
            child.join(WAIT_S)
    assert child.exitcode == 0


def test_lock_held_by_another_process_excludes(
    root: Path, lock_holder: tuple[EventType, EventType]
) -> None:
    """While another process holds the lock, cas_lease times out; after, it succeeds."""
    _held, release = lock_holder
    store = FileStore(root, lock_timeout=0.3)  # its open's tidy-up only logs the timeout
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="locked by another writer"):
        store.cas_lease("a", None, lease("n1", 1))
    assert time.monotonic() - started >= 0.3
    with pytest.raises(StoreUnavailable):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"blocked")
    assert store.read_lease("a") is None  # reads take no lock
    assert store.list_checkpoints("a") == []
    release.set()
    deadline = time.monotonic() + WAIT_S
    while True:  # the child closes its descriptor soon after release
        try:
            stored = store.cas_lease("a", None, lease("n1", 1))
            break
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the lock was never released"
    assert store.read_lease("a") == stored


def test_failed_operations_release_the_lock(root: Path) -> None:
    """A LeaseConflict or Fenced inside the lock does not leave it held."""
    first = FileStore(root)
    second = FileStore(root, lock_timeout=0.3)
    held = first.cas_lease("a", None, lease("n1", 1))
    with pytest.raises(LeaseConflict):
        first.cas_lease("a", None, lease("n1", 1))
    with pytest.raises(Fenced):
        first.put_checkpoint("a", Fence("n9", "s1", 1), 1, b"x")
    assert second.cas_lease("a", held.version, lease("n2", 2)).version == held.version + 1


def _read_everything(store: FileStore) -> None:
    assert store.read_lease("a") is None
    assert store.list_checkpoints("a") == []
    assert store.list_heartbeats("a") == []
    assert store.read_events("a") == []
    assert store.read_acceptance("a") is None
    assert store.read_cluster() is None
    assert store.list_agents() == []


def test_reads_never_create_anything(root: Path) -> None:
    """Reading a store (as hb status does) makes nothing: a reader's open and reads leave an
    empty directory empty; a node's reads add nothing to what its open made."""
    root.mkdir()
    _read_everything(FileStore(root, create=False))
    assert list(root.iterdir()) == []
    node = FileStore(root)
    made = _tree(root)
    _read_everything(node)
    assert _tree(root) == made


@pytest.fixture(params=["inotify", "polling"])
def lease_watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The lease-only watch as on a local disk (inotify), or where inotify cannot be had."""
    if request.param == "polling":
        monkeypatch.setattr(file_backend, "open_lease_watch", lambda *_args: None)
    return str(request.param)


async def _renew_until_woken(
    store: FileStore, woke: asyncio.Future[None], current: LeaseRecord, what: str, agent: str = "a"
) -> LeaseRecord:
    """Renew the agent's lease until the watch wakes (bounded): a watch set up after the first
    renewal still wakes, and a woken watch is known to be live. The last record written."""
    deadline = time.monotonic() + 10
    while not woke.done():
        assert time.monotonic() < deadline, f"the watch never woke {what}"
        current = store.cas_lease(
            agent, current.version, replace(current, renewals=current.renewals + 1)
        )
        await asyncio.wait({woke}, timeout=0.25)
    return current


def test_a_lease_only_watch_sleeps_through_other_writes(root: Path, lease_watch: str) -> None:
    """A lease-only watcher is not woken by heartbeats, events or checkpoints, only by the lease."""
    store = FileStore(root)
    held = store.cas_lease("a", None, lease("n1", 1))

    async def main() -> None:
        watcher = store.watch("a", lease_only=True)
        woke = asyncio.ensure_future(anext(watcher))
        try:
            # First prove the watch is live, so that "not woken" below means something.
            current = await _renew_until_woken(store, woke, held, "on a lease change")
            woke = asyncio.ensure_future(anext(watcher))
            for n in range(1, 21):  # other records change, many times over 0.5 s
                store.put_heartbeat("a", heartbeat("n1"))
                store.append_event("a", event("n1", n))
                store.put_checkpoint("a", fence_of(current), n, b"sealed")
                await asyncio.sleep(0.025)
            assert not woke.done(), "woken by a write that was not the lease"
            store.cas_lease("a", current.version, lease(None, 1))
            await asyncio.wait_for(woke, timeout=10)
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_lease_only_watch_on_a_local_disk_runs_no_polling_thread(root: Path) -> None:
    """inotify on the event loop: an idle lease watch costs no thread waking every few ms."""
    store = FileStore(root)
    held = store.cas_lease("a", None, lease("n1", 1))

    async def main() -> None:
        watcher = store.watch("a", lease_only=True)
        woke = asyncio.ensure_future(anext(watcher))
        threads = threading.active_count()
        try:
            # Live once it woke (a polling watch has its thread running by then).
            await _renew_until_woken(store, woke, held, "on a lease change")
            assert threading.active_count() == threads
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_without_an_inotify_instance_the_lease_watch_falls_back_to_polling(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inotify_init1 refused (EMFILE: the per-user instance limit): no watch is opened,
    so the store polls (through watchfiles) instead of failing."""
    import asyncinotify

    def refused(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(asyncinotify, "Inotify", refused)
    store = FileStore(root)
    held = store.cas_lease("a", None, lease("n1", 1))

    async def main() -> None:
        assert file_backend.open_lease_watch(file_key(root, KEYS.base), lambda _name: True) is None
        watcher = store.watch("a", lease_only=True)
        woke = asyncio.ensure_future(anext(watcher))
        try:
            await _renew_until_woken(store, woke, held, "by polling")
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_every_lease_watch_of_an_event_loop_shares_one_inotify_instance(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process keeping many agents watches many leases: on one instance (the user's
    limit is 128 instances), each watch still woken by its own lease record only."""
    import asyncinotify

    # The module the file backend's lease watch is from, wherever it lives.
    lease_watch_module = importlib.import_module(file_backend.open_lease_watch.__module__)
    made: list[object] = []
    real = asyncinotify.Inotify

    def counted() -> object:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(asyncinotify, "Inotify", counted)
    store = FileStore(root)
    held = {agent: store.cas_lease(agent, None, lease("n1", 1)) for agent in ("a", "b", "c")}

    async def main() -> None:
        watchers = {agent: store.watch(agent, lease_only=True) for agent in held}
        woke = {agent: asyncio.ensure_future(anext(w)) for agent, w in watchers.items()}
        try:
            current = await _renew_until_woken(store, woke["a"], held["a"], "a on its lease")
            assert not woke["b"].done() and not woke["c"].done()
            await _renew_until_woken(store, woke["c"], held["c"], "c on its lease", "c")
            assert not woke["b"].done()
            assert len(made) == 1  # one instance for the three watches
            store.cas_lease("a", current.version, lease(None, 1))
            await asyncio.sleep(0.05)
            assert not woke["b"].done()
        finally:
            for future in woke.values():
                future.cancel()
            await asyncio.gather(*woke.values(), return_exceptions=True)
            for watcher in watchers.values():
                await watcher.aclose()  # type: ignore[attr-defined]
        # Closed once its last watch is: a loop that watches nothing holds no descriptor. The
        # record layer's watch leaves closing the backend's to the loop (its asyncgen hook).
        deadline = time.monotonic() + 5
        while (left := lease_watch_module._SHARED.get(asyncio.get_running_loop())) is not None:
            assert time.monotonic() < deadline, left._by_dir
            await asyncio.sleep(0.01)

    asyncio.run(main())


def test_a_lease_only_watch_outlives_its_directory_being_replaced(root: Path) -> None:
    """The agent's folder moved away and made again (a restore from backup): the inotify
    watch follows the new folder (where it falls back to watchfiles, ticks do)."""
    store = FileStore(root)
    held = store.cas_lease("a", None, lease("n1", 1))
    agent_dir = file_key(root, KEYS.base)

    async def main() -> None:
        watcher = store.watch("a", lease_only=True)
        woke = asyncio.ensure_future(anext(watcher))
        try:
            await _renew_until_woken(store, woke, held, "on the first folder")
            woke = asyncio.ensure_future(anext(watcher))
            os.rename(agent_dir, root / "old-a")
            current = store.cas_lease("a", None, lease("n2", 2))  # a new folder, a new record
            current = await _renew_until_woken(store, woke, current, "after the replacement")
            woke = asyncio.ensure_future(anext(watcher))
            # And again after that: it watches the new folder.
            await _renew_until_woken(store, woke, current, "again after the replacement")
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_watch_creates_nothing_for_an_agent_nobody_wrote(root: Path) -> None:
    """Watching a mistyped agent id makes no folder: a watch only reads."""
    store = FileStore(root)

    async def watch_briefly() -> None:
        watcher = store.watch("typo")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(anext(watcher), timeout=1.0)
        await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(watch_briefly())
    assert not file_key(root, AgentKeys("typo").base).exists()


# -- loss acceptance -----------------------------------------------------------


def test_the_acceptance_record_is_replaced_whole(store: FileStore, root: Path) -> None:
    """A second put renames a new file over the first: a reader never sees a mix of two."""
    store.put_acceptance("a", b'{"to_seq": 3}')
    assert FileStore(root).read_acceptance("a") == b'{"to_seq": 3}'
    inode = file_key(root, KEYS.acceptance).stat().st_ino
    store.put_acceptance("a", b'{"to_seq": 9}')
    assert store.read_acceptance("a") == b'{"to_seq": 9}'
    assert file_key(root, KEYS.acceptance).stat().st_ino != inode  # renamed, not rewritten
    assert _temp_files(root) == []
