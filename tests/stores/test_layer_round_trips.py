"""The record layer's round trips: a renewal, a term's later checkpoints and a client's next
admission are one commit each, and a guess that no longer holds falls back to reading, with
the same outcome as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from hamsterbunker.core.errors import Fenced, InboxFull, LeaseConflict, NotNextNumber, StoreError
from hamsterbunker.core.read_bounds import TAKEN_INBOX_READ, TAKEN_JOURNAL_READ, ReadBound
from hamsterbunker.records import ClusterRecord, LeaseRecord
from hamsterbunker.sealing.sealer import new_cluster_record
from hamsterbunker.stores import base
from hamsterbunker.stores.backend import Capability, Notice, ScanResult, TooLarge, Txn, TxnResult
from hamsterbunker.stores.backends.memory import MemoryBackend
from hamsterbunker.stores.base import Consumed
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.stores.layer.restore import TAKEN_CHECKPOINT_BYTES
from tests.support.records import fence_of, lease

AGENT = "a1"


class CountingBackend(MemoryBackend):
    """A memory backend that names each call made to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        self.calls.append("get")
        return super().get(key, max_bytes)

    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        self.calls.append("scan")
        return super().scan(prefix, bound, after)

    def commit(self, txn: Txn) -> TxnResult:
        self.calls.append("commit")
        return super().commit(txn)


@pytest.fixture
def backend() -> CountingBackend:
    return CountingBackend()


def test_a_renewal_by_the_last_writer_is_one_commit(backend: CountingBackend) -> None:
    """cas_lease against the version this client wrote compares its bytes, reading nothing."""
    store = RecordStore(backend)
    held = store.cas_lease(AGENT, None, lease("n1", 1))
    backend.calls.clear()
    renewed = store.cas_lease(AGENT, held.version, replace(held, renewals=1))
    assert backend.calls == ["commit"]
    assert store.read_lease(AGENT) == renewed


def test_a_renewal_after_a_read_is_one_commit(backend: CountingBackend) -> None:
    """A record read (a standby about to take over) is compared as read."""
    RecordStore(backend).cas_lease(AGENT, None, lease("n1", 1))
    reader = RecordStore(backend)
    found = reader.read_lease(AGENT)
    assert found is not None
    backend.calls.clear()
    reader.cas_lease(AGENT, found.version, lease("n2", 2))
    assert backend.calls == ["commit"]


def test_a_record_changed_by_another_client_is_a_conflict_as_before(
    backend: CountingBackend,
) -> None:
    """The guess fails, the record is read: its version decides, and the store keeps the other's."""
    mine, other = RecordStore(backend), RecordStore(backend)
    held = mine.cas_lease(AGENT, None, lease("n1", 1))
    taken = other.cas_lease(AGENT, held.version, lease("n2", 2))
    with pytest.raises(LeaseConflict):
        mine.cas_lease(AGENT, held.version, replace(held, renewals=1))
    assert mine.read_lease(AGENT) == taken
    # Told the version that is there, the write goes through (after its one read).
    again = mine.cas_lease(AGENT, taken.version, lease("n1", 3))
    assert other.read_lease(AGENT) == again


def test_a_terms_later_checkpoints_are_one_commit_each(backend: CountingBackend) -> None:
    """Under the fence of its last checkpoint a client lists nothing first; retention holds."""
    store = RecordStore(backend, keep_checkpoints=3)
    fence = fence_of(store.cas_lease(AGENT, None, lease("n1", 1)))
    store.put_checkpoint(AGENT, fence, 1, b"c1")
    for seq in range(2, 9):
        backend.calls.clear()
        store.put_checkpoint(AGENT, fence, seq, f"c{seq}".encode())
        assert backend.calls == ["commit"]
    assert [info.seq for info in store.list_checkpoints(AGENT)] == [8, 7, 6]
    stored = backend.scan(f"agents/{AGENT}/ckpt/", ReadBound(100, 100, 10_000))
    assert len(stored.items) == 3


