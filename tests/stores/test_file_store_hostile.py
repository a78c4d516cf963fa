"""The file store against what a store writer without the secret can plant (DESIGN.md inv. 10).

Symlinks (to a victim file, to /dev/zero, in place of a folder), FIFOs,
folders and oversized files under the record layer's keys (``ROOT/kv/``): a
record that is no regular file reads as absent and is replaced by the next
write; one too large is refused or left out without being read; nothing is
written through a link, no read blocks, none goes past its cap. Also here: a
lock file that is no file is moved aside, leftover temp files are swept by a
node (never by a reader), and new folders are fsynced.

``tests/stores/backend/test_file_backend.py`` plants the same below the record
layer (one backend key at a time); the contract suite plants junk under the
keys on every backend (``tests/stores/contract/test_planted_junk.py``).
Every test that could hang on a FIFO or an endless file runs under a timeout.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hamsterbunker.core.errors import CorruptRecord, Fenced, StoreError, UnreadableLease
from hamsterbunker.core.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EPOCH,
    MAX_RECORD_BYTES,
    MAX_SEQ,
    STALE_TEMP_AGE_S,
)
from hamsterbunker.core.reach import Reach
from hamsterbunker.lease.memory import Memory, MemoryFile
from hamsterbunker.records import CheckpointInfo
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import CLUSTER, AgentKeys
from tests.support.io_probes import bytes_read_by_this_process, record_fsyncs
from tests.support.raw_store import file_key
from tests.support.records import cluster, event, fence_of, heartbeat, lease

pytestmark = pytest.mark.timeout(20)  # a FIFO or /dev/zero read would otherwise hang

AGENT = "a"
KEYS = AgentKeys(AGENT)
HAS_PROC_IO = Path("/proc/self/io").exists()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(root, keep_checkpoints=3, events_per_node=4)


def populate(store: FileStore) -> Fence:
    """One of each record for agent a, written by node n1; returns the lease's fence."""
    store.create_cluster(cluster(1))
    held = store.cas_lease(AGENT, None, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(held), 1, b"sealed-1")
    store.put_heartbeat(AGENT, heartbeat("n1"))
    store.append_event(AGENT, event("n1", 1))
    store.put_acceptance(AGENT, b'{"to_seq": 1}')
    return fence_of(held)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below directory with its bytes (links not followed)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def plant(path: Path, what: str) -> None:
    """Put a FIFO, a symlink to /dev/zero or an empty folder where path is (replacing it)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "devzero":
        path.symlink_to("/dev/zero")
    else:
        assert what == "empty-folder", what
        path.mkdir()


def only_file(folder: Path) -> Path:
    [name] = os.listdir(folder)
    return folder / name


@pytest.fixture
def bytes_read() -> Iterator[Callable[[], int]]:
    """Bytes read(2) returned to this process since the fixture started."""
    if not HAS_PROC_IO:
        pytest.skip("needs /proc/self/io (Linux)")
    start = bytes_read_by_this_process()
    yield lambda: bytes_read_by_this_process() - start


# -- symlinks ---------------------------------------------------------------------


def test_an_event_symlinked_to_the_nodes_memory_file_is_not_written_through(
    tmp_path: Path, root: Path
) -> None:
    """The issue's case: the keys the node's next events go to -> its memory file. The memory
    file is unchanged; each event replaces the link with a plain file."""
    memory = MemoryFile(tmp_path / "state", root.as_uri(), AGENT)
    memory.save(Memory(epoch=3, reach=Reach(7, 3)))
    victim = memory.path.read_bytes()
    store = FileStore(root)
    store.append_event(AGENT, event("n1", 1))
    log = file_key(root, KEYS.node_events("n1"))
    links = [file_key(root, KEYS.event("n1", position)) for position in range(2, 6)]
    for link in links:
        link.symlink_to(memory.path)
    for n in range(2, 6):
        FileStore(root).append_event(AGENT, event("n1", n))  # each knows nothing of the log
    assert memory.path.read_bytes() == victim
    assert MemoryFile(tmp_path / "state", root.as_uri(), AGENT).load() == Memory(3, Reach(7, 3))
    assert not any(path.is_symlink() for path in log.iterdir())
    assert [e.n for e in store.read_events(AGENT)] == [1, 2, 3, 4, 5]


def test_records_symlinked_to_valid_ones_elsewhere_are_not_read(
    tmp_path: Path, store: FileStore, root: Path
) -> None:
    """A symlink to a well-formed record outside the store is still a symlink: not read."""
    populate(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "beat").write_bytes(heartbeat("n2").to_json())
    (outside / "event").write_bytes(event("n2", 1).to_json())
    (outside / "lease").write_bytes(lease("n2", 2).to_json())
    file_key(root, KEYS.beat("n2")).symlink_to(outside / "beat")
    file_key(root, KEYS.node_events("n2")).mkdir()
    file_key(root, KEYS.event("n2", 1)).symlink_to(outside / "event")
    assert store.list_heartbeats(AGENT) == [heartbeat("n1")]
    assert [(e.node, e.n) for e in store.read_events(AGENT)] == [("n1", 1)]
    read = store.tail(AGENT).read()
    assert read.heartbeats == [heartbeat("n1")]
    assert [(e.node, e.n) for e in read.events] == [("n1", 1)]
    file_key(root, KEYS.lease).unlink()
    file_key(root, KEYS.lease).symlink_to(outside / "lease")
    assert store.read_lease(AGENT) is None


AGENT_OPS: dict[str, Callable[[FileStore, Fence], object]] = {
    "read_lease": lambda s, f: s.read_lease(AGENT),
    "cas_lease": lambda s, f: s.cas_lease(AGENT, 1, lease("n1", 1)),
    "put_checkpoint": lambda s, f: s.put_checkpoint(AGENT, f, 2, b"sealed-2"),
    "list_checkpoints": lambda s, f: s.list_checkpoints(AGENT),
    "put_heartbeat": lambda s, f: s.put_heartbeat(AGENT, heartbeat("n2")),
    "list_heartbeats": lambda s, f: s.list_heartbeats(AGENT),
    "remove_heartbeat": lambda s, f: s.remove_heartbeat(AGENT, "n1"),
    "append_event": lambda s, f: s.append_event(AGENT, event("n1", 2)),
    "read_events": lambda s, f: s.read_events(AGENT),
    "tail": lambda s, f: s.tail(AGENT).read(),
    "read_acceptance": lambda s, f: s.read_acceptance(AGENT),
    "put_acceptance": lambda s, f: s.put_acceptance(AGENT, b"{}"),
}
_AGENTS = {"put_heartbeat", "append_event", "put_acceptance"}
# The writes that must refuse, naming the link, when that folder is a symlink (others may
# refuse too: a lease hidden behind the link makes a fenced write Fenced).
SYMLINKED_DIRS = {
    "kv": _AGENTS | {"put_checkpoint", "remove_heartbeat"},
    "kv/agents": _AGENTS,
    f"kv/agents/{AGENT}": _AGENTS,
    f"kv/agents/{AGENT}/ckpt": {"put_checkpoint"},
    f"kv/agents/{AGENT}/beats": {"put_heartbeat"},
    f"kv/agents/{AGENT}/events": {"append_event"},
    f"kv/agents/{AGENT}/events/n1": {"append_event"},
}


def _seen(store: FileStore) -> dict[str, object]:
    """What a reader finds of the agent's records."""
    tail = store.tail(AGENT).read()
    return {
        "lease": store.read_lease(AGENT),
        "checkpoints": store.list_checkpoints(AGENT),
        "heartbeats": store.list_heartbeats(AGENT) + tail.heartbeats,
        "events": store.read_events(AGENT) + tail.events,
        "acceptance": store.read_acceptance(AGENT),
    }


