"""Store.replace_cluster and reseal_checkpoint, on every backend (``hb rotate-secret``).

The cluster record is changed only against the record the writer read, so two
rotations racing cannot both win; a checkpoint is re-sealed in place only while
it still holds the bytes the re-sealer opened, so a re-seal never brings back a
checkpoint retention removed, nor overwrites one a leader wrote meanwhile.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from hamsterbunker.errors import ClusterChanged, StoreError
from hamsterbunker.records import ClusterRecord, LeaseRecord
from hamsterbunker.stores.base import Consumed, Fence, Store

from .conftest import KEEP_CHECKPOINTS, Opener

AGENT = "rewritten"
RECORD = ClusterRecord(
    format=1, kdf="scrypt", n=2**15, r=8, p=1, salt="c2FsdHNhbHRzYWx0c2FsdA==",
    key_id="0123456789abcdef", key_check="Y2hlY2tjaGVja2NoZWNrIQ==", created=1.0,
)  # fmt: skip


def newer(record: ClusterRecord, generation: int) -> ClusterRecord:
    return replace(record, generation=generation, rotation="begun", macs=(("0" * 16, "ab"),))


def leased(store: Store) -> Fence:
    store.cas_lease(AGENT, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000))
    return Fence("n1", "s1", 1)


def test_the_cluster_record_is_replaced_against_the_one_read(
    store: Store, open_second: Opener
) -> None:
    """A replace against the stored record wins and is read by another client."""
    store.create_cluster(RECORD)
    store.replace_cluster(RECORD, newer(RECORD, 1))
    assert open_second().read_cluster() == newer(RECORD, 1)


def test_a_replace_against_another_record_changes_nothing(store: Store) -> None:
    """A writer that read an older record (or none: nothing stored) loses, storing nothing."""
    with pytest.raises(ClusterChanged):
        store.replace_cluster(RECORD, newer(RECORD, 1))
    assert store.read_cluster() is None
    store.create_cluster(RECORD)
    store.replace_cluster(RECORD, newer(RECORD, 1))
    with pytest.raises(ClusterChanged):
        store.replace_cluster(RECORD, newer(RECORD, 2))
    assert store.read_cluster() == newer(RECORD, 1)


def test_of_racing_replaces_against_one_record_exactly_one_wins(
    store: Store, open_client: Opener
) -> None:
    """Eight clients replace the same record at once: one wins, seven get ClusterChanged."""
    store.create_cluster(RECORD)
    clients = [open_client() for _ in range(8)]
    outcomes: list[str] = []
    start = threading.Barrier(len(clients))

    def race(client: Store, generation: int) -> None:
        start.wait()
        try:
            client.replace_cluster(RECORD, newer(RECORD, generation))
            outcomes.append(f"won {generation}")
        except ClusterChanged:
            outcomes.append("lost")

    threads = [threading.Thread(target=race, args=(c, n + 1)) for n, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("lost") == 7, outcomes
    stored = store.read_cluster()
    assert stored is not None and f"won {stored.generation}" == winners[0]


def test_a_checkpoint_is_resealed_in_place_while_it_holds_the_bytes_read(
    store: Store, open_second: Opener
) -> None:
    """The new bytes replace the old under the same (epoch, seq), for every client."""
    fence = leased(store)
    info = store.put_checkpoint(AGENT, fence, 1, b"old-bytes-1")
    assert store.reseal_checkpoint(AGENT, info, b"old-bytes-1", b"new-bytes-1")
    second = open_second()
    [listed] = second.list_checkpoints(AGENT)
    assert (listed.epoch, listed.seq, listed.size) == (1, 1, len(b"new-bytes-1"))
    assert second.read_checkpoint(AGENT, listed) == b"new-bytes-1"


def test_a_reseal_of_other_bytes_or_a_removed_checkpoint_changes_nothing(store: Store) -> None:
    """A checkpoint that changed or that retention removed since it was read stays as it is."""
    fence = leased(store)
    first = store.put_checkpoint(AGENT, fence, 1, b"old-bytes-1")
    assert not store.reseal_checkpoint(AGENT, first, b"not-these-1", b"new-bytes-1")
    assert store.read_checkpoint(AGENT, first) == b"old-bytes-1"
    for seq in range(2, KEEP_CHECKPOINTS + 3):
        store.put_checkpoint(AGENT, fence, seq, b"old-bytes-%d" % seq)
    assert not store.reseal_checkpoint(AGENT, first, b"old-bytes-1", b"new-bytes-1")
    assert 1 not in [info.seq for info in store.list_checkpoints(AGENT)]


def test_a_reseal_of_another_length_is_refused(store: Store) -> None:
    """A re-seal keeps the length (the same checkpoint under another key): else StoreError."""
    fence = leased(store)
    info = store.put_checkpoint(AGENT, fence, 1, b"old-bytes-1")
    with pytest.raises(StoreError, match="must be as long"):
        store.reseal_checkpoint(AGENT, info, b"old-bytes-1", b"longer-new-bytes-1")
    assert store.read_checkpoint(AGENT, info) == b"old-bytes-1"


def test_an_effect_record_is_resealed_in_place_while_it_holds_the_bytes_read(
    store: Store, open_second: Opener
) -> None:
    """The new bytes replace the old record of (seq, index, kind), for every client."""
    fence = leased(store)
    store.put_effect(AGENT, fence, 2, 0, "outcome", b"old-outcome")
    assert store.reseal_effect(AGENT, 2, 0, "outcome", b"old-outcome", b"new-outcome!")
    assert open_second().read_effects(AGENT, 2) == {(0, "outcome"): b"new-outcome!"}


def test_a_reseal_of_another_or_a_removed_effect_record_changes_nothing(store: Store) -> None:
    """A record the leader rewrote, or one its step's checkpoint removed, stays as it is."""
    fence = leased(store)
    store.put_effect(AGENT, fence, 2, 0, "outcome", b"old-outcome")
    assert not store.reseal_effect(AGENT, 2, 0, "outcome", b"not-this-one", b"new-outcome")
    assert not store.reseal_effect(AGENT, 2, 1, "intent", b"old-outcome", b"new-outcome")
    assert store.read_effects(AGENT, 2) == {(0, "outcome"): b"old-outcome"}
    store.put_checkpoint(AGENT, fence, 2, b"checkpoint-2")  # removes the step's journal
    assert not store.reseal_effect(AGENT, 2, 0, "outcome", b"old-outcome", b"new-outcome")
    assert store.read_effects(AGENT, 2) == {}


