"""The file store against what a store writer without the secret can plant (DESIGN.md inv. 10).

Symlinks (to a victim file, to /dev/zero, in place of a directory), FIFOs,
oversized files and checkpoint names with numbers we never write: each gives
a prompt CorruptRecord where the caller needs that record, or is reported and
skipped where it reads many; nothing is written through a link, no read
blocks, none goes past its cap. Also here: junk checkpoints under another
epoch never block a publish, and leftover temp files are swept, and new
directories fsynced.

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

from hamsterbunker.errors import CorruptRecord, Fenced, StoreError, UnreadableLease
from hamsterbunker.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EPOCH,
    MAX_RECORD_BYTES,
    MAX_SEQ,
    STALE_TEMP_AGE_S,
)
from hamsterbunker.memory import Memory, MemoryFile
from hamsterbunker.reach import Reach
from hamsterbunker.records import CheckpointInfo, Event
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.file import FileStore
from tests.support.io_probes import bytes_read_by_this_process, record_fsyncs
from tests.support.records import cluster, event, fence_of, heartbeat, lease

pytestmark = pytest.mark.timeout(20)  # a FIFO or /dev/zero read would otherwise hang

AGENT = "a"
HAS_PROC_IO = Path("/proc/self/io").exists()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(root, keep_checkpoints=3, events_per_segment=4)


def agent_dir(root: Path) -> Path:
    return root / "agents" / AGENT


def ckpt_name(seq: int, epoch: int) -> str:
    return f"ckpt-{seq:020d}-{epoch:010d}.hbc"


def populate(store: FileStore) -> Fence:
    """One of each record for agent a, written by node n1; returns the lease's fence."""
    store.create_cluster(cluster(1))
    held = store.cas_lease(AGENT, None, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(held), 1, b"sealed-1")
    store.put_heartbeat(AGENT, heartbeat("n1"))
    store.append_event(AGENT, event("n1", 1))
    return fence_of(held)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below directory with its bytes (links not followed)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def plant(path: Path, what: str) -> None:
    """Put a FIFO, or a symlink to /dev/zero, where path is (replacing it)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.fixture
def bytes_read() -> Iterator[Callable[[], int]]:
    """Bytes read(2) returned to this process since the fixture started."""
    if not HAS_PROC_IO:
        pytest.skip("needs /proc/self/io (Linux)")
    start = bytes_read_by_this_process()
    yield lambda: bytes_read_by_this_process() - start


# -- symlinks ---------------------------------------------------------------------


@pytest.mark.parametrize("counted", [False, True], ids=["fresh-store", "count-cached"])
def test_an_event_log_symlinked_to_the_nodes_memory_file_is_not_written_through(
    tmp_path: Path, root: Path, counted: bool
) -> None:
    """The issue's case: events/<node>.jsonl -> the node's memory file. The memory file is
    unchanged; the event goes to a new, plain log (or the append fails, then recovers)."""
    memory = MemoryFile(tmp_path / "state", root.as_uri(), AGENT)
    memory.save(Memory(epoch=3, reach=Reach(7, 3)))
    victim = memory.path.read_bytes()
    store = FileStore(root, events_per_segment=100)
    store.append_event(AGENT, event("n1", 1))
    if not counted:
        store = FileStore(root, events_per_segment=100)  # knows nothing of the log
    log_path = agent_dir(root) / "events" / "n1.jsonl"
    log_path.unlink()
    log_path.symlink_to(memory.path)

    if counted:  # it counted the log as a plain file: the open refuses, the next append heals
        with pytest.raises(CorruptRecord, match="symbolic link"):
            store.append_event(AGENT, event("n1", 2))
    store.append_event(AGENT, event("n1", 3))

    assert memory.path.read_bytes() == victim
    assert MemoryFile(tmp_path / "state", root.as_uri(), AGENT).load() == Memory(3, Reach(7, 3))
    assert not log_path.is_symlink() and log_path.is_file()  # the link was moved aside
    assert [e.n for e in store.read_events(AGENT)] == [3]


def test_records_symlinked_to_valid_ones_elsewhere_are_not_read(
    tmp_path: Path, store: FileStore, root: Path
) -> None:
    """A symlink to a well-formed record outside the store is still a symlink: not read."""
    populate(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "beat.json").write_bytes(heartbeat("n2").to_json())
    (outside / "log.jsonl").write_bytes(event("n2", 1).to_json() + b"\n")
    (agent_dir(root) / "heartbeats" / "n2.json").symlink_to(outside / "beat.json")
    (agent_dir(root) / "events" / "n2.jsonl").symlink_to(outside / "log.jsonl")
    assert store.list_heartbeats(AGENT) == [heartbeat("n1")]
    assert [(e.node, e.n) for e in store.read_events(AGENT)] == [("n1", 1)]
    read = store.tail(AGENT).read()
    assert read.heartbeats == [heartbeat("n1")]
    assert [(e.node, e.n) for e in read.events] == [("n1", 1)]


AGENT_OPS: dict[str, Callable[[FileStore, Fence], object]] = {
    "read_lease": lambda s, f: s.read_lease(AGENT),
    "cas_lease": lambda s, f: s.cas_lease(AGENT, 1, lease("n1", 1)),
    "put_checkpoint": lambda s, f: s.put_checkpoint(AGENT, f, 2, b"sealed-2"),
    "list_checkpoints": lambda s, f: s.list_checkpoints(AGENT),
    "read_checkpoint": lambda s, f: s.read_checkpoint(AGENT, CheckpointInfo(1, 1, 8, 0.0)),
    "put_heartbeat": lambda s, f: s.put_heartbeat(AGENT, heartbeat("n2")),
    "list_heartbeats": lambda s, f: s.list_heartbeats(AGENT),
    "remove_heartbeat": lambda s, f: s.remove_heartbeat(AGENT, "n1"),
    "append_event": lambda s, f: s.append_event(AGENT, event("n1", 2)),
    "read_events": lambda s, f: s.read_events(AGENT),
    "tail": lambda s, f: s.tail(AGENT).read(),
    "read_acceptance": lambda s, f: s.read_acceptance(AGENT),
    "put_acceptance": lambda s, f: s.put_acceptance(AGENT, b"{}"),
}
_EVERY_OP = set(AGENT_OPS)
# The operations that must refuse when that directory is a symlink. A write of
# another kind may refuse too (a first write makes every directory of the agent).
SYMLINKED_DIRS = {
    "agents": _EVERY_OP,
    f"agents/{AGENT}": _EVERY_OP,
    f"agents/{AGENT}/checkpoints": {"put_checkpoint", "list_checkpoints", "read_checkpoint"},
    f"agents/{AGENT}/heartbeats": {"put_heartbeat", "list_heartbeats", "remove_heartbeat", "tail"},
    f"agents/{AGENT}/events": {"append_event", "read_events", "tail"},
}


@pytest.mark.parametrize("relative", list(SYMLINKED_DIRS))
def test_a_directory_replaced_by_a_symlink_is_not_followed(
    tmp_path: Path, root: Path, relative: str
) -> None:
    """The directory moved away and a symlink to it planted in its place: no operation
    reads or writes through the link; those that need it raise CorruptRecord naming it."""
    fence = populate(FileStore(root, events_per_segment=100))
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / relative, elsewhere)
    (root / relative).symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(elsewhere)

    refused = {}
    for name, op in AGENT_OPS.items():
        store = FileStore(root, events_per_segment=100)  # nothing cached from before
        try:
            op(store, fence)
        except StoreError as exc:
            refused[name] = exc

    assert snapshot(elsewhere) == before
    assert not any(p.name.startswith("tmp-hb-") for p in elsewhere.rglob("*"))
    for name in SYMLINKED_DIRS[relative]:
        assert isinstance(refused.get(name), CorruptRecord), name
        assert str(root / relative) in str(refused[name]), name
    assert (root / relative).is_symlink()  # reported, not repaired behind the user's back


# -- FIFOs and /dev/zero under record names -----------------------------------------


@pytest.mark.parametrize("what", ["fifo", "devzero"])
def test_a_checkpoint_that_is_a_fifo_or_dev_zero_is_left_out_and_refused(
    store: FileStore, root: Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    fence = populate(store)
    plant(agent_dir(root) / "checkpoints" / ckpt_name(5, 1), what)
    with caplog.at_level(logging.WARNING):
        assert [(i.seq, i.epoch) for i in store.list_checkpoints(AGENT)] == [(1, 1)]
    assert ckpt_name(5, 1) in caplog.text
    with pytest.raises(CorruptRecord, match=ckpt_name(5, 1)):
        store.read_checkpoint(AGENT, CheckpointInfo(epoch=1, seq=5, size=0, written=0.0))
    # Not a checkpoint of the epoch: it does not block a publish either.
    store.put_checkpoint(AGENT, fence, 2, b"sealed-2")
    assert store.read_checkpoint(AGENT, store.list_checkpoints(AGENT)[0]) == b"sealed-2"


@pytest.mark.parametrize("what", ["fifo", "devzero"])
def test_a_lease_that_is_a_fifo_or_dev_zero_is_a_corrupt_record(
    store: FileStore, root: Path, what: str
) -> None:
    fence = populate(store)
    plant(agent_dir(root) / "lease.json", what)
    checks: list[Callable[[], object]] = [
        lambda: store.cas_lease(AGENT, 1, lease("n1", 1)),
        lambda: store.put_checkpoint(AGENT, fence, 2, b"sealed-2"),
        lambda: store.read_lease(AGENT),
    ]
    for check in checks:
        with pytest.raises(CorruptRecord, match=r"lease\.json"):
            check()


@pytest.mark.parametrize("what", ["fifo", "devzero", "empty-directory", "directory"])
def test_a_lease_lock_that_is_no_file_is_moved_aside_and_the_lease_written_again(
    store: FileStore, root: Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One write of something other than a file as lease.lock (which no lease operation can
    lock) is moved aside and reported at the next operation, which then goes through."""
    fence = populate(store)
    lock = agent_dir(root) / "lease.lock"
    if what.endswith("directory"):
        lock.unlink()
        lock.mkdir()
        if what == "directory":
            (lock / "inside").write_bytes(b"x")
    else:
        plant(lock, what)
    with caplog.at_level(logging.WARNING):
        renewed = store.cas_lease(AGENT, 1, lease("n1", 1))
    assert "moved aside" in caplog.text
    store.put_checkpoint(AGENT, fence_of(renewed), 2, b"sealed-2")
    assert lock.is_file() and not lock.is_symlink()
    assert [p.name.startswith("lease.lock.planted-") for p in agent_dir(root).iterdir()].count(
        True
    ) == 1
    assert fence == fence_of(renewed)


