"""FileStore behaviour beyond the shared contract: files on disk, look-alikes, sync folders, locks.

The contract every backend keeps is in tests/stores/contract; this file checks what
only a directory-backed store can get wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
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

from hamsterbunker.errors import (
    ConfigError,
    Fenced,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
    StoreUnsafe,
)
from hamsterbunker.limits import MAX_RECORD_BYTES
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.file import FileStore
from hamsterbunker.stores.file import lease_watch as lease_watch_module
from hamsterbunker.stores.file import store as file_store_module
from hamsterbunker.stores.file.lease import lease_locked
from hamsterbunker.stores.file.lease_watch import open_lease_watch
from tests.support.records import cluster, event, fence_of, heartbeat, lease

WAIT_S = 30.0

# The same lock file.py takes: an OFD write lock on the whole of lease.lock.
_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)


# -- helpers -----------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(root, keep_checkpoints=3, events_per_segment=4)


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith("tmp-hb-")]


# -- temporary files ---------------------------------------------------------


def test_no_temporary_files_remain_after_writes(store: FileStore, root: Path) -> None:
    """Every write, failed ones included, leaves no tmp-hb-* file behind."""
    store.create_cluster(cluster(1))
    FileStore(root).create_cluster(cluster(2))  # loses: its temp file must go too
    held = store.cas_lease("a", None, lease("n1", 1))
    with pytest.raises(LeaseConflict):
        store.cas_lease("a", None, lease("n2", 2))
    for seq in range(1, 6):
        store.put_checkpoint("a", fence_of(held), seq, b"x" * 1000)
    with pytest.raises(StoreError):
        store.put_checkpoint("a", fence_of(held), 2, b"not above")
    with pytest.raises(Fenced):
        store.put_checkpoint("a", Fence("n9", "s9", 9), 99, b"stale")
    for _ in range(3):
        store.put_heartbeat("a", heartbeat("n1"))
    for n in range(1, 12):
        store.append_event("a", event("n1", n))
    assert (root / "cluster.json").exists()
    assert _temp_files(root) == []


# -- editor and sync-conflict look-alikes ------------------------------------

_CKPT = "ckpt-00000000000000000009-0000000001"
_SYNC = "sync-conflict-20240101-123456"

CHECKPOINT_LOOKALIKES = [
    f"{_CKPT}.hbc~",
    f".#{_CKPT}.hbc",
    f"{_CKPT} (conflicted copy).hbc",
    f"{_CKPT}.{_SYNC}-ABCDEFG.hbc",
    f".syncthing.{_CKPT}.hbc.tmp",
    f"{_CKPT}.hbc.swp",
    f"{_CKPT}.hbc.orig",
    "tmp-hb-0123456789ab",  # a temp file left by a crash
]


@pytest.mark.parametrize("name", CHECKPOINT_LOOKALIKES)
def test_checkpoint_lookalikes_are_ignored(store: FileStore, root: Path, name: str) -> None:
    """A look-alike file in the checkpoint directory is neither listed nor read."""
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(held), 1, b"real")
    (root / "agents/a/checkpoints" / name).write_bytes(b"planted")
    listed = store.list_checkpoints("a")
    assert [(i.epoch, i.seq) for i in listed] == [(1, 1)]
    assert store.read_checkpoint("a", listed[0]) == b"real"
    store.put_checkpoint("a", fence_of(held), 2, b"next")  # seq 9 look-alike does not block it
    assert [i.seq for i in store.list_checkpoints("a")] == [2, 1]


HEARTBEAT_LOOKALIKES = [
    "n1.json~",
    ".#n1.json",
    "n1.json.swp",
    ".n1.json.swp",
    "n1 (conflicted copy).json",
    ".syncthing.x.tmp",
    ".syncthing.n1.json.tmp",
    "tmp-hb-0123456789ab",
    f"x.{_SYNC}.json",
    f"n1.{_SYNC}-ABCDEFG.json",
]


@pytest.mark.parametrize("name", HEARTBEAT_LOOKALIKES)
def test_heartbeat_lookalikes_are_ignored(store: FileStore, root: Path, name: str) -> None:
    """A look-alike file in the heartbeat directory is not listed as a heartbeat."""
    store.put_heartbeat("a", heartbeat("n1"))
    # A conflict copy holds a whole, valid record: here one naming a node that does not exist.
    (root / "agents/a/heartbeats" / name).write_bytes(heartbeat("ghost").to_json())
    assert store.list_heartbeats("a") == [heartbeat("n1")]


EVENT_LOOKALIKES = [
    "n1.jsonl~",
    ".#n1.jsonl",
    "n1.jsonl.swp",
    "n1 (conflicted copy).jsonl",
    ".syncthing.n1.jsonl.tmp",
    "n1.jsonl.2",
    "tmp-hb-0123456789ab",
    f"x.{_SYNC}.jsonl",
]


@pytest.mark.parametrize("name", EVENT_LOOKALIKES)
def test_event_lookalikes_are_ignored(store: FileStore, root: Path, name: str) -> None:
    """A look-alike file in the event directory contributes no events."""
    store.append_event("a", event("n1", 1))
    (root / "agents/a/events" / name).write_bytes(event("ghost", 1).to_json() + b"\n")
    assert store.read_events("a") == [event("n1", 1)]


@pytest.mark.parametrize(
    "name", ["lease.json~", ".#lease.json", f"lease.{_SYNC}.json", "lease (conflicted copy).json"]
)
def test_lease_lookalikes_are_ignored(store: FileStore, root: Path, name: str) -> None:
    """A look-alike of lease.json changes neither read_lease nor compare-and-set."""
    held = store.cas_lease("a", None, lease("n1", 1))
    (root / "agents/a" / name).write_bytes(b"{not json")
    assert store.read_lease("a") == held
    assert store.cas_lease("a", held.version, lease("n1", 1)).version == held.version + 1


def test_partly_appended_event_line_is_skipped(store: FileStore, root: Path) -> None:
    """A reader skips the last event line while it is still being appended."""
    store.append_event("a", event("n1", 1))
    with open(root / "agents/a/events/n1.jsonl", "ab") as out:
        out.write(event("n1", 2).to_json()[:-7])
    assert store.read_events("a") == [event("n1", 1)]


# -- synced folders ----------------------------------------------------------


@pytest.mark.parametrize("marker", [".stfolder", ".dropbox"])
def test_marker_in_the_store_directory_is_refused(root: Path, marker: str) -> None:
    """A store directory that is itself a synced folder raises StoreUnsafe."""
    root.mkdir()
    (root / marker).mkdir()
    with pytest.raises(StoreUnsafe, match="synced folder"):
        FileStore(root)


def test_marker_in_a_parent_directory_is_refused(tmp_path: Path) -> None:
    """A store directory anywhere below a Syncthing folder raises StoreUnsafe."""
    synced = tmp_path / "Sync"
    (synced / "work" / "deep").mkdir(parents=True)
    (synced / ".stfolder").mkdir()
    with pytest.raises(StoreUnsafe):
        FileStore(synced / "work" / "deep" / "store")


def test_unsynced_directory_is_accepted(tmp_path: Path) -> None:
    """A plain local directory opens, with a file:// URL."""
    opened = FileStore(tmp_path / "store")
    assert opened.url == (tmp_path / "store").absolute().as_uri()