@pytest.mark.parametrize("relative", list(SYMLINKED_DIRS))
def test_a_folder_replaced_by_a_symlink_is_not_followed(
    tmp_path: Path, root: Path, relative: str
) -> None:
    """The folder moved away and a symlink to it planted in its place: no operation reads
    or writes through the link; the writes that need it raise CorruptRecord naming it."""
    fence = populate(FileStore(root))
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / relative, elsewhere)
    (root / relative).symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(elsewhere)

    refused = {}
    for name, op in AGENT_OPS.items():
        store = FileStore(root)  # nothing cached from before
        try:
            op(store, fence)
        except StoreError as exc:
            refused[name] = exc
    seen = _seen(FileStore(root))

    assert snapshot(elsewhere) == before
    assert not any(p.name.startswith("tmp-hb-") for p in elsewhere.rglob("*"))
    for name in SYMLINKED_DIRS[relative]:
        assert isinstance(refused.get(name), CorruptRecord), name
        assert str(root / relative) in str(refused[name]), name
    # Nothing behind the link is read (what is seen was written since, beside it).
    hidden = {"ckpt": "checkpoints", "beats": "heartbeats", "events": "events"}
    for folder, record in hidden.items():
        if folder in relative or relative.count("/") < 3:
            assert seen[record] == [], record
    assert (root / relative).is_symlink()  # reported, not repaired behind the user's back


