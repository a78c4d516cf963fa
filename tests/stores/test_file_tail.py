"""Following a store incrementally: FileTail (the file store's own) and GenericTail (any store).

A tail returns each event once, in order per node, and every node's current
heartbeat; the file store's tail reads only appended event bytes and heartbeat
files that changed. Rotation of the event segments (``<node>.jsonl`` renamed to
``<node>.jsonl.1`` when full) is forced with ``events_per_segment=5``.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamsterbunker.errors import StoreError
from hamsterbunker.records import Event, Heartbeat
from hamsterbunker.stores.file import FileStore
from hamsterbunker.stores.file.tail import FileTail
from hamsterbunker.stores.tail import GenericTail, Tail, TailRead
from hamsterbunker.testing import MemoryStore
from tests.support.io_probes import bytes_read_by_this_process

AGENT = "agent"
SEGMENT = 5  # events per segment: rotations come quickly


# -- helpers -----------------------------------------------------------------


def event(node: str, n: int, kind: str = "agent.step") -> Event:
    return Event(node=node, n=n, type=kind, time=1700000000.0 + n, epoch=1, seq=n)


def heartbeat(node: str, beats: int = 1, **changes: object) -> Heartbeat:
    fields: dict[str, object] = dict(
        node=node, region="eu", host="h", pid=100, role="standby", epoch=1, seq=0,
        leader=None, time=1700000000.0 + beats, beats=beats,
    )  # fmt: skip
    fields.update(changes)
    return Heartbeat(**fields)  # type: ignore[arg-type]


def ids(events: list[Event]) -> list[tuple[str, int]]:
    return [(e.node, e.n) for e in events]


class Appender:
    """Appends the next event of a node to a store and remembers what was appended."""

    def __init__(self, store: FileStore | MemoryStore) -> None:
        self.store = store
        self.appended: list[Event] = []
        self._n: dict[str, int] = {}

    def __call__(self, node: str) -> Event:
        n = self._n[node] = self._n.get(node, 0) + 1
        made = event(node, n)
        self.store.append_event(AGENT, made)
        self.appended.append(made)
        return made


def events_dir(store: FileStore) -> Path:
    return store.root / "agents" / AGENT / "events"


def heartbeats_dir(store: FileStore) -> Path:
    return store.root / "agents" / AGENT / "heartbeats"


def assert_each_once_in_order(got: list[Event], appended: list[Event]) -> None:
    assert len(ids(got)) == len(set(ids(got))), "an event was returned twice"
    for node in {e.node for e in appended}:
        assert ids([e for e in got if e.node == node]) == ids(
            [e for e in appended if e.node == node]
        ), node


StoreAndTail = tuple[FileStore | MemoryStore, Tail]


@pytest.fixture(params=["file", "generic-memory", "generic-file"])
def store_and_tail(request: pytest.FixtureRequest, tmp_path: Path) -> StoreAndTail:
    """The file store's own tail, and the generic tail over a memory and over a file store."""
    store: FileStore | MemoryStore
    if request.param == "generic-memory":
        store = MemoryStore()
        return store, GenericTail(store, AGENT)
    store = FileStore(tmp_path / "store", events_per_segment=SEGMENT)
    if request.param == "file":
        return store, store.tail(AGENT)
    return store, GenericTail(store, AGENT)


@pytest.fixture(params=["file", "generic-file"])
def file_store_and_tail(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FileStore, Tail]:
    store = FileStore(tmp_path / "store", events_per_segment=SEGMENT)
    tail: Tail = store.tail(AGENT) if request.param == "file" else GenericTail(store, AGENT)
    return store, tail


# -- choosing a tail ---------------------------------------------------------------


def test_store_tail_is_the_file_stores_own_tail_and_the_generic_one_otherwise(
    tmp_path: Path,
) -> None:
    """FileStore.tail is its own FileTail; a store without a cheaper way inherits GenericTail."""
    assert isinstance(FileStore(tmp_path / "store").tail(AGENT), FileTail)
    assert isinstance(MemoryStore().tail(AGENT), GenericTail)


def test_a_tail_of_an_empty_store_reads_nothing(store_and_tail: StoreAndTail) -> None:
    _, tail = store_and_tail
    assert tail.read() == TailRead([], [])
    assert tail.read() == TailRead([], [])


# -- events: each once, in order --------------------------------------------------