# -- the lease lock ----------------------------------------------------------


def _hold_lease_lock(lock_path: str, held: EventType, release: EventType) -> None:
    """Child process: take the lease lock as file.py does, and keep it until told."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
        held.set()
        release.wait(WAIT_S)
    finally:
        os.close(fd)


@pytest.fixture
def lock_holder(root: Path) -> Iterator[tuple[EventType, EventType]]:
    """Start a child process holding agent a's lease lock; yields (held, release)."""
    FileStore(root).put_heartbeat("a", heartbeat("n1"))  # a first write creates agents/a
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    child = ctx.Process(
        target=_hold_lease_lock, args=(str(root / "agents/a/lease.lock"), held, release)
    )
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
    """While another process holds the lease lock, cas_lease times out; after, it succeeds."""
    _held, release = lock_holder
    store = FileStore(root, lock_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.cas_lease("a", None, lease("n1", 1))
    assert time.monotonic() - started >= 0.3
    with pytest.raises(StoreUnavailable):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"blocked")
    assert store.read_lease("a") is None
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


def test_two_stores_in_one_process_exclude_each_other(root: Path) -> None:
    """A lock held through one FileStore object blocks another in the same process and thread."""
    first = FileStore(root)
    second = FileStore(root, lock_timeout=0.3)
    with (
        first._tree.writing("agents", "a") as agent_fd,
        lease_locked(agent_fd, first._tree.agent_dir("a"), "a", first.lock_timeout),
        pytest.raises(StoreUnavailable),
    ):
        second.cas_lease("a", None, lease("n2", 1))
    assert second.cas_lease("a", None, lease("n2", 1)).holder == "n2"


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