@pytest.mark.parametrize("what", ["fifo", "devzero", "huge", "empty-directory"])
def test_a_lease_json_that_is_no_record_is_replaced_against_what_was_found(
    store: FileStore, root: Path, what: str
) -> None:
    """A lease.json planted as a FIFO, a link to /dev/zero, a sparse GiB or an empty directory
    is an UnreadableLease naming it; replace_unreadable_lease against what was found puts a
    lease in its place without reading it, and a write under the old fence is Fenced."""
    fence = populate(store)
    path = agent_dir(root) / "lease.json"
    if what in ("fifo", "devzero"):
        plant(path, what)
    else:
        path.unlink()
        if what == "huge":
            with open(path, "wb") as f:
                f.truncate(1 << 30)
        else:
            path.mkdir()
    with pytest.raises(UnreadableLease, match=r"lease\.json") as caught:
        store.read_lease(AGENT)
    new = replace(lease("n2", 2, session="s2"), version=9)
    written = store.replace_unreadable_lease(AGENT, caught.value.found, new)
    assert store.read_lease(AGENT) == written
    with pytest.raises(Fenced):
        store.put_checkpoint(AGENT, fence, 2, b"stale write")


def test_a_lease_json_that_is_a_directory_with_contents_is_refused_and_left(
    store: FileStore, root: Path
) -> None:
    """A lease.json planted as a directory with something in it is not removed (nothing of
    ours is in it to judge): the replacement is a StoreError that says to remove it."""
    populate(store)
    path = agent_dir(root) / "lease.json"
    path.unlink()
    (path / "inside").mkdir(parents=True)
    with pytest.raises(UnreadableLease) as caught:
        store.read_lease(AGENT)
    with pytest.raises(StoreError, match="a directory that is not empty: remove it"):
        store.replace_unreadable_lease(AGENT, caught.value.found, lease("n2", 2))
    assert (path / "inside").is_dir()


