"""What only the file backend has: crashes mid-commit, its directory, planted junk, its lock.

A writer process killed at each failpoint of a commit leaves the store as
before or, once the next commit has finished its redo log, as after. Whatever a
store writer without the secret plants below the root (names that are no keys,
huge files, FIFOs, deep folders, symlinks out of the root) never makes a read
return more than its bound, block, or follow a link.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.core.errors import ConfigError, StoreError, StoreUnavailable
from hamsterbunker.core.limits import STALE_TEMP_AGE_S
from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.stores.backend import DeleteRange, Get, Notice, Put, Scan, TooLarge, Txn
from hamsterbunker.stores.backends import file_tree
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.stores.backends.file_redo import decode
from hamsterbunker.stores.dirs import lease_watch
from tests.support.io_probes import bytes_read_by_this_process

pytestmark = pytest.mark.timeout(60)  # a FIFO read or a hung writer would otherwise hang

WIDE = ReadBound(100, 1024, 100 * 1024)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def backend(root: Path) -> FileBackend:
    return FileBackend(root)


def put(backend: FileBackend, key: str, value: bytes) -> None:
    assert backend.commit(Txn(writes=[Put(key, value)])).succeeded


# -- a writer killed mid-commit ---------------------------------------------------------

BEFORE = {"a/1": b"old 1", "a/2": b"old 2", "b/1": b"old", "b/2": b"old", "c/new/x": None}
AFTER = {"a/1": b"new 1", "a/2": b"new 2", "b/1": None, "b/2": None, "c/new/x": b"made"}
# One commit of five keys' writes: two replaced (one made in pieces), two removed, one made.
WRITER = """
import sys
from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.stores.backend import DeleteRange, Put, Txn
from hamsterbunker.stores.backends.file import FileBackend

FileBackend(sys.argv[1], create=False).commit(Txn(writes=[
    Put("a/1", b"new 1"),
    Put("a/2", BlobPieces(5, iter([b"new", b" 2"]))),
    DeleteRange("b/", "b0"),
    Put("c/new/x", b"made"),
]))
"""
BEFORE_THE_LOG = [
    "file_backend.commit.after_temp_write",  # a/2's: the other values go in the log
    "file_backend.commit.after_temp_fsync",
    "file_backend.commit.before_lock",
]
AFTER_THE_LOG = [
    "file_backend.commit.after_log",
    "file_backend.commit.after_op",
    "file_backend.commit.after_op@2",
    "file_backend.commit.after_op@4",
    "file_backend.commit.before_log_removed",
]


FINISH = """
import sys
from hamsterbunker.stores.backend import Txn
from hamsterbunker.stores.backends.file import FileBackend

FileBackend(sys.argv[1], create=False).commit(Txn())
"""


def run_writer(root: Path, script: str, failpoint: str) -> int:
    """Run script (argv[1]: root) in a new process killed at failpoint[@n]; its exit code."""
    name, _, nth = failpoint.partition("@")
    env = {**os.environ, "HB_FAILPOINTS": f"{name}=kill" + (f"@{nth}" if nth else "")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], env=env, timeout=50, capture_output=True
    )
    return done.returncode


def redo_logged(root: Path) -> bool:
    """Whether a redo log is left in root (the file stays, emptied, between commits)."""
    log = root / ".redo"
    return log.exists() and log.stat().st_size > 0


def state(root: Path) -> dict[str, bytes | TooLarge | None]:
    """What a reader sees (it takes no lock, and finishes no redo log)."""
    reader = FileBackend(root, create=False)
    return {key: reader.get(key, 100) for key in BEFORE}


@pytest.fixture
def before(root: Path, backend: FileBackend) -> Path:
    for key, value in BEFORE.items():
        if value is not None:
            put(backend, key, value)
    return root


@pytest.mark.parametrize("failpoint", BEFORE_THE_LOG + AFTER_THE_LOG)
def test_a_writer_killed_mid_commit_leaves_the_store_before_or_after(
    before: Path, failpoint: str
) -> None:
    """Killed before its redo log is durable, a commit left nothing; killed after, the
    next commit finishes it first."""
    assert run_writer(before, WRITER, failpoint) == -9
    logged = failpoint in AFTER_THE_LOG
    assert redo_logged(before) == logged
    if not logged:
        assert state(before) == BEFORE
    next_writer = FileBackend(before, create=False)  # a reader's open finishes nothing
    assert next_writer.commit(Txn()).succeeded
    assert state(before) == (AFTER if logged else BEFORE)
    assert not redo_logged(before)
    assert (before / "kv" / "b").exists() != logged  # a folder left empty is removed


TIDY_WRITER = """
import sys
from hamsterbunker.stores.backend import DeleteRange, Put, Txn
from hamsterbunker.stores.backends.file import FileBackend