def test_a_new_fence_or_a_seq_not_above_lists_again(backend: CountingBackend) -> None:
    """A new term's first checkpoint reads the listing, and so does a seq not above the last,
    refused as before."""
    store = RecordStore(backend)
    first = store.cas_lease(AGENT, None, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(first), 5, b"c5")
    with pytest.raises(StoreError, match="sequence must increase"):
        store.put_checkpoint(AGENT, fence_of(first), 5, b"again")
    second = store.cas_lease(AGENT, first.version, lease("n1", 2, session="s2"))
    backend.calls.clear()
    store.put_checkpoint(AGENT, fence_of(second), 6, b"c6")
    assert backend.calls == ["commit", "commit"]
    assert [(i.seq, i.epoch) for i in store.list_checkpoints(AGENT)] == [(6, 2), (5, 1)]


def test_a_new_terms_first_checkpoint_after_its_restores_listing_is_one_commit(
    backend: CountingBackend,
) -> None:
    """The restore lists the checkpoints once the lease is taken: under the fence this client
    just wrote, that listing serves the term's first checkpoint; retention holds."""
    store = RecordStore(backend, keep_checkpoints=2)
    first = store.cas_lease(AGENT, None, lease("n1", 1))
    for seq in (1, 2, 3):
        store.put_checkpoint(AGENT, fence_of(first), seq, f"c{seq}".encode())
    taker = RecordStore(backend, keep_checkpoints=2)
    second = taker.cas_lease(AGENT, first.version, lease("n2", 2, session="s2"))
    assert [info.seq for info in taker.list_checkpoints(AGENT)] == [3, 2]
    backend.calls.clear()
    taker.put_checkpoint(AGENT, fence_of(second), 4, b"c4")
    assert backend.calls == ["commit"]
    assert [(i.seq, i.epoch) for i in taker.list_checkpoints(AGENT)] == [(4, 2), (3, 1)]


def test_a_listing_under_a_fence_since_taken_over_writes_nothing(
    backend: CountingBackend,
) -> None:
    """A listing read under this client's fence, then another client takes the lease: the
    checkpoint made from that listing is refused by the fence, as it would be after a read."""
    mine, other = RecordStore(backend), RecordStore(backend)
    held = mine.cas_lease(AGENT, None, lease("n1", 1))
    mine.put_checkpoint(AGENT, fence_of(held), 1, b"c1")
    assert [info.seq for info in mine.list_checkpoints(AGENT)] == [1]
    other.cas_lease(AGENT, held.version, lease("n2", 2, session="s2"))
    with pytest.raises(Fenced):
        mine.put_checkpoint(AGENT, fence_of(held), 2, b"c2")
    assert [(i.seq, i.epoch) for i in other.list_checkpoints(AGENT)] == [(1, 1)]


class TellingBackend(CountingBackend):
    """A counting backend whose watch tells the values it is given, as Redis' and etcd's do."""

    capabilities = frozenset({*MemoryBackend.capabilities, Capability.NOTICE_VALUES})

    def __init__(self, told: list[Notice]) -> None:
        super().__init__()
        self.told = told

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        for notice in self.told:
            yield notice


def test_a_lease_a_watch_told_of_is_taken_in_one_commit() -> None:
    """A standby told the lease record by its watch compares the bytes told: no read first."""
    keys = AgentKeys(AGENT)
    backend = TellingBackend([])
    held = RecordStore(backend).cas_lease(AGENT, None, lease("n1", 1))
    stored = backend.get(keys.lease, 4096)
    assert isinstance(stored, bytes)
    backend.told.append(Notice(keys.lease, stored))
    standby = RecordStore(backend)

    async def first_told() -> LeaseRecord | None:
        return await anext(standby.watch(AGENT, lease_only=True))

    assert asyncio.run(first_told()) == held
    backend.calls.clear()
    standby.cas_lease(AGENT, held.version, lease("n2", 2, session="s2"))
    assert backend.calls == ["commit"]


def test_an_admission_after_this_clients_last_is_one_commit(backend: CountingBackend) -> None:
    """The next number after this client's last admission is committed at once."""
    store = RecordStore(backend)
    assert store.admit(AGENT, "r1", 1, b"s1") == (1, False)
    backend.calls.clear()
    assert store.admit(AGENT, "r2", 2, b"s2") == (2, False)
    assert backend.calls == ["commit"]
    assert [n for n, _ in store.read_inbox(AGENT)] == [1, 2]