@pytest.mark.parametrize("what", ["fifo", "devzero"])
def test_a_cluster_record_that_is_a_fifo_or_dev_zero_is_a_corrupt_record(
    root: Path, what: str
) -> None:
    root.mkdir()
    plant(root / "cluster.json", what)
    store = FileStore(root)
    with pytest.raises(CorruptRecord, match=r"cluster\.json"):
        store.read_cluster()
    with pytest.raises(CorruptRecord, match=r"cluster\.json"):
        store.create_cluster(cluster(1))
    assert (root / "cluster.json").is_symlink() == (what == "devzero")


@pytest.mark.parametrize("what", ["fifo", "devzero"])
def test_an_acceptance_record_that_is_a_fifo_or_dev_zero_is_a_corrupt_record(
    store: FileStore, root: Path, what: str
) -> None:
    populate(store)
    plant(agent_dir(root) / "acceptance.json", what)
    with pytest.raises(CorruptRecord, match=r"acceptance\.json"):
        store.read_acceptance(AGENT)


@pytest.mark.parametrize("what", ["fifo", "devzero"])
def test_a_heartbeat_that_is_a_fifo_or_dev_zero_is_skipped(
    store: FileStore, root: Path, what: str
) -> None:
    populate(store)
    store.put_heartbeat(AGENT, heartbeat("n2"))
    plant(agent_dir(root) / "heartbeats" / "n2.json", what)
    assert store.list_heartbeats(AGENT) == [heartbeat("n1")]
    assert store.tail(AGENT).read().heartbeats == [heartbeat("n1")]


