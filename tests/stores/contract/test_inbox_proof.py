"""What proves a submission admitted and done to a ``Client``, on every backend (DESIGN.md
invariants 9 and 10).

The store's own records of an admission (the request id's index, the "consumed"
mark, the number a reply is filed under) can be written by anyone who can write
the store. Here they are planted through the store contract itself, as such a
writer would plant them: a checkpoint write under a lease of its own, naming
what it likes as consumed (on the file store ``done/N.hbr`` and
``ids/<sha>.hbi``; on Redis ``inbox:consumed``, ``inbox:ids``; on etcd
``ids/<request id>`` = ``{"consumed": true}``). Only a sealed record proves
anything: the submission sealed under its number, or the reply sealed for its
agent, number and request id.
"""

from __future__ import annotations

import pytest

from hamsterbunker.core.errors import NotNextNumber, Tampered, UnknownRequest
from hamsterbunker.ops.client import Client
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.backend import DeleteRange, Txn, prefix_end
from hamsterbunker.stores.base import AdmissionState, Consumed
from hamsterbunker.stores.interface import Store
from tests.support.agents import SECRET

from .conftest import KEEP_REPLIES
from .test_inbox import held

AGENT = "a"
# How long a wait for a reply that never comes goes on: what is asserted is its TimeoutError.
NO_REPLY_S = 0.5


def sealer_of(store: Store) -> Sealer:
    cluster = store.read_cluster()
    assert cluster is not None
    return Sealer(SECRET, cluster)


def test_a_consumed_mark_without_a_sealed_reply_is_not_done(store: Store) -> None:
    """A genuine pending submission marked consumed with no reply reads as not done yet:
    result() times out, saying so, instead of returning None."""
    with Client(store, SECRET) as client:
        assert client.submit(AGENT, 1, request_id="r1").number == 1
        store.put_checkpoint(AGENT, held(store), 1, b"junk", [Consumed(1, "r1", None)])
        with pytest.raises(TimeoutError, match="marked consumed, but with no sealed reply"):
            client.result(AGENT, "r1", timeout=NO_REPLY_S)


def test_a_never_submitted_request_id_marked_consumed_is_neither_done_nor_a_duplicate(
    store: Store,
) -> None:
    """A request id nobody submitted, planted as consumed without a reply, is not done and
    is not reported as already admitted: submit says the store's record is not authentic."""
    store.put_checkpoint(AGENT, held(store), 1, b"junk", [Consumed(1, "ghost", None)])
    with Client(store, SECRET) as client:
        with pytest.raises(TimeoutError):
            client.result(AGENT, "ghost", timeout=NO_REPLY_S)
        with pytest.raises(Tampered, match="no sealed submission or reply"):
            client.submit(AGENT, 1, request_id="ghost")


def test_a_consumed_mark_with_a_junk_reply_is_reported(store: Store) -> None:
    """A reply that does not authenticate is Tampered, both to result() and to a resubmit."""
    with Client(store, SECRET) as client:
        client.submit(AGENT, 1, request_id="r1")
        store.put_checkpoint(AGENT, held(store), 1, b"junk", [Consumed(1, "r1", b"junk")])
        with pytest.raises(Tampered):
            client.result(AGENT, "r1", timeout=NO_REPLY_S)
        with pytest.raises(Tampered):
            client.submit(AGENT, 1, request_id="r1")


def test_a_genuine_duplicate_is_proved_pending_and_consumed(store: Store) -> None:
    """A resubmission is a duplicate while its sealed submission is pending and once its
    sealed reply (None included) is stored, and result() then returns that reply."""
    with Client(store, SECRET) as client:
        first = client.submit(AGENT, 1, request_id="r1")
        again = client.submit(AGENT, 2, request_id="r1")
        assert (again.number, again.duplicate) == (first.number, True)
        sealed = sealer_of(store).seal_reply(AGENT, first.number, "r1", None)
        store.put_checkpoint(AGENT, held(store), 1, b"cp", [Consumed(first.number, "r1", sealed)])
        again = client.submit(AGENT, 3, request_id="r1")
        assert (again.number, again.duplicate) == (first.number, True)
        assert client.result(AGENT, "r1", timeout=NO_REPLY_S, number=first.number) is None


