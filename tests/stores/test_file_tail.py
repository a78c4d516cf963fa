"""Following a store incrementally: GenericTail over the file store and the memory store.

A tail returns each event once, in order per node, and every node's current
heartbeat, whatever a store writer planted beside them under the record layer's
keys (``ROOT/kv/``). The file store's tail is the generic one: each event is a
key of its own, written whole, so no tail of its own is needed to read appended
bytes only.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamsterbunker.core.errors import StoreUnavailable
from hamsterbunker.records import Event, Heartbeat
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.stores.tail import GenericTail, Tail, TailRead
from hamsterbunker.testing import MemoryStore
from tests.support.raw_store import file_key

AGENT = "agent"
KEYS = AgentKeys(AGENT)
EVENTS_KEPT = 1000  # events per node: none falls off in these tests


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


def plant(store: FileStore, key: str, data: bytes) -> None:
    """Write data as a file under key, as a store writer without the secret would."""
    path = file_key(store.root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def assert_each_once_in_order(got: list[Event], appended: list[Event]) -> None:
    assert len(ids(got)) == len(set(ids(got))), "an event was returned twice"
    for node in {e.node for e in appended}:
        assert ids([e for e in got if e.node == node]) == ids(
            [e for e in appended if e.node == node]
        ), node


StoreAndTail = tuple[FileStore | MemoryStore, Tail]


@pytest.fixture(params=["memory", "file"])
def store_and_tail(request: pytest.FixtureRequest, tmp_path: Path) -> StoreAndTail:
    """The tail every store offers (Store.tail), over a memory and over a file store."""
    store: FileStore | MemoryStore
    if request.param == "memory":
        store = MemoryStore()
    else:
        store = FileStore(tmp_path / "store", events_per_node=EVENTS_KEPT)
    return store, store.tail(AGENT)


@pytest.fixture
def file_store_and_tail(tmp_path: Path) -> tuple[FileStore, Tail]:
    store = FileStore(tmp_path / "store", events_per_node=EVENTS_KEPT)
    return store, store.tail(AGENT)


def test_a_tail_of_an_empty_store_reads_nothing(store_and_tail: StoreAndTail) -> None:
    _, tail = store_and_tail
    assert tail.read() == TailRead([], [])
    assert tail.read() == TailRead([], [])


# -- events: each once, in order --------------------------------------------------


def test_every_event_once_with_a_read_after_every_append(store_and_tail: StoreAndTail) -> None:
    store, tail = store_and_tail
    append = Appender(store)
    got: list[Event] = []
    for i in range(120):  # 40 events per node
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
        for node in "abc":
            for _ in range(rng.randint(0, 5)):
                append(node)
        got += tail.read().events
    assert len(append.appended) > 200
    assert_each_once_in_order(got, append.appended)


# -- heartbeats ---------------------------------------------------------------


def test_a_removed_heartbeat_drops_out(store_and_tail: StoreAndTail) -> None:
    store, tail = store_and_tail
    for node in "ab":
        store.put_heartbeat(AGENT, heartbeat(node))
    assert [b.node for b in tail.read().heartbeats] == ["a", "b"]
    store.remove_heartbeat(AGENT, "a")
    assert [b.node for b in tail.read().heartbeats] == ["b"]
    store.put_heartbeat(AGENT, heartbeat("a", beats=5))  # and comes back
    assert tail.read().heartbeats == [heartbeat("a", 5), heartbeat("b")]


def test_sync_conflict_copies_and_copies_under_another_name_are_ignored(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    Appender(store)("a")
    other = heartbeat("a", beats=9, role="active").to_json()
    plant(store, KEYS.beats + "a.sync-conflict-20240101-123456-ABCDEFG", other)
    plant(store, KEYS.beats + "z.sync-conflict-1", heartbeat("z").to_json())
    plant(store, KEYS.beat("b"), other)  # node a's record under b's name
    conflict = KEYS.events + "a.sync-conflict-20240101-123456-ABCDEFG/" + "0" * 19 + "2"
    plant(store, conflict, event("a", 2).to_json())
    plant(store, KEYS.event("b", 1), event("a", 2).to_json())  # node a's event in b's log
    plant(store, KEYS.event("b", 2), event("z", 1).to_json())
    read = tail.read()
    assert read.heartbeats == [heartbeat("a")]
    assert ids(read.events) == [("a", 1)]
    assert tail.read() == TailRead([], [heartbeat("a")])


def test_a_corrupt_heartbeat_is_skipped_until_it_is_whole_again(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    plant(store, KEYS.beat("c"), b'{"node": "c", "beats": ')
    plant(store, KEYS.beat("d"), b'{"node": "d"}')  # fields missing
    assert tail.read().heartbeats == [heartbeat("a")]
    assert tail.read().heartbeats == [heartbeat("a")]
    store.put_heartbeat(AGENT, heartbeat("c", beats=3))
    assert tail.read().heartbeats == [heartbeat("a"), heartbeat("c", 3)]


def test_corrupt_events_are_skipped(file_store_and_tail: tuple[FileStore, Tail]) -> None:
    store, tail = file_store_and_tail
    append = Appender(store)
    append("a")
    [first] = list(file_key(store.root, KEYS.node_events("a")).iterdir())
    plant(store, KEYS.node_events("a") + first.name + "-x", b'{"node": "a", "n": "two"}')
    plant(store, KEYS.event("a", 10**15), b"\xff\xfe not json }")
    append("a")
    assert ids(tail.read().events) == [("a", 1), ("a", 2)]


# -- the store going away -------------------------------------------------------


def test_a_removed_store_directory_is_unavailable_not_empty(
    file_store_and_tail: tuple[FileStore, Tail],
) -> None:
    """A monitor is told the store is gone, never shown an empty agent."""
    store, tail = file_store_and_tail
    store.put_heartbeat(AGENT, heartbeat("a"))
    Appender(store)("a")
    assert len(tail.read().events) == 1
    shutil.rmtree(store.root)
    with pytest.raises(StoreUnavailable, match=f"store directory {store.root}"):
        tail.read()


# -- over the file store as over the memory store ------------------------------------

# A history: steps of (node, appends) or None for a read.
_history = st.lists(
    st.one_of(st.none(), st.tuples(st.sampled_from("abc"), st.integers(1, 5))),
    min_size=1,
    max_size=25,
)


def _per_read(history: list[tuple[str, int] | None], make: Callable[[], StoreAndTail]) -> list:
    store, tail = make()
    append = Appender(store)
    reads: list[TailRead] = []
    for step in [*history, None]:
        if step is None:
            reads.append(tail.read())
            continue
        node, count = step
        for _ in range(count):
            append(node)
        store.put_heartbeat(AGENT, heartbeat(node, beats=append._n[node]))
    return [(ids(read.events), read.heartbeats) for read in reads]


@settings(max_examples=40, deadline=None)
@given(_history)
def test_the_tail_of_the_file_store_and_of_the_memory_store_return_the_same(
    history: list[tuple[str, int] | None],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:

        def over_file() -> StoreAndTail:
            store = FileStore(Path(tmp) / "file", events_per_node=EVENTS_KEPT)
            return store, store.tail(AGENT)

        def over_memory() -> StoreAndTail:
            store = MemoryStore()
            return store, GenericTail(store, AGENT)

        assert _per_read(history, over_file) == _per_read(history, over_memory)