def test_an_admission_after_another_clients_is_judged_as_before(backend: CountingBackend) -> None:
    """A guess another client's admission made wrong: the next number named, a duplicate found."""
    mine, other = RecordStore(backend), RecordStore(backend)
    mine.admit(AGENT, "r1", 1, b"s1")
    other.admit(AGENT, "r2", 2, b"s2")
    with pytest.raises(NotNextNumber) as refused:
        mine.admit(AGENT, "r3", 2, b"s3")
    assert refused.value.next_number == 3
    assert mine.admit(AGENT, "r3", 3, b"s3") == (3, False)
    assert mine.admit(AGENT, "r3", 4, b"s3") == (3, True)
    assert mine.admit(AGENT, "r2", 4, b"s2") == (2, True)
    assert [n for n, _ in other.read_inbox(AGENT)] == [1, 2, 3]


def test_a_full_inbox_by_an_old_count_is_read_again(
    backend: CountingBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consumptions since this client's last admission make room: the inbox is read, not full;
    an inbox full as read is full."""
    monkeypatch.setattr(base, "MAX_INBOX_COUNT", 2)
    submitter, leader = RecordStore(backend), RecordStore(backend)
    submitter.admit(AGENT, "r1", 1, b"s1")
    submitter.admit(AGENT, "r2", 2, b"s2")
    fence = fence_of(leader.cas_lease(AGENT, None, lease("n1", 1)))
    consumed = [Consumed(1, "r1", b"reply"), Consumed(2, "r2", None)]
    leader.put_checkpoint(AGENT, fence, 1, b"c1", consumed=consumed)
    assert submitter.admit(AGENT, "r3", 3, b"s3") == (3, False)
    assert submitter.admit(AGENT, "r4", 4, b"s4") == (4, False)
    with pytest.raises(InboxFull):
        submitter.admit(AGENT, "r5", 5, b"s5")


def test_a_watch_of_the_agent_wakes_for_its_lease_submissions_and_replies_alone() -> None:
    """A node waiting for its inbox and a client waiting for a reply are not woken by the
    heartbeats, events, checkpoints and counts written all the while."""
    keys = AgentKeys(AGENT)
    told = [
        Notice(keys.beat("n1"), b"beat"),
        Notice(keys.event("n1", 1)),
        Notice(keys.ckpt + "x"),
        Notice(keys.kept, b"1"),
        Notice(keys.submission(1)),
        Notice(f"agents/{AGENT}/inbox"),  # a folder made or removed (the file backend)
        Notice(keys.reply(1, "r1")),
        Notice(keys.lease),
        Notice(None),
    ]
    store = RecordStore(TellingBackend(told))

    async def woken() -> int:
        return len([_ async for _ in store.watch(AGENT)])

    assert asyncio.run(woken()) == 5


def test_a_take_reads_what_the_restore_reads_first_in_its_commit(backend: CountingBackend) -> None:
    """The listing, the acceptance, the cluster record and the newest checkpoint the lease
    record names come with the take's one commit; the term's first checkpoint then needs no
    listing either."""
    first = RecordStore(backend)
    cluster = first.create_cluster(new_cluster_record("a secret of the cluster"))
    held = first.cas_lease(AGENT, None, lease("n1", 1))
    for seq in (1, 2):
        first.put_checkpoint(AGENT, fence_of(held), seq, f"c{seq}".encode())
    first.put_acceptance(AGENT, b"accepted")
    named = replace(lease("n2", 2, session="s2"), seq=2, seq_epoch=1)
    taker = RecordStore(backend)
    assert taker.read_lease(AGENT) == held  # a standby has read it (or been told it)
    backend.calls.clear()
    taken, read = taker.take_lease(AGENT, held.version, named)
    assert backend.calls == ["commit"]
    assert read is not None
    assert [(i.seq, i.epoch) for i in read.infos] == [(2, 1), (1, 1)]
    assert (read.newest, read.acceptance) == (b"c2", b"accepted")
    assert read.cluster is not None and ClusterRecord.from_json(read.cluster) == cluster
    backend.calls.clear()
    taker.put_checkpoint(AGENT, fence_of(taken), 3, b"c3")
    assert backend.calls == ["commit"]


def test_a_take_reads_along_the_checkpoints_published_after_the_one_the_record_names(
    backend: CountingBackend,
) -> None:
    """A leader killed after its last renewal published more than the record names: the
    take's one commit still brings the newest (a failover restores with no further read)."""
    first = RecordStore(backend)
    held = first.cas_lease(AGENT, None, lease("n1", 1))
    for seq in range(1, 5):
        first.put_checkpoint(AGENT, fence_of(held), seq, f"c{seq}".encode())
    named = replace(lease("n2", 2, session="s2"), seq=2, seq_epoch=1)  # its last renewal's
    taker = RecordStore(backend)
    assert taker.read_lease(AGENT) == held
    backend.calls.clear()
    _, read = taker.take_lease(AGENT, held.version, named)
    assert backend.calls == ["commit"]
    assert read is not None and [i.seq for i in read.infos][:2] == [4, 3]
    assert read.newest == b"c4"


def test_a_big_or_unnamed_newest_checkpoint_is_read_by_the_restore(
    backend: CountingBackend,
) -> None:
    """Over the bytes a take reads along, or not the one the record names: not read along
    (newest None), and read_for_restore reads it."""
    first = RecordStore(backend)
    held = first.cas_lease(AGENT, None, lease("n1", 1))
    big = b"x" * (TAKEN_CHECKPOINT_BYTES + 1)
    first.put_checkpoint(AGENT, fence_of(held), 1, big)
    for named in (replace(lease("n2", 2, session="s2"), seq=1, seq_epoch=1), lease("n2", 3)):
        taker = RecordStore(backend)
        current = taker.read_lease(AGENT)
        assert current is not None
        _, read = taker.take_lease(AGENT, current.version, named)
        assert read is not None and [i.seq for i in read.infos] == [1] and read.newest is None
        assert taker.read_for_restore(AGENT).newest == big


def test_a_take_reads_the_first_steps_journal_and_inbox_along_unless_over_their_bound(
    backend: CountingBackend,
) -> None:
    """The take's commit brings the journals from the step after the named checkpoint on and
    the inbox, as read_effects and read_inbox give them; cut short by their bound (an inbox
    over TAKEN_INBOX_READ's bytes, a journal over its count), not used: read after."""
    first = RecordStore(backend)
    held = first.cas_lease(AGENT, None, lease("n1", 1))
    first.put_checkpoint(AGENT, fence_of(held), 1, b"c1")
    for index in range(3):
        first.put_effect(AGENT, fence_of(held), 2, index, "intent", b"intent %d" % index)
    first.admit(AGENT, "r1", 1, b"small")
    named = replace(lease("n2", 2, session="s2"), seq=1, seq_epoch=1)
    taker = RecordStore(backend)
    taken, read = taker.take_lease(AGENT, held.version, named)
    assert read is not None and read.journals is not None
    assert read.journals.of(2) == taker.read_effects(AGENT, 2) and len(read.journals.of(2)) == 3
    assert read.inbox == taker.read_inbox(AGENT, 0) == [(1, b"small")]

    big = TAKEN_INBOX_READ.total_bytes // 2 + 1
    for n, request in ((2, "r2"), (3, "r3")):
        taker.admit(AGENT, request, n, b"x" * big)
    for index in range(TAKEN_JOURNAL_READ.count // 2):  # with step 2's, over the count
        for kind in ("intent", "outcome"):
            taker.put_effect(AGENT, fence_of(taken), 3, index, kind, b"r")
    again = replace(lease("n3", 3, session="s3"), seq=1, seq_epoch=1)
    _, read = RecordStore(backend).take_lease(AGENT, taken.version, again)
    assert read is not None and read.journals is not None and read.inbox is None
    assert read.journals.of(2) is not None and read.journals.of(3) is None  # 3: cut short