@pytest.mark.parametrize("what", ["fifo", "devzero"])
@pytest.mark.parametrize("segment", ["n2.jsonl", "n2.jsonl.1"])
def test_an_event_log_that_is_a_fifo_or_dev_zero_is_skipped(
    store: FileStore, root: Path, segment: str, what: str
) -> None:
    populate(store)
    store.append_event(AGENT, event("n2", 1))
    plant(agent_dir(root) / "events" / segment, what)
    expected = [("n1", 1)] if segment == "n2.jsonl" else [("n1", 1), ("n2", 1)]
    assert [(e.node, e.n) for e in store.read_events(AGENT)] == expected
    assert [(e.node, e.n) for e in store.tail(AGENT).read().events] == expected


@pytest.mark.parametrize("what", ["fifo", "devzero"])
def test_the_nodes_own_event_log_as_a_fifo_or_dev_zero_is_moved_aside(
    root: Path, what: str
) -> None:
    """A fresh node finds junk under its own log's name: it moves it aside, writes a new log."""
    FileStore(root).append_event(AGENT, event("n1", 1))
    plant(agent_dir(root) / "events" / "n1.jsonl", what)
    store = FileStore(root)
    store.append_event(AGENT, event("n1", 2))
    assert (agent_dir(root) / "events" / "n1.jsonl").is_file()
    assert [e.n for e in store.read_events(AGENT)] == [2]


# -- size caps ------------------------------------------------------------------------


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    with open(path, "wb") as out:
        out.write(head)
        out.truncate(size)


def test_an_oversized_checkpoint_is_refused_without_reading_it(
    store: FileStore, root: Path, bytes_read: Callable[[], int]
) -> None:
    populate(store)
    _sparse(agent_dir(root) / "checkpoints" / ckpt_name(7, 1), MAX_CHECKPOINT_BYTES + 1)
    info = store.list_checkpoints(AGENT)[0]
    assert (info.seq, info.size) == (7, MAX_CHECKPOINT_BYTES + 1)
    start = bytes_read()
    with pytest.raises(CorruptRecord, match=f"limit of {MAX_CHECKPOINT_BYTES} bytes"):
        store.read_checkpoint(AGENT, info)
    assert bytes_read() - start < MAX_RECORD_BYTES


@pytest.mark.parametrize("name", ["cluster.json", "lease.json", "acceptance.json"])
def test_an_oversized_record_is_a_corrupt_record_without_reading_it(
    store: FileStore, root: Path, bytes_read: Callable[[], int], name: str
) -> None:
    populate(store)
    path = root / name if name == "cluster.json" else agent_dir(root) / name
    _sparse(path, 50 * 1024 * 1024, b'{"holder": ')
    read = {
        "cluster.json": store.read_cluster,
        "lease.json": lambda: store.read_lease(AGENT),
        "acceptance.json": lambda: store.read_acceptance(AGENT),
    }[name]
    start = bytes_read()
    with pytest.raises(CorruptRecord, match=f"limit of {MAX_RECORD_BYTES} bytes"):
        read()
    assert bytes_read() - start < MAX_RECORD_BYTES