FileBackend(sys.argv[1], create=False).commit(
    Txn(writes=[Put("c/new/x", b"made")], tidy=[DeleteRange("a/", "a0")])
)
"""


def test_a_writer_killed_before_its_tidy_up_has_made_its_writes(before: Path) -> None:
    """A commit of one put is one rename, no redo log: killed before its tidy-up, it is made
    and what the tidy-up covers is left, as Txn.tidy allows."""
    assert run_writer(before, TIDY_WRITER, "file_backend.commit.before_tidy") == -9
    assert not redo_logged(before)
    assert state(before) == {**BEFORE, "c/new/x": b"made"}


def test_a_writer_killed_while_finishing_a_redo_log_leaves_it_to_the_next(before: Path) -> None:
    """Finishing a redo log is as safe to cut short, and to do again, as the commit."""
    assert run_writer(before, WRITER, "file_backend.commit.after_op@2") == -9
    assert run_writer(before, FINISH, "file_backend.commit.after_op") == -9
    assert redo_logged(before)
    FileBackend(before)  # a node's open finishes it
    assert state(before) == AFTER and not redo_logged(before)


def test_a_power_loss_after_the_redo_log_loses_nothing_it_holds(before: Path) -> None:
    """The keys a commit makes after its log are not synced one by one: a power loss may
    lose them (here: put back as they were), and the log alone makes them again."""
    assert run_writer(before, WRITER, "file_backend.commit.before_log_removed") == -9
    assert state(before) == AFTER
    ops = decode((before / ".redo").read_bytes())
    assert ops is not None
    for key, op in ops:  # what the disk may hold after the power loss: no rename made
        if isinstance(op, str):
            (before / "kv" / key).rename(before / op)  # its temp file, synced before the log
    for key, value in BEFORE.items():
        path = before / "kv" / key
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)
    FileBackend(before)
    assert state(before) == AFTER and not redo_logged(before)


@pytest.mark.parametrize(
    "junk",
    [b'[["a/1", "../../etc/passwd"]]', b"HB-REDO\x01" + bytes(40) + b"cut short"],
    ids=["planted", "cut-short"],
)
def test_a_redo_log_that_is_not_whole_and_ours_is_set_aside_unapplied(
    before: Path, junk: bytes
) -> None:
    """Planted, or cut short as it was written (its commit never returned): never applied."""
    (before / ".redo").write_bytes(junk)
    FileBackend(before)
    assert state(before) == BEFORE
    assert [p.name.startswith(".redo.planted-") for p in before.glob(".redo*")] == [True]


def test_a_blob_is_written_before_the_lock_and_removed_when_it_cannot_be_taken(
    root: Path, backend: FileBackend
) -> None:
    """The values are written (and synced) while another writer holds the lock; when the
    lock is never had, the commit is StoreUnavailable and leaves no temp file."""
    made: list[bytes] = []

    def pieces() -> Iterator[bytes]:
        for piece in (b"ab", b"cd"):
            made.append(piece)
            yield piece

    slow = FileBackend(root, lock_timeout=0.2)
    with held_lock(root):
        with pytest.raises(StoreUnavailable, match=f"{root}/.lock is locked by another writer"):
            slow.commit(Txn(writes=[Put("a/k", BlobPieces(4, pieces()))]))
        assert backend.get("a/k", 10) is None  # reads take no lock
    assert made == [b"ab", b"cd"]
    assert not list(root.glob("tmp-hb-*"))


@contextlib.contextmanager
def held_lock(root: Path) -> Iterator[None]:
    """The root's lock held by another open file, as another writer holds it."""
    with open(root / ".lock", "a") as lock:
        fcntl.fcntl(lock, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        yield


# -- the directory: gone, not there, keys as paths --------------------------------------


def test_a_store_directory_gone_is_unavailable_for_every_call(
    root: Path, backend: FileBackend
) -> None:
    """A missing root is not an empty store: the message names the directory."""
    put(backend, "a/k", b"v")
    os.rename(root, root.with_name("moved"))
    says = f"^store directory {root}: No such file or directory$"
    for call in (
        backend.check,
        lambda: backend.get("a/k", 10),
        lambda: backend.scan("a/", WIDE),
        lambda: backend.commit(Txn(writes=[Put("a/k", b"w")])),
    ):
        with pytest.raises(StoreUnavailable, match=says):
            call()


def test_a_reader_needs_the_directory_there(root: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        FileBackend(root, create=False)
    assert not root.exists()


@pytest.mark.parametrize(
    "key", ["../x", "a/../../x", "a/.hidden", "/etc/passwd", "a//b", "", "a/k.sync-conflict-1"]
)
def test_a_key_that_is_no_key_is_refused_before_the_disk_is_touched(
    root: Path, backend: FileBackend, key: str
) -> None:
    before = sorted(p.name for p in root.iterdir())
    for call in (
        lambda: backend.get(key, 10),
        lambda: backend.commit(Txn(writes=[Put(key, b"x")])),
        lambda: backend.commit(Txn(reads=[Get(key, 10)])),
        lambda: backend.commit(Txn(writes=[DeleteRange(key)])),
    ):
        with pytest.raises(ValueError):
            call()
    assert sorted(p.name for p in root.iterdir()) == before


def test_a_key_that_is_another_keys_folder_in_one_commit_is_refused(
    backend: FileBackend,
) -> None:
    with pytest.raises(ValueError, match="another key's folder"):
        backend.commit(Txn(writes=[Put("a", b"1"), Put("a/b", b"2")]))
    assert backend.get("a", 10) is None and backend.get("a/b", 10) is None


def test_old_temp_files_are_swept_and_young_ones_kept(root: Path, backend: FileBackend) -> None:
    old, young = root / "tmp-hb-000000000001", root / "tmp-hb-000000000002"
    for temp in (old, young):
        temp.write_bytes(b"left by a crash")
    long_ago = time.time() - STALE_TEMP_AGE_S - 10
    os.utime(old, (long_ago, long_ago))
    FileBackend(root)  # a node's open sweeps
    assert not old.exists() and young.exists()


def test_a_lock_file_planted_as_a_symlink_is_moved_aside(
    tmp_path: Path, root: Path, backend: FileBackend
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (root / ".lock").unlink()
    (root / ".lock").symlink_to(victim)
    put(backend, "a/k", b"v")
    assert victim.read_bytes() == b"untouched" and (root / ".lock").is_file()


# -- planted junk never makes a read return more than its bound ---------------------------


@pytest.fixture
def junk(tmp_path: Path, root: Path, backend: FileBackend) -> Path:
    """A store with three keys under j/ and every kind of junk around them."""
    for key in ("j/1", "j/2", "j/sub/3"):
        put(backend, key, b"value")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not the store's")
    folder = root / "kv" / "j"
    (folder / "link").symlink_to(outside / "secret")
    (folder / "linked").symlink_to(outside)
    os.mkfifo(folder / "fifo")
    for name in (".hidden", "tmp dir", "k.sync-conflict-20240101-000000-ABC", "caf\u00e9"):
        (folder / name).write_bytes(b"junk")
    with open(folder / "huge", "wb") as huge:
        huge.truncate(64 * 1024 * 1024)  # sparse: large to read, cheap to make
    deep = folder / "deep"
    for _ in range(520):  # deeper than any key can be
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "bottom").write_bytes(b"too deep")
    return root


def test_planted_junk_is_never_read_as_keys(junk: Path) -> None:
    backend = FileBackend(junk, create=False)
    result = backend.scan("j/", ReadBound(100, 1024, 100 * 1024))
    assert result.items == [("j/1", b"value"), ("j/2", b"value"), ("j/sub/3", b"value")]
    assert [t.key for t in result.too_large] == ["j/huge"] and not result.more
    for key in ("j/link", "j/fifo", "j/linked/secret"):
        assert backend.get(key, 1024) is None, key
    assert backend.scan("j/linked/", WIDE).items == []


def test_a_read_keeps_to_its_bound_whatever_was_planted(junk: Path) -> None:
    """Junk never makes a read take more than its bound, nor read a huge file."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux)")
    backend = FileBackend(junk, create=False)
    start = bytes_read_by_this_process()
    huge = backend.get("j/huge", 1024)
    one = backend.scan("j/", ReadBound(1, 1024, 1024))
    small = backend.scan("j/", ReadBound(10, 4, 100))
    assert bytes_read_by_this_process() - start < 1024 * 1024  # far from the 64 MiB planted
    assert huge == TooLarge("j/huge", 64 * 1024 * 1024)
    assert one.items == [("j/1", b"value")] and one.more
    assert small.items == [] and len(small.too_large) == 4  # every one counts


def test_a_folder_of_too_many_names_fails_the_walk_rather_than_list_them(
    root: Path, backend: FileBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_tree, "WALK_ENTRIES", 50)
    put(backend, "f/k", b"v")
    for n in range(60):
        (root / "kv" / "f" / f".junk{n}").write_bytes(b"")
    with pytest.raises(StoreError, match="more than 50 directory entries"):
        backend.scan("f/", WIDE)
    with pytest.raises(StoreError, match="more than 50 directory entries"):
        backend.commit(Txn(writes=[DeleteRange("f/", "f0")]))
    assert backend.get("f/k", 10) == b"v"  # one key is looked at alone, its folder not listed
    assert backend.commit(Txn(writes=[DeleteRange("f/k")])).succeeded
    assert backend.get("f/k", 10) is None


def test_a_write_through_a_planted_symlink_folder_is_refused(
    tmp_path: Path, root: Path, backend: FileBackend
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "kv" / "s").symlink_to(outside)
    with pytest.raises(StoreError, match="not followed"):
        backend.commit(Txn(writes=[Put("s/k", b"x"), Put("t/k", b"y")]))
    assert list(outside.iterdir()) == [] and backend.get("t/k", 10) is None


# -- watch ------------------------------------------------------------------------------


def test_a_watch_goes_on_when_its_folder_is_removed_and_made_again(backend: FileBackend) -> None:
    """A range delete removes the folder it empties; the watch moves, and still sees."""
    put(backend, "w/k", b"1")

    async def notices() -> list[Notice]:
        seen: list[Notice] = []
        watch = backend.watch("w/")
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.3)  # the watch is in place
        await asyncio.to_thread(backend.commit, Txn(writes=[DeleteRange("w/", "w0")]))
        try:
            seen.append(await asyncio.wait_for(waiting, timeout=20))
            while not any(n.key == "w/again" for n in seen):
                seen.append(await asyncio.wait_for(anext(watch), timeout=20))
                if seen[-1].key is None:  # moved to kv/: put once the move is seen
                    await asyncio.to_thread(put, backend, "w/again", b"2")
        finally:
            await watch.aclose()
        return seen

    seen = asyncio.run(notices())
    assert seen[0] == Notice("w/k") and Notice(None) in seen


def test_a_prefix_may_be_the_start_of_a_key_not_only_a_folder(backend: FileBackend) -> None:
    """As the record layer watches one key (its lease) by the key itself as the prefix."""
    for key in ("p/lease", "p/lease-x/1", "p/other"):
        put(backend, key, b"v")
    assert [k for k, _v in backend.scan("p/lease", WIDE).items] == ["p/lease", "p/lease-x/1"]

    async def first_notice() -> Notice:
        watch = backend.watch("p/lease")
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.3)  # the watch is in place
        await asyncio.to_thread(put, backend, "p/other", b"not watched")
        await asyncio.to_thread(put, backend, "p/lease", b"renewed")
        try:
            return await asyncio.wait_for(waiting, timeout=20)
        finally:
            await watch.aclose()

    assert asyncio.run(first_notice()) == Notice("p/lease")


def test_a_watch_closed_at_its_gap_notice_leaves_no_inotify_watch_open(root: Path) -> None:
    """A consumer that stops at the gap notice, told the moment the lease's folder is
    watched with inotify, closes that watch too (the event loop's instance goes with it)."""
    root.mkdir()
    reader = FileBackend(root, create=False)

    async def main() -> None:
        watch = reader.watch("lease")  # no kv/ yet: a gap once it is made and watched
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0)  # the watch's first look (synchronous, on its first turn): no kv/
        await asyncio.to_thread(FileBackend, root)  # makes kv/
        try:
            assert await asyncio.wait_for(waiting, timeout=20) == Notice(None)
        finally:
            await watch.aclose()
        assert lease_watch._SHARED.get(asyncio.get_running_loop()) is None

    asyncio.run(main())


def test_a_lease_watch_closed_while_a_read_is_due_logs_no_error(tmp_path: Path) -> None:
    """The watch is closed in the turn of the event loop whose poll found a change: the
    inotify instance is closed only once its reader let go of it, so the read due in that
    turn finds it open (no "Exception in callback Inotify._get: Can not work with closed
    inotify" in a node's log, as on a role change)."""
    errors: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context["message"]))
        for n in range(20):
            watch = lease_watch.open_lease_watch(tmp_path, lambda _name: True)
            assert watch is not None
            await asyncio.sleep(0)  # its reader waits on the instance
            (tmp_path / "tmp").write_bytes(b"x")
            os.rename(tmp_path / "tmp", tmp_path / f"lease{n}")
            await asyncio.sleep(0)  # the loop's poll sees it: the read is due after us
            watch.close()
            await asyncio.sleep(0.01)
        assert lease_watch._SHARED.get(loop) is None

    asyncio.run(main())
    assert errors == []


def test_commit_reads_see_the_writes_of_a_range_delete_and_a_put(backend: FileBackend) -> None:
    put(backend, "r/1", b"1")
    result = backend.commit(
        Txn(writes=[DeleteRange("r/", "r0"), Put("r/1", b"again")], reads=[Scan("r/", WIDE)])
    )
    scan = result.reads[0]
    assert not isinstance(scan, (bytes, TooLarge)) and scan is not None
    assert scan.items == [("r/1", b"again")]