def test_every_event_once_with_a_read_after_every_append(store_and_tail: StoreAndTail) -> None:
    store, tail = store_and_tail
    append = Appender(store)
    got: list[Event] = []
    for i in range(120):  # 40 events per node: 8 segments each
        made = append("abc"[i % 3])
        read = tail.read().events
        assert ids(read) == ids([made])
        got += read
    assert_each_once_in_order(got, append.appended)
    assert tail.read().events == []


def test_every_event_once_with_several_appends_between_reads(
    store_and_tail: StoreAndTail,
) -> None:
    store, tail = store_and_tail
    append = Appender(store)
    rng = random.Random(7)
    got: list[Event] = []
    for _ in range(60):
        # Up to a segment's worth per node between reads: at most one rotation unread.
        for node in "abc":
            for _ in range(rng.randint(0, SEGMENT)):
                append(node)
        got += tail.read().events
    assert len(append.appended) > 200
    assert_each_once_in_order(got, append.appended)


def test_the_first_read_returns_both_segments(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store", events_per_segment=SEGMENT)
    append = Appender(store)
    for _ in range(SEGMENT + 3):
        append("a")
    assert (events_dir(store) / "a.jsonl.1").exists()
    assert ids(store.tail(AGENT).read().events) == ids(append.appended)


def test_two_rotations_between_reads_return_what_the_previous_segment_still_holds(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    """The segment read last is gone; .1 and the current one come back whole, nothing twice.

    The segment read last is kept open here, so the filesystem cannot give its inode
    number to the new current segment (see the next test for when it does).
    """
    store, tail = file_store_and_tail
    append = Appender(store)
    for _ in range(2):
        append("a")
    assert ids(tail.read().events) == [("a", 1), ("a", 2)]
    with open(events_dir(store) / "a.jsonl", "rb"):
        for _ in range(2 * SEGMENT + 1):  # events 3..13: rotations at 6 and 11
            append("a")
        got = tail.read().events
    # The segment of events 1-5 was dropped at the second rotation: 3-5 are lost;
    # .1 holds 6-10, the current one 11-13.
    assert ids(got) == [("a", n) for n in range(6, 14)]
    assert tail.read().events == []
    append("a")
    assert ids(tail.read().events) == [("a", 14)]


def test_two_rotations_between_reads_when_the_new_segment_reuses_the_old_inode(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store", events_per_segment=SEGMENT)
    tail = store.tail(AGENT)
    append = Appender(store)
    for _ in range(2):
        append("a")
    assert ids(tail.read().events) == [("a", 1), ("a", 2)]
    read_inode = (events_dir(store) / "a.jsonl").stat().st_ino
    for _ in range(2 * SEGMENT + 3):  # events 3..15: rotations at 6 and 11
        append("a")
    if (events_dir(store) / "a.jsonl").stat().st_ino != read_inode:
        pytest.skip("this filesystem did not reuse the inode number (only ext4-like ones do)")
    assert ids(tail.read().events) == [("a", n) for n in range(6, 16)]


def test_a_partly_written_last_line_waits_until_it_is_complete(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    append = Appender(store)
    append("a")
    assert ids(tail.read().events) == [("a", 1)]
    line = event("a", 2).to_json() + b"\n"
    path = events_dir(store) / "a.jsonl"
    for piece in (line[:10], line[10:-2]):  # the JSON not yet whole
        with open(path, "ab") as out:
            out.write(piece)
        assert tail.read().events == []
    with open(path, "ab") as out:  # the JSON whole, its newline not yet written
        out.write(line[-2:-1])
    got = tail.read().events
    if isinstance(tail, FileTail):
        assert got == []  # the file tail waits for the newline
    # (The generic tail over read_events takes a line ending in "}" as written.)
    with open(path, "ab") as out:
        out.write(line[-1:])
    got += tail.read().events
    assert ids(got) == [("a", 2)]
    assert tail.read().events == []
    with open(path, "ab") as out:  # and what follows is read from the right place
        out.write(event("a", 3).to_json() + b"\n")
    assert ids(tail.read().events) == [("a", 3)]


# -- events: read incrementally ------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io (Linux)")
def test_only_appended_event_bytes_are_read_and_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path / "store", events_per_segment=10_000)
    padding = "x" * 1000
    for n in range(1, 1001):  # about 1.1 MB of events in the current segment
        store.append_event(AGENT, Event("a", n, "agent.step", 1.0, detail={"pad": padding}))
    size = (events_dir(store) / "a.jsonl").stat().st_size
    assert size > 1_000_000
    tail = store.tail(AGENT)
    before = bytes_read_by_this_process()
    assert len(tail.read().events) == 1000
    first_read = bytes_read_by_this_process() - before
    assert first_read >= size  # the measure sees the tail's reads

    parsed = _count_parses(monkeypatch, Event)
    store.append_event(AGENT, event("a", 1001))
    before = bytes_read_by_this_process()
    assert ids(tail.read().events) == [("a", 1001)]
    assert bytes_read_by_this_process() - before < 20_000  # the new line, not the megabyte
    assert len(parsed) == 1
    before = bytes_read_by_this_process()
    assert tail.read().events == []
    assert bytes_read_by_this_process() - before < 20_000
    assert len(parsed) == 1


def test_old_bytes_rewritten_in_place_are_not_read_again(tmp_path: Path) -> None:
    """Bytes already read are not looked at again: a forged event put there is never returned."""
    store = FileStore(tmp_path / "store", events_per_segment=100)
    tail = store.tail(AGENT)
    append = Appender(store)
    for _ in range(3):
        append("a")
    assert ids(tail.read().events) == [("a", 1), ("a", 2), ("a", 3)]
    path = events_dir(store) / "a.jsonl"
    # The first line stays: with the inode it is how the tail knows its segment.
    head, _, old = path.read_bytes().partition(b"\n")
    forged = event("a", 999, "forged").to_json()
    forged = forged[:-1] + b',"z":"' + b"z" * (len(old) - len(forged) - 8) + b'"}\n'
    assert len(forged) == len(old)
    with open(path, "r+b") as out:  # same file, same size, new content after the head
        out.seek(len(head) + 1)
        out.write(forged)
    append("a")
    assert ids(tail.read().events) == [("a", 4)]


# -- heartbeats ---------------------------------------------------------------


def _count_parses(monkeypatch: pytest.MonkeyPatch, record: type[Any]) -> list[bytes]:
    """Every byte string record.from_json is given from now on (the parse still happens)."""
    parsed: list[bytes] = []
    original = record.from_json.__func__

    def counting(cls: type[Any], data: bytes) -> Any:
        parsed.append(data)
        return original(cls, data)

    monkeypatch.setattr(record, "from_json", classmethod(counting))
    return parsed


def test_only_changed_heartbeat_files_are_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path / "store")
    tail = store.tail(AGENT)
    for node in "abc":
        store.put_heartbeat(AGENT, heartbeat(node))
    parsed = _count_parses(monkeypatch, Heartbeat)
    assert tail.read().heartbeats == [heartbeat("a"), heartbeat("b"), heartbeat("c")]
    assert len(parsed) == 3
    for _ in range(3):  # nothing changed: the cached beats, nothing parsed
        assert tail.read().heartbeats == [heartbeat("a"), heartbeat("b"), heartbeat("c")]
    assert len(parsed) == 3
    store.put_heartbeat(AGENT, heartbeat("b", beats=2))
    assert tail.read().heartbeats == [heartbeat("a"), heartbeat("b", 2), heartbeat("c")]
    assert len(parsed) == 4
    assert b'"node":"b"' in parsed[-1]
    for beats in range(3, 8):  # a heartbeat written again and again is read each time
        store.put_heartbeat(AGENT, heartbeat("c", beats=beats))
        assert tail.read().heartbeats[2] == heartbeat("c", beats)
    assert len(parsed) == 9


def test_a_removed_heartbeat_drops_out(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    for node in "ab":
        store.put_heartbeat(AGENT, heartbeat(node))
    assert [b.node for b in tail.read().heartbeats] == ["a", "b"]
    store.remove_heartbeat(AGENT, "a")
    assert [b.node for b in tail.read().heartbeats] == ["b"]
    store.put_heartbeat(AGENT, heartbeat("a", beats=5))  # and comes back
    assert tail.read().heartbeats == [heartbeat("a", 5), heartbeat("b")]


def test_a_heartbeat_removed_from_a_memory_store_drops_out() -> None:
    store = MemoryStore()
    tail = GenericTail(store, AGENT)
    for node in "ab":
        store.put_heartbeat(AGENT, heartbeat(node))
    assert [b.node for b in tail.read().heartbeats] == ["a", "b"]
    store.remove_heartbeat(AGENT, "a")
    assert [b.node for b in tail.read().heartbeats] == ["b"]


def test_sync_conflict_copies_and_copies_under_another_name_are_ignored(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    Appender(store)("a")
    beats, events = heartbeats_dir(store), events_dir(store)
    other = heartbeat("a", beats=9, role="active").to_json()
    (beats / "a.sync-conflict-20240101-123456-ABCDEFG.json").write_bytes(other)
    (beats / "z.sync-conflict-1.json").write_bytes(heartbeat("z").to_json())
    (beats / "b.json").write_bytes(other)  # node a's record under b's name
    lines = event("a", 2).to_json() + b"\n" + event("z", 1).to_json() + b"\n"
    (events / "a.sync-conflict-20240101-123456-ABCDEFG.jsonl").write_bytes(lines)
    (events / "b.jsonl").write_bytes(lines)  # node a's events in b's file
    read = tail.read()
    assert read.heartbeats == [heartbeat("a")]
    assert ids(read.events) == [("a", 1)]
    assert tail.read() == TailRead([], [heartbeat("a")])


def test_a_corrupt_heartbeat_is_skipped_until_it_is_whole_again(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    (heartbeats_dir(store) / "c.json").write_bytes(b'{"node": "c", "beats": ')
    (heartbeats_dir(store) / "d.json").write_bytes(b'{"node": "d"}')  # fields missing
    assert tail.read().heartbeats == [heartbeat("a")]
    assert tail.read().heartbeats == [heartbeat("a")]
    store.put_heartbeat(AGENT, heartbeat("c", beats=3))
    assert tail.read().heartbeats == [heartbeat("a"), heartbeat("c", 3)]


def test_corrupt_event_lines_are_skipped(file_store_and_tail: tuple[FileStore, Tail]) -> None:
    store, tail = file_store_and_tail
    append = Appender(store)
    append("a")
    with open(events_dir(store) / "a.jsonl", "ab") as out:
        out.write(b'{"node": "a", "n": "two"}\n\xff\xfe not json }\n')
    append("a")
    assert ids(tail.read().events) == [("a", 1), ("a", 2)]


# -- the store going away -------------------------------------------------------


def test_a_removed_store_directory_reads_as_empty(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    """What the code does: a store directory that is gone reads as no events, no heartbeats."""
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    Appender(store)("a")
    assert len(tail.read().events) == 1
    shutil.rmtree(store.root)
    assert tail.read() == TailRead([], [])
    assert tail.read() == TailRead([], [])


def test_an_events_directory_that_is_not_a_directory_is_a_store_error(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    Appender(store)("a")
    assert len(tail.read().events) == 1
    shutil.rmtree(events_dir(store))
    events_dir(store).write_bytes(b"not a directory")
    with pytest.raises(StoreError):
        tail.read()


# -- the file tail and the generic tail agree ---------------------------------------

# A history: steps of (node, appends) or None for a read. At most a segment's worth
# of appends per node between two reads (more rotations lose events by design).
_history = st.lists(
    st.one_of(st.none(), st.tuples(st.sampled_from("abc"), st.integers(1, SEGMENT))),
    min_size=1,
    max_size=25,
)


def _per_read(history: list[tuple[str, int] | None], make: Callable[[], StoreAndTail]) -> list:
    store, tail = make()
    append = Appender(store)
    pending: dict[str, int] = {}
    reads: list[TailRead] = []
    for step in [*history, None]:
        if step is None:
            reads.append(tail.read())
            pending.clear()
            continue
        node, count = step
        count = min(count, SEGMENT - pending.get(node, 0))
        pending[node] = pending.get(node, 0) + count
        for _ in range(count):
            append(node)
        store.put_heartbeat(AGENT, heartbeat(node, beats=append._n[node]))
    return [(ids(read.events), read.heartbeats) for read in reads]


@settings(max_examples=40, deadline=None)
@given(_history)
def test_the_file_tail_and_the_generic_tail_return_the_same(
    history: list[tuple[str, int] | None],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def file_tail() -> StoreAndTail:
            store = FileStore(root / "file", events_per_segment=SEGMENT)
            return store, store.tail(AGENT)

        def generic_over_file() -> StoreAndTail:
            store = FileStore(root / "generic", events_per_segment=SEGMENT)
            return store, GenericTail(store, AGENT)

        def generic_over_memory() -> StoreAndTail:
            store = MemoryStore()
            return store, GenericTail(store, AGENT)

        expected = _per_read(history, generic_over_memory)
        assert _per_read(history, file_tail) == expected
        assert _per_read(history, generic_over_file) == expected
