"""Store.replace_cluster, the re-seals and the reply listing, on every backend
(``hb rotate-secret``).

The cluster record is changed only against the record the writer read, so two
rotations racing cannot both win; a checkpoint is re-sealed in place only while
it still holds the bytes the re-sealer opened, so a re-seal never brings back a
checkpoint retention removed, nor overwrites one a leader wrote meanwhile. The
same holds for a consumed submission's reply, listed page by page for commit.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from hamsterbunker.core.errors import ClusterChanged, StoreError
from hamsterbunker.core.limits import MAX_REPLY_BYTES
from hamsterbunker.records import ClusterRecord, LeaseRecord
from hamsterbunker.stores.base import Consumed, Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.raw_store import RawRecords

from .conftest import KEEP_CHECKPOINTS, KEEP_REPLIES, Opener

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


def consumed_with_replies(store: Store, replies: dict[int, bytes | None]) -> Fence:
    """Admit a submission per number (request id req-<number>) and consume them all in
    one checkpoint, each with its reply (None: without one)."""
    for number in sorted(replies):
        store.admit(AGENT, f"req-{number}", number, b"submission-%d" % number)
    fence = leased(store)
    consumed = [Consumed(n, f"req-{n}", reply) for n, reply in sorted(replies.items())]
    store.put_checkpoint(AGENT, fence, 1, b"checkpoint-1", consumed)
    return fence


def test_the_kept_replies_are_listed_page_by_page(store: Store, open_second: Opener) -> None:
    """Replies come oldest first, a page at a time, each page saying where the next
    starts; a submission consumed without a reply is passed over."""
    consumed_with_replies(store, {1: b"reply-1", 2: None, 3: b"reply-3", 4: b"reply-4"})
    second = open_second()
    assert second.read_replies(AGENT, 0, 2) == ([(1, b"reply-1"), (3, b"reply-3")], 3)
    assert second.read_replies(AGENT, 3, 2) == ([(4, b"reply-4")], None)
    assert second.read_replies(AGENT, 0, 16) == (
        [(1, b"reply-1"), (3, b"reply-3"), (4, b"reply-4")],
        None,
    )
    assert second.read_replies(AGENT, 4, 16) == ([], None)
    assert second.read_replies("nobody", 0, 16) == ([], None)


def test_a_page_passed_over_by_retention_lists_only_the_kept(store: Store) -> None:
    """A reply retention removed is listed no more; one pending is not listed."""
    fence = consumed_with_replies(store, {1: b"reply-1", 2: b"reply-2"})
    for number in range(3, 6):
        store.admit(AGENT, f"req-{number}", number, b"submission")
    consumed = [Consumed(n, f"req-{n}", b"reply-%d" % n) for n in (3, 4, 5)]
    store.put_checkpoint(AGENT, fence, 2, b"checkpoint-2", consumed)  # keeps the newest 4
    store.admit(AGENT, "req-6", 6, b"pending")
    replies, following = store.read_replies(AGENT, 0, 16)
    assert (replies, following) == ([(n, b"reply-%d" % n) for n in (2, 3, 4, 5)], None)


def test_a_reply_is_resealed_in_place_while_it_holds_the_bytes_read(
    store: Store, open_second: Opener
) -> None:
    """The new bytes (of any length within bounds) replace the reply, for every client;
    the request id stays a duplicate."""
    consumed_with_replies(store, {1: b"old-reply", 2: b"other-reply"})
    assert store.reseal_reply(AGENT, 1, b"old-reply", b"a-new-and-longer-reply")
    second = open_second()
    state = second.read_admission(AGENT, "req-1")
    assert state is not None and (state.number, state.consumed) == (1, True)
    assert state.reply == b"a-new-and-longer-reply"
    assert second.read_replies(AGENT, 0, 16) == (
        [(1, b"a-new-and-longer-reply"), (2, b"other-reply")],
        None,
    )
    assert second.admit(AGENT, "req-1", 3, b"again") == (1, True)


def test_a_reseal_of_another_reply_or_of_none_changes_nothing(store: Store) -> None:
    """Other bytes, a submission consumed without a reply, one still pending, one never
    admitted: False, and nothing changes."""
    consumed_with_replies(store, {1: b"old-reply", 2: None})
    store.admit(AGENT, "req-3", 3, b"pending")
    assert not store.reseal_reply(AGENT, 1, b"not-this-reply", b"new-reply")
    assert not store.reseal_reply(AGENT, 2, b"", b"new-reply")
    assert not store.reseal_reply(AGENT, 3, b"pending", b"new-reply")
    assert not store.reseal_reply(AGENT, 9, b"old-reply", b"new-reply")
    assert store.read_replies(AGENT, 0, 16) == ([(1, b"old-reply")], None)
    assert store.read_inbox(AGENT) == [(3, b"pending")]
    state = store.read_admission(AGENT, "req-2")
    assert state is not None and state.consumed and state.reply is None


def test_a_reseal_out_of_bounds_is_refused(store: Store) -> None:
    """A reply over MAX_REPLY_BYTES, or a number out of bounds: StoreError, nothing changes."""
    consumed_with_replies(store, {1: b"old-reply"})
    with pytest.raises(StoreError, match="above the limit"):
        store.reseal_reply(AGENT, 1, b"old-reply", b"x" * (MAX_REPLY_BYTES + 1))
    with pytest.raises(StoreError, match="outside"):
        store.reseal_reply(AGENT, 0, b"old-reply", b"new-reply")
    assert store.read_replies(AGENT, 0, 16) == ([(1, b"old-reply")], None)


def test_a_reseal_of_a_reply_retention_removed_changes_nothing(store: Store) -> None:
    """A reply removed by retention since it was read is not brought back."""
    fence = consumed_with_replies(store, {1: b"old-reply"})
    for number in range(2, 2 + KEEP_REPLIES):
        store.admit(AGENT, f"req-{number}", number, b"submission")
        consumed = [Consumed(number, f"req-{number}", b"reply")]
        store.put_checkpoint(AGENT, fence, number, b"checkpoint", consumed)
    assert not store.reseal_reply(AGENT, 1, b"old-reply", b"new-reply")
    assert store.read_admission(AGENT, "req-1") is None
    replies, _following = store.read_replies(AGENT, 0, 16)
    assert 1 not in [number for number, _reply in replies]


def plant_reply_junk(store: Store) -> None:
    """Put what a store writer without the secret might beside the kept replies: names
    that do not parse, a record that does not, a reply over MAX_REPLY_BYTES (number 6)."""
    assert isinstance(store, RecordStore), store
    huge = b"x" * (MAX_REPLY_BYTES + 1)
    raw, keys = RawRecords(store), AgentKeys(AGENT)
    raw.put(keys.done + "junk/req-junk", b"+junk")
    raw.put(keys.reply(5, "req-5"), b"not a consumed record")
    raw.put(keys.reply(6, "req-6"), b"+" + huge)


def test_planted_junk_beside_the_replies_is_left_out_and_ends_the_listing(store: Store) -> None:
    """Junk among the kept replies is left out, never raised, and a listing a page at a
    time still reaches its end past it."""
    consumed_with_replies(store, {1: b"reply-1", 2: b"reply-2"})
    plant_reply_junk(store)
    assert store.read_replies(AGENT, 0, 16) == ([(1, b"reply-1"), (2, b"reply-2")], None)
    listed: list[tuple[int, bytes]] = []
    after: int | None = 0
    for _page in range(20):
        if after is None:
            break
        page, following = store.read_replies(AGENT, after, 1)
        listed += page
        assert following is None or following > after
        after = following
    assert after is None and listed == [(1, b"reply-1"), (2, b"reply-2")]