def test_an_earlier_admissions_reply_does_not_answer_a_resubmission(store: Store) -> None:
    """Once a request id is forgotten and submitted again under a new number, its first
    admission's genuine sealed reply, planted as the new one's, is refused (Tampered)."""
    fence = held(store)
    with Client(store, SECRET) as client:
        sealer = sealer_of(store)
        first = client.submit(AGENT, 1, request_id="r")
        old_reply = sealer.seal_reply(AGENT, first.number, "r", "the first answer")
        store.put_checkpoint(AGENT, fence, 1, b"cp", [Consumed(first.number, "r", old_reply)])
        assert client.result(AGENT, "r", timeout=NO_REPLY_S) == "the first answer"
        for seq in range(2, KEEP_REPLIES + 2):  # newer consumptions: "r" is forgotten
            n = client.submit(AGENT, seq, request_id=f"other{seq}").number
            reply = sealer.seal_reply(AGENT, n, f"other{seq}", None)
            store.put_checkpoint(AGENT, fence, seq, b"cp", [Consumed(n, f"other{seq}", reply)])
        assert store.read_admission(AGENT, "r") is None
        second = client.submit(AGENT, 2, request_id="r")
        assert not second.duplicate and second.number != first.number
        store.put_checkpoint(
            AGENT, fence, KEEP_REPLIES + 2, b"cp", [Consumed(second.number, "r", old_reply)]
        )
        with pytest.raises(Tampered, match=f"#{second.number}"):
            client.result(AGENT, "r", timeout=NO_REPLY_S)


def test_a_wait_pinned_to_its_number_refuses_another(store: Store) -> None:
    """result(number=N) for a request id the store holds under another number is
    UnknownRequest, not that other admission's reply."""
    with Client(store, SECRET) as client:
        admission = client.submit(AGENT, 1, request_id="r1")
        with pytest.raises(UnknownRequest, match="not as the #7 waited for"):
            client.result(AGENT, "r1", timeout=NO_REPLY_S, number=admission.number + 6)


def test_junk_planted_at_the_next_number_does_not_stop_admissions(store: Store) -> None:
    """One entry planted where the inbox's next submission goes (junk, not sealed) costs at
    most that number: the next submission is admitted, as new, at a later one; nothing is
    refused for good."""
    from tests.support.raw_inbox import plant_submissions

    with Client(store, SECRET) as client:
        assert client.submit(AGENT, 1, request_id="r1").number == 1
        plant_submissions(store, AGENT, [(2, b"junk where #2 goes")])
        second = client.submit(AGENT, 2, request_id="r2")
        assert not second.duplicate and second.number >= 2
        third = client.submit(AGENT, 3, request_id="r3")
        assert not third.duplicate and third.number > second.number


def _admit_until_taken(store: Store, request_id: str) -> int:
    """Admit as a client would: at number 1, then at whatever the store says is next."""
    number = 1
    for _attempt in range(10):
        try:
            taken, duplicate = store.admit(AGENT, request_id, number, b"payload")
            assert not duplicate
            return taken
        except NotNextNumber as exc:
            number = exc.next_number
    raise AssertionError("never admitted")


@pytest.mark.parametrize("tampered", ["deleted", "set-back", "junk", "oversized"])
def test_a_counter_tampered_with_never_gives_a_stored_number_again(
    store: Store, tampered: str
) -> None:
    """The last admitted number deleted, set back, junk or over its bound: the next
    admission takes a number no submission is stored under (the submission's own key is
    compared absent), never overwriting one that waits; the counter is put right."""
    from hamsterbunker.stores.layer.keys import AgentKeys
    from tests.support.raw_store import RawRecords, raw_view

    for n in (1, 2, 3):
        assert store.admit(AGENT, f"r{n}", n, b"p%d" % n) == (n, False)
    raw = raw_view(store)
    assert isinstance(raw, RawRecords)
    last = AgentKeys(AGENT).last
    if tampered == "deleted":
        raw.backend.commit(Txn(writes=[DeleteRange(last, prefix_end(last))]))
    else:
        raw.put(last, {"set-back": b"1", "junk": b"\x00no", "oversized": b"9" * 100_000}[tampered])
    assert _admit_until_taken(store, "r4") == 4
    assert _admit_until_taken(store, "r5") == 5
    assert [(n, blob) for n, blob in store.read_inbox(AGENT)][:3] == [
        (1, b"p1"), (2, b"p2"), (3, b"p3"),
    ]  # fmt: skip
    assert store.read_admission(AGENT, "r2") == AdmissionState(2, False, None)
