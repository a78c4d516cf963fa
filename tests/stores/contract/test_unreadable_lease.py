"""Store.replace_unreadable_lease on every backend: an unreadable lease record is replaced
by a compare-and-set against what was found, and the fences of earlier leases stay fenced.

The junk is written past the contract, under the backend's own names, as someone
without the secret would (tests/support/raw_store.py: under the record layer's keys).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hamsterbunker.core.errors import Fenced, LeaseConflict, UnreadableLease
from hamsterbunker.core.limits import MAX_RECORD_BYTES
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer import RecordStore
from tests.support.raw_store import RawRecords

AGENT = "a"
JUNK = {
    "ttl-1e400": (
        b'{"holder":"x","region":"r","session":"s","epoch":1,"ttl_ms":1' + b"0" * 400
        + b',"renewals":1,"version":1}'
    ),
    "not-json": b"\x00\xffnot a lease record",
    "oversized": b"x" * (MAX_RECORD_BYTES + 1),  # never read: replaced against the fence
}  # fmt: skip

Plant = Callable[[bytes], None]


@pytest.fixture
def plant(store: Store) -> Plant:
    """Write bytes as the agent's lease record, past the store contract."""
    assert isinstance(store, RecordStore), store
    records = RawRecords(store)
    return lambda data: records.put_lease(AGENT, data)


def lease(holder: str, epoch: int, session: str = "s1", version: int = 0) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, region="eu", session=session, epoch=epoch, ttl_ms=2000, version=version
    )


def fence_of(record: LeaseRecord) -> Fence:
    assert record.holder is not None
    return Fence(record.holder, record.session, record.epoch)


def unreadable(store: Store) -> UnreadableLease:
    with pytest.raises(UnreadableLease) as caught:
        store.read_lease(AGENT)
    return caught.value


@pytest.mark.parametrize("junk", list(JUNK.values()), ids=list(JUNK))
def test_an_unreadable_lease_record_is_replaced_against_what_was_found_and_old_fences_stay_fenced(
    store: Store, open_second: Callable[[], Store], plant: Plant, junk: bytes
) -> None:
    """read_lease names an unreadable record (UnreadableLease.found); replace_unreadable_lease
    against that writes the new lease, readable by another client; a write under the fence of
    the lease before the junk is then Fenced, one under the new lease's is accepted."""
    held = store.cas_lease(AGENT, None, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(held), 1, b"sealed-1")
    plant(junk)
    found = unreadable(store).found
    assert unreadable(open_second()).found == found  # the same contents: the same name
    new = lease("n2", 2, session="s2", version=1_000_003)
    written = store.replace_unreadable_lease(AGENT, found, new)
    assert (written.holder, written.epoch, written.session) == ("n2", 2, "s2")
    assert open_second().read_lease(AGENT) == written
    with pytest.raises(Fenced):
        store.put_checkpoint(AGENT, fence_of(held), 2, b"stale write")
    assert store.put_checkpoint(AGENT, fence_of(written), 2, b"sealed-2").epoch == 2
    renewed = store.cas_lease(AGENT, written.version, lease("n2", 2, session="s2"))
    assert open_second().read_lease(AGENT) == renewed


def test_replacing_what_is_no_longer_there_conflicts_and_writes_nothing(
    store: Store, open_second: Callable[[], Store], plant: Plant
) -> None:
    """replace_unreadable_lease against junk that was since replaced by other junk, by a
    readable record, or by another node's replacement raises LeaseConflict, writing nothing."""
    store.cas_lease(AGENT, None, lease("n1", 1))
    plant(JUNK["not-json"])
    first = unreadable(store).found
    plant(JUNK["ttl-1e400"])  # other junk, of another length
    second = unreadable(store).found
    assert second != first
    with pytest.raises(LeaseConflict):
        store.replace_unreadable_lease(AGENT, first, lease("n2", 2, version=5))
    assert unreadable(store).found == second
    winner = open_second().replace_unreadable_lease(AGENT, second, lease("n3", 3, version=7))
    with pytest.raises(LeaseConflict):
        store.replace_unreadable_lease(AGENT, second, lease("n2", 2, version=5))
    assert store.read_lease(AGENT) == winner