def test_oversized_heartbeats_and_event_logs_are_skipped_without_reading_them(
    store: FileStore, root: Path, bytes_read: Callable[[], int]
) -> None:
    populate(store)
    _sparse(agent_dir(root) / "heartbeats" / "n2.json", 50 * 1024 * 1024)
    _sparse(agent_dir(root) / "events" / "n2.jsonl", 50 * 1024 * 1024)
    start = bytes_read()
    assert store.list_heartbeats(AGENT) == [heartbeat("n1")]
    assert [(e.node, e.n) for e in store.read_events(AGENT)] == [("n1", 1)]
    assert bytes_read() - start < store.segment_cap


def test_an_oversized_log_of_the_node_itself_is_rotated_without_reading_it(
    root: Path, bytes_read: Callable[[], int]
) -> None:
    FileStore(root).append_event(AGENT, event("n1", 1))
    _sparse(agent_dir(root) / "events" / "n1.jsonl", 50 * 1024 * 1024)
    store = FileStore(root, events_per_segment=4)
    start = bytes_read()
    store.append_event(AGENT, event("n1", 2))
    assert bytes_read() - start < store.segment_cap
    assert (agent_dir(root) / "events" / "n1.jsonl").stat().st_size < 1000


def test_the_tail_reads_at_most_its_cap_per_call_and_still_moves_on(
    store: FileStore, root: Path, bytes_read: Callable[[], int]
) -> None:
    """A log of three caps' worth of junk without a line end, then a real event: each read
    takes at most a cap, passes over the junk, and the event arrives within a few reads."""
    populate(store)
    cap = store.segment_cap
    junk = b"x" * (3 * cap) + b"\n" + event("n2", 1).to_json() + b"\n"
    (agent_dir(root) / "events" / "n2.jsonl").write_bytes(junk)
    tail = store.tail(AGENT)
    got: list[Event] = []
    for _ in range(6):
        start = bytes_read()
        got += tail.read().events
        assert bytes_read() - start <= cap + 64 * 1024
    assert sorted((e.node, e.n) for e in got) == [("n1", 1), ("n2", 1)]


def test_an_idle_tail_does_not_read_a_long_first_line_again(
    store: FileStore, root: Path, bytes_read: Callable[[], int]
) -> None:
    """A planted first line of nearly a cap is not read whole on every call: to know its
    segment again the tail compares at most a record's length of it."""
    populate(store)
    line = b"x" * (store.segment_cap - 2) + b"\n"
    (agent_dir(root) / "events" / "n2.jsonl").write_bytes(line)
    tail = store.tail(AGENT)
    assert [(e.node, e.n) for e in tail.read().events] == [("n1", 1)]
    start = bytes_read()
    for _ in range(3):
        assert tail.read().events == []
    assert bytes_read() - start < 4 * MAX_RECORD_BYTES


# -- checkpoint numbers ---------------------------------------------------------------

JUNK_NAMES = [
    ckpt_name(0, 1),  # seq 0
    ckpt_name(MAX_SEQ + 1, 1),  # seq past the limit, written in 20 digits
    ckpt_name(3, 0),  # epoch 0
    f"ckpt-{1:021d}-{1:010d}.hbc",  # 21 seq digits
    f"ckpt-{1:020d}-{MAX_EPOCH + 1:011d}.hbc",  # epoch past the limit, 11 digits
    "ckpt-3-1.hbc",  # digits we never write
    "ckpt-" + "\u0660" * 19 + "\u0663-" + "\u0660" * 9 + "\u0661.hbc",  # Arabic-Indic 3 and 1
]