# -- FIFOs, /dev/zero and folders under record keys ------------------------------------

SINGLE_RECORDS: dict[str, tuple[str, Callable[[FileStore], object]]] = {
    "lease": (KEYS.lease, lambda s: s.read_lease(AGENT)),
    "cluster": (CLUSTER, lambda s: s.read_cluster()),
    "acceptance": (KEYS.acceptance, lambda s: s.read_acceptance(AGENT)),
}


@pytest.mark.parametrize("what", ["fifo", "devzero", "empty-folder"])
@pytest.mark.parametrize("record", list(SINGLE_RECORDS))
def test_a_record_that_is_no_file_reads_as_absent_and_is_replaced(
    store: FileStore, root: Path, record: str, what: str
) -> None:
    """Not opened for long, never read: as if deleted (which a store writer can do anyway);
    the next write of the record puts a plain file in its place."""
    fence = populate(store)
    key, read = SINGLE_RECORDS[record]
    plant(file_key(root, key), what)
    assert read(store) is None
    if record == "lease":
        with pytest.raises(Fenced):  # the fence is a record of its own: still in place
            store.put_checkpoint(AGENT, Fence("n9", "s9", 9), 2, b"stale")
        store.put_checkpoint(AGENT, fence, 2, b"sealed-2")
        written = store.cas_lease(AGENT, None, lease("n2", 2, session="s2"))
        assert store.read_lease(AGENT) == written
        with pytest.raises(Fenced):
            store.put_checkpoint(AGENT, fence, 3, b"stale write")
    elif record == "cluster":
        assert store.create_cluster(cluster(2)) == cluster(2)
    else:
        store.put_acceptance(AGENT, b'{"to_seq": 2}')
        assert store.read_acceptance(AGENT) == b'{"to_seq": 2}'
    assert file_key(root, key).is_file() and not file_key(root, key).is_symlink()


@pytest.mark.parametrize("record", list(SINGLE_RECORDS))
def test_a_record_planted_as_a_folder_with_keys_in_it_is_refused_and_left(
    store: FileStore, root: Path, record: str
) -> None:
    """A folder with something in it is not removed (nothing of ours is in it to judge):
    the write is a StoreError naming it."""
    populate(store)
    key, _read = SINGLE_RECORDS[record]
    path = file_key(root, key)
    path.unlink()
    (path / "inside").mkdir(parents=True)
    write = {
        "lease": lambda: store.cas_lease(AGENT, None, lease("n2", 2)),
        "cluster": lambda: store.create_cluster(cluster(2)),
        "acceptance": lambda: store.put_acceptance(AGENT, b"{}"),
    }[record]
    with pytest.raises(StoreError, match=f"{path} is a folder with keys in it"):
        write()
    assert (path / "inside").is_dir()


@pytest.mark.parametrize("what", ["fifo", "devzero", "empty-folder"])
def test_records_listed_that_are_no_files_are_left_out(
    store: FileStore, root: Path, what: str
) -> None:
    """A checkpoint, a heartbeat or an event that is no regular file is left out of every
    listing and of the tail; a checkpoint of that kind keeps no publish out."""
    fence = populate(store)
    store.put_heartbeat(AGENT, heartbeat("n2"))
    store.append_event(AGENT, event("n2", 1))
    for folder in (KEYS.ckpt, KEYS.node_events("n2")):
        plant(only_file(file_key(root, folder)), what)
    plant(file_key(root, KEYS.beat("n2")), what)
    assert store.list_checkpoints(AGENT) == []
    assert store.list_heartbeats(AGENT) == [heartbeat("n1")]
    assert [(e.node, e.n) for e in store.read_events(AGENT)] == [("n1", 1)]
    read = store.tail(AGENT).read()
    assert read.heartbeats == [heartbeat("n1")]
    assert [(e.node, e.n) for e in read.events] == [("n1", 1)]
    store.put_checkpoint(AGENT, fence, 2, b"sealed-2")
    assert store.read_checkpoint(AGENT, store.list_checkpoints(AGENT)[0]) == b"sealed-2"