def test_an_unconsumed_submission_is_resealed_in_place(store: Store, open_second: Opener) -> None:
    """The new bytes replace a pending submission's, for every client; its admission stays."""
    store.admit(AGENT, "req-1", 1, b"old-submission")
    assert store.reseal_submission(AGENT, 1, b"old-submission", b"new-submission")
    second = open_second()
    assert second.read_inbox(AGENT) == [(1, b"new-submission")]
    assert second.admit(AGENT, "req-1", 2, b"again") == (1, True)  # still a duplicate


def test_a_reseal_of_another_or_a_consumed_submission_changes_nothing(store: Store) -> None:
    """Other bytes, or a submission a checkpoint consumed: nothing changes; a new length
    is refused."""
    store.admit(AGENT, "req-1", 1, b"old-submission")
    assert not store.reseal_submission(AGENT, 1, b"not-this-entry", b"new-submission")
    with pytest.raises(StoreError, match="must be as long"):
        store.reseal_submission(AGENT, 1, b"old-submission", b"a-longer-new-submission")
    assert store.read_inbox(AGENT) == [(1, b"old-submission")]
    fence = leased(store)
    store.put_checkpoint(AGENT, fence, 1, b"checkpoint-1", [Consumed(1, "req-1", None)])
    assert not store.reseal_submission(AGENT, 1, b"old-submission", b"new-submission")
    assert store.read_inbox(AGENT) == []