def test_reads_never_create_anything(root: Path) -> None:
    """Reading a store (as hb status does) leaves an empty store directory empty."""
    store = FileStore(root)
    assert store.read_lease("a") is None
    assert store.list_checkpoints("a") == []
    assert store.list_heartbeats("a") == []
    assert store.read_events("a") == []
    assert store.read_cluster() is None
    assert list(root.iterdir()) == []


def test_a_reader_does_not_create_a_missing_store(tmp_path: Path) -> None:
    """FileStore(create=False) refuses a missing directory instead of making it."""
    with pytest.raises(ConfigError, match="does not exist"):
        FileStore(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


@pytest.fixture(params=["inotify", "polling"])
def lease_watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The lease-only watch as on a local disk (inotify), or where inotify cannot be had."""
    if request.param == "polling":
        monkeypatch.setattr(file_store_module, "open_lease_watch", lambda _directory: None)
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
        woke = asyncio.ensure_future(watcher.__anext__())
        try:
            # First prove the watch is live, so that "not woken" below means something.
            current = await _renew_until_woken(store, woke, held, "on a lease change")
            woke = asyncio.ensure_future(watcher.__anext__())
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
        woke = asyncio.ensure_future(watcher.__anext__())
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
    (root / "agents" / "a").mkdir(parents=True)

    async def main() -> None:
        assert open_lease_watch(root / "agents" / "a") is None

    asyncio.run(main())


def test_every_lease_watch_of_an_event_loop_shares_one_inotify_instance(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process keeping many agents watches many leases: on one instance (the user's
    limit is 128 instances), each watch still woken by its own lease record only."""
    import asyncinotify

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
        woke = {agent: asyncio.ensure_future(w.__anext__()) for agent, w in watchers.items()}
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
        # Closed with its last watch: a loop that watches nothing holds no descriptor.
        left = lease_watch_module._SHARED.get(asyncio.get_running_loop())
        assert left is None, left._by_dir  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_lease_only_watch_outlives_its_directory_being_replaced(root: Path) -> None:
    """The agent directory moved away and made again (a restore from backup): the inotify
    watch follows the new directory (where it falls back to watchfiles, ticks do)."""
    store = FileStore(root)
    held = store.cas_lease("a", None, lease("n1", 1))
    agent_dir = root / "agents" / "a"

    async def main() -> None:
        watcher = store.watch("a", lease_only=True)
        woke = asyncio.ensure_future(watcher.__anext__())
        try:
            await _renew_until_woken(store, woke, held, "on the first directory")
            woke = asyncio.ensure_future(watcher.__anext__())
            os.rename(agent_dir, root / "old-a")
            current = store.cas_lease("a", None, lease("n2", 2))  # a new directory, a new record
            current = await _renew_until_woken(store, woke, current, "after the replacement")
            woke = asyncio.ensure_future(watcher.__anext__())
            # And again after that: it watches the new directory.
            await _renew_until_woken(store, woke, current, "again after the replacement")
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_watch_creates_nothing_for_an_agent_nobody_wrote(tmp_path: Path) -> None:
    """Watching a mistyped agent id makes no directory: a watch only reads."""
    store = FileStore(tmp_path / "store")

    async def watch_briefly() -> None:
        watcher = store.watch("typo")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.__anext__(), timeout=1.0)
        await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(watch_briefly())
    assert not (tmp_path / "store" / "agents" / "typo").exists()


# -- loss acceptance -----------------------------------------------------------


def test_the_acceptance_record_is_none_until_put_and_then_replaced_whole(
    store: FileStore, root: Path
) -> None:
    assert store.read_acceptance("a") is None
    assert list(root.iterdir()) == []  # reading made nothing
    store.put_acceptance("a", b'{"to_seq": 3}')
    assert FileStore(root).read_acceptance("a") == b'{"to_seq": 3}'
    inode = (root / "agents/a/acceptance.json").stat().st_ino
    store.put_acceptance("a", b'{"to_seq": 9}')
    assert store.read_acceptance("a") == b'{"to_seq": 9}'
    assert (root / "agents/a/acceptance.json").stat().st_ino != inode  # renamed, not rewritten
    assert _temp_files(root) == []


def test_an_acceptance_record_over_the_record_limit_is_refused(store: FileStore) -> None:
    with pytest.raises(StoreError, match=f"limit of {MAX_RECORD_BYTES} bytes"):
        store.put_acceptance("a", b"x" * (MAX_RECORD_BYTES + 1))
    assert store.read_acceptance("a") is None