@pytest.mark.parametrize("what", ["fifo", "devzero", "empty-folder", "folder"])
def test_a_lock_that_is_no_file_is_moved_aside_and_the_lease_written_again(
    store: FileStore, root: Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Something other than a file as the root's .lock (which no commit could lock) is moved
    aside and reported at the next commit, which then goes through."""
    fence = populate(store)
    lock = root / ".lock"
    if what == "folder":
        lock.unlink()
        (lock / "inside").mkdir(parents=True)
    else:
        plant(lock, what)
    with caplog.at_level(logging.WARNING):
        renewed = store.cas_lease(AGENT, 1, lease("n1", 1))
    assert "moved aside" in caplog.text
    store.put_checkpoint(AGENT, fence_of(renewed), 2, b"sealed-2")
    assert lock.is_file() and not lock.is_symlink()
    assert [p.name.startswith(".lock.planted-") for p in root.iterdir()].count(True) == 1
    assert fence == fence_of(renewed)


def test_an_oversized_lease_is_replaced_against_what_was_found(
    store: FileStore, root: Path
) -> None:
    """A lease planted as a sparse GiB is an UnreadableLease; replace_unreadable_lease against
    what was found puts a lease in its place without reading it, and the old fence is Fenced."""
    fence = populate(store)
    path = file_key(root, KEYS.lease)
    path.unlink()
    with open(path, "wb") as huge:
        huge.truncate(1 << 30)
    with pytest.raises(UnreadableLease) as caught:
        store.read_lease(AGENT)
    new = replace(lease("n2", 2, session="s2"), version=9)
    written = store.replace_unreadable_lease(AGENT, caught.value.found, new)
    assert store.read_lease(AGENT) == written
    with pytest.raises(Fenced):
        store.put_checkpoint(AGENT, fence, 2, b"stale write")


# -- size caps ------------------------------------------------------------------------


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.write(head)
        out.truncate(size)


def test_an_oversized_checkpoint_is_left_out_without_reading_it(
    store: FileStore, root: Path, bytes_read: Callable[[], int], caplog: pytest.LogCaptureFixture
) -> None:
    populate(store)
    info = CheckpointInfo(epoch=1, seq=7, size=MAX_CHECKPOINT_BYTES + 1, written=0.0)
    _sparse(file_key(root, KEYS.checkpoint(info)), MAX_CHECKPOINT_BYTES + 1)
    start = bytes_read()
    with caplog.at_level(logging.WARNING):
        assert [i.seq for i in store.list_checkpoints(AGENT)] == [1]
    assert f"limit of {MAX_CHECKPOINT_BYTES} bytes" in caplog.text
    with pytest.raises(StoreError):
        store.read_checkpoint(AGENT, info)
    assert bytes_read() - start < MAX_RECORD_BYTES


@pytest.mark.parametrize("record", list(SINGLE_RECORDS))
def test_an_oversized_record_is_a_corrupt_record_without_reading_it(
    store: FileStore, root: Path, bytes_read: Callable[[], int], record: str
) -> None:
    populate(store)
    key, read = SINGLE_RECORDS[record]
    _sparse(file_key(root, key), 50 * 1024 * 1024, b'{"holder": ')
    start = bytes_read()
    with pytest.raises(CorruptRecord, match=f"limit of {MAX_RECORD_BYTES} bytes"):
        read(store)
    assert bytes_read() - start < MAX_RECORD_BYTES


def test_oversized_heartbeats_and_events_are_skipped_without_reading_them(
    store: FileStore, root: Path, bytes_read: Callable[[], int]
) -> None:
    populate(store)
    _sparse(file_key(root, KEYS.beat("n2")), 50 * 1024 * 1024)
    _sparse(file_key(root, KEYS.event("n2", 1)), 50 * 1024 * 1024)
    start = bytes_read()
    assert store.list_heartbeats(AGENT) == [heartbeat("n1")]
    assert [(e.node, e.n) for e in store.read_events(AGENT)] == [("n1", 1)]
    read = store.tail(AGENT).read()
    assert read.heartbeats == [heartbeat("n1")]
    assert [(e.node, e.n) for e in read.events] == [("n1", 1)]
    assert bytes_read() - start < 4 * MAX_RECORD_BYTES


# -- checkpoint names ---------------------------------------------------------------


def _named(seq: str, epoch: str) -> str:
    return f"{seq}-{epoch}-{3:010d}-{0:013d}"


JUNK_NAMES = [
    _named(f"{0:020d}", f"{1:010d}"),  # seq 0
    _named(f"{MAX_SEQ + 1:020d}", f"{1:010d}"),  # seq past the limit, written in 20 digits
    _named(f"{3:020d}", f"{0:010d}"),  # epoch 0
    _named(f"{1:021d}", f"{1:010d}"),  # 21 seq digits
    _named(f"{1:020d}", f"{MAX_EPOCH + 1:011d}"),  # epoch past the limit, 11 digits
    "3-1-3-0",  # digits we never write
]


def test_checkpoint_names_out_of_range_are_left_out_and_reported_once(
    store: FileStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fence = populate(store)
    for name in JUNK_NAMES:
        (file_key(root, KEYS.ckpt) / name).write_bytes(b"junk")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert [(i.seq, i.epoch) for i in store.list_checkpoints(AGENT)] == [(1, 1)]
        store.put_checkpoint(AGENT, fence, 2, b"sealed-2")
    for name in JUNK_NAMES:
        assert sum(name in message for message in caplog.messages) == 1, name


@pytest.mark.parametrize(
    ("seq", "epoch", "size", "message"),
    [
        (0, 1, 1, "seq 0 is outside"),
        (MAX_SEQ + 1, 1, 1, f"outside 1..{MAX_SEQ}"),
        (1, MAX_EPOCH + 1, 1, f"outside 1..{MAX_EPOCH}"),
        (1, 1, MAX_CHECKPOINT_BYTES + 1, f"limit of {MAX_CHECKPOINT_BYTES} bytes"),
    ],
    ids=["seq-zero", "seq-too-high", "epoch-too-high", "too-big"],
)
def test_a_checkpoint_the_listing_could_not_show_is_refused_before_anything_is_written(
    store: FileStore, root: Path, seq: int, epoch: int, size: int, message: str
) -> None:
    populate(store)
    before = snapshot(root)
    with pytest.raises(StoreError, match=message) as caught:
        store.put_checkpoint(AGENT, Fence("n1", "s1", epoch), seq, bytes(size))
    assert not isinstance(caught.value, Fenced)
    assert snapshot(root) == before


# -- temporary files and durability --------------------------------------------------


def test_old_temporary_files_are_swept_by_a_node_and_never_by_a_reader(root: Path) -> None:
    populate(FileStore(root))
    old, recent = root / "tmp-hb-000000000001", root / "tmp-hb-000000000002"
    for path, age in ((old, STALE_TEMP_AGE_S + 60), (recent, STALE_TEMP_AGE_S / 4)):
        path.write_bytes(b"left by a crash")
        then = time.time() - age
        os.utime(path, (then, then))
    reader = FileStore(root, create=False)
    reader.list_checkpoints(AGENT)
    assert old.exists()
    FileStore(root)  # a node's open sweeps
    assert not old.exists() and recent.exists()


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the descriptors os.fsync is called on from now on."""
    return record_fsyncs(monkeypatch)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc/self/fd (Linux)")
def test_folders_made_in_the_store_are_fsynced_in_their_parents(
    root: Path, synced: list[str]
) -> None:
    store = FileStore(root)
    real = root.resolve()
    assert str(real) in synced  # kv/, made at a node's open
    synced.clear()
    store.put_heartbeat(AGENT, heartbeat("n1"))
    for parent in (real / "kv", real / "kv" / "agents", real / "kv" / "agents" / AGENT):
        assert str(parent) in synced, parent