def test_checkpoint_names_out_of_range_are_left_out_and_reported_once(
    store: FileStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fence = populate(store)
    for name in JUNK_NAMES:
        (agent_dir(root) / "checkpoints" / name).write_bytes(b"junk")
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.file"):
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


def test_junk_of_another_epoch_above_seq_neither_blocks_nor_is_pruned(
    store: FileStore, root: Path
) -> None:
    """A file ckpt-<huge seq>-<other epoch> (no secret needed) must not stop the leader."""
    old = store.cas_lease(AGENT, None, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(old), 1, b"sealed-1")
    held = store.cas_lease(AGENT, old.version, lease("n2", 2, session="s2"))
    checkpoints = agent_dir(root) / "checkpoints"
    for junk in (ckpt_name(MAX_SEQ, 1), ckpt_name(10**9, 9)):
        (checkpoints / junk).write_bytes(b"junk")
    for seq in range(2, 8):  # keep_checkpoints=3: retention runs on every publish
        store.put_checkpoint(AGENT, fence_of(held), seq, b"sealed-%d" % seq)
    assert [(i.seq, i.epoch) for i in store.list_checkpoints(AGENT)] == [
        (MAX_SEQ, 1), (10**9, 9), (7, 2), (6, 2), (5, 2),
    ]  # fmt: skip


def test_a_checkpoint_of_another_epoch_at_the_same_seq_does_not_block(
    store: FileStore, root: Path
) -> None:
    held = store.cas_lease(AGENT, None, lease("n1", 2))
    (agent_dir(root) / "checkpoints").mkdir(exist_ok=True)
    (agent_dir(root) / "checkpoints" / ckpt_name(5, 9)).write_bytes(b"junk")
    store.put_checkpoint(AGENT, fence_of(held), 5, b"sealed-5")
    assert [(i.seq, i.epoch) for i in store.list_checkpoints(AGENT)] == [(5, 9), (5, 2)]


@pytest.mark.parametrize("seq", [5, 4, 1], ids=["equal", "lower", "lowest"])
def test_a_checkpoint_of_the_fences_own_epoch_at_or_above_seq_blocks(
    store: FileStore, root: Path, seq: int
) -> None:
    """A term numbers upwards: its own checkpoint at or above seq refuses the write, even one
    that arrived by other means than this store's put_checkpoint."""
    held = store.cas_lease(AGENT, None, lease("n1", 2))
    store.put_checkpoint(AGENT, fence_of(held), 3, b"sealed-3")
    (agent_dir(root) / "checkpoints" / ckpt_name(5, 2)).write_bytes(b"planted")
    before = snapshot(root)
    with pytest.raises(StoreError, match="must increase") as caught:
        store.put_checkpoint(AGENT, fence_of(held), seq, b"not above")
    assert not isinstance(caught.value, Fenced)
    assert snapshot(root) == before
    store.put_checkpoint(AGENT, fence_of(held), 6, b"sealed-6")


# -- temporary files and durability --------------------------------------------------


def _make_temps(directory: Path, age: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"tmp-hb-{int(age):012d}"
    path.write_bytes(b"left by a crash")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_old_temporary_files_are_swept_when_the_store_opens_and_an_agent_is_written(
    root: Path,
) -> None:
    populate(FileStore(root))
    directories = [root, agent_dir(root), *(agent_dir(root) / s for s in
                   ("checkpoints", "heartbeats", "events"))]  # fmt: skip
    old = [_make_temps(d, STALE_TEMP_AGE_S + 60) for d in directories]
    recent = [_make_temps(d, STALE_TEMP_AGE_S / 4) for d in directories]

    reader = FileStore(root, create=False)  # a reader removes nothing
    reader.list_checkpoints(AGENT)
    assert all(p.exists() for p in old)

    store = FileStore(root)
    assert not old[0].exists()  # the root's: at open
    # The agent's: at the first write in each of its directories.
    held = store.cas_lease(AGENT, 1, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(held), 2, b"sealed-2")
    store.put_heartbeat(AGENT, heartbeat("n1"))
    store.append_event(AGENT, event("n1", 2))
    assert [p for p in old if p.exists()] == []
    assert all(p.exists() for p in recent)


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the descriptors os.fsync is called on from now on."""
    return record_fsyncs(monkeypatch)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc/self/fd (Linux)")
def test_directories_made_in_the_store_are_fsynced_in_their_parents(
    root: Path, synced: list[str]
) -> None:
    store = FileStore(root)
    store.put_heartbeat(AGENT, heartbeat("n1"))  # a heartbeat itself is not fsynced
    real = root.resolve()
    for parent in (real, real / "agents", real / "agents" / AGENT):
        assert str(parent) in synced, parent
    synced.clear()
    store.put_acceptance(AGENT, b'{"to_seq": 3}')  # a durable write: its directory too
    assert str(real / "agents" / AGENT) in synced
