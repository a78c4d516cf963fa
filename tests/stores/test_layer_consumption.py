"""A leader's consuming checkpoints: after its term's first, each is one commit (planned
from what its last one left), leaves the inbox's records exactly as a checkpoint that read
them first would, and a guess any record since proves wrong falls back to reading them."""

from __future__ import annotations

import pytest

from hamsterbunker.core.blob import BlobPieces
from hamsterbunker.core.read_bounds import ReadBound
from hamsterbunker.stores import Fence
from hamsterbunker.stores.backend import DeleteRange, Put, Txn
from hamsterbunker.stores.base import Consumed
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.stores.test_layer_round_trips import CountingBackend
from tests.support.records import fence_of, lease

AGENT = "a1"
KEYS = AgentKeys(AGENT)
KEEP = 3  # replies kept: from the fourth consumption on, each removes the oldest


def inbox_records(backend: CountingBackend) -> dict[str, bytes]:
    found = backend.scan(f"agents/{AGENT}/inbox/", ReadBound(1000, 1000, 1_000_000))
    assert not found.more and not found.too_large
    return dict(found.items)


def submit(store: RecordStore, n: int) -> None:
    assert store.admit(AGENT, f"r{n}", n, f"submission {n}".encode()) == (n, False)


def consume(
    leader: RecordStore, fence: Fence, seq: int, numbers: list[int], pieces: bool = False
) -> None:
    """A step's consumption, its checkpoint as bytes or (a node's) pieces made as written."""
    leader.read_inbox(AGENT)
    consumed = [Consumed(n, f"r{n}", f"reply {n}".encode() if n % 2 else None) for n in numbers]
    state = f"c{seq}".encode()
    blob = BlobPieces(len(state), iter([state[:1], state[1:]])) if pieces else state
    leader.put_checkpoint(AGENT, fence, seq, blob, consumed=consumed)


def run(backend: CountingBackend, fresh_leader_each_time: bool) -> list[list[str]]:
    """Ten submissions consumed in steps of one or two, each step's read of the inbox first;
    the calls of each consumption but its inbox read."""
    submitter = RecordStore(backend)
    leader = RecordStore(backend, keep_replies=KEEP)
    fence = fence_of(leader.cas_lease(AGENT, None, lease("n1", 1)))
    calls = []
    for seq, numbers in enumerate([[1], [2, 3], [4], [5, 6], [7], [8], [9, 10]], 1):
        for n in numbers:
            submit(submitter, n)
        if fresh_leader_each_time:  # a client with no ledger reads the inbox's records
            leader = RecordStore(backend, keep_replies=KEEP)
        backend.calls.clear()
        consume(leader, fence, seq, numbers)
        calls.append([call for call in backend.calls if call != "scan"])
    return calls


def test_later_consumptions_are_one_commit_and_leave_what_reading_leaves() -> None:
    guessing, reading = CountingBackend(), CountingBackend()
    calls = run(guessing, fresh_leader_each_time=False)
    run(reading, fresh_leader_each_time=True)
    assert calls[0] == ["commit", "commit"]  # the term's first reads the records
    assert calls[1:] == [["commit"]] * 6
    assert inbox_records(guessing) == inbox_records(reading)
    records = inbox_records(guessing)
    assert records[KEYS.kept] == str(KEEP).encode()
    assert (
        records[KEYS.consumed]
        == b"10 " + str(sum(len(f"submission {n}") for n in range(1, 11))).encode()
    )
    kept = sorted(key for key in records if key.startswith(KEYS.done))
    assert kept == [KEYS.reply(n, f"r{n}") for n in (8, 9, 10)]
    assert KEYS.request("r7") not in records and KEYS.request("r8") in records
    leader = RecordStore(guessing)
    assert leader.read_admission(AGENT, "r7") is None  # forgotten with its reply
    state = leader.read_admission(AGENT, "r9")
    assert state is not None and state.consumed and state.reply == b"reply 9"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param(KEYS.kept, b"0", id="kept-count"),
        pytest.param(KEYS.consumed, b"0 0", id="consumed-totals"),
        pytest.param(KEYS.request("r3"), b"3 999", id="request-record"),
        pytest.param(KEYS.reply(3, "r3"), b"-", id="reply-present"),
        pytest.param(KEYS.request("r1"), None, id="removed-reply-request-gone"),
    ],
)
@pytest.mark.parametrize("pieces", [False, True], ids=["bytes", "pieces"])
def test_a_guess_a_record_proves_wrong_reads_and_ends_as_reading(
    key: str, value: bytes | None, pieces: bool
) -> None:
    """A record not as the last consumption left it (a writer without the secret, or another
    client): the guessed commit fails, nothing of it is written, and the checkpoint reads the
    records and commits what a reading checkpoint commits."""
    outcomes = []
    for guess in (True, False):
        backend = CountingBackend()
        submitter = RecordStore(backend)
        leader = RecordStore(backend, keep_replies=2)
        fence = fence_of(leader.cas_lease(AGENT, None, lease("n1", 1)))
        for n in (1, 2, 3):
            submit(submitter, n)
        consume(leader, fence, 1, [1])
        consume(leader, fence, 2, [2])
        leader.read_inbox(AGENT)
        backend.commit(Txn(writes=[Put(key, value) if value is not None else DeleteRange(key)]))
        if not guess:
            leader = RecordStore(backend, keep_replies=2)
        backend.calls.clear()
        consume(leader, fence, 3, [3], pieces=pieces)  # written again after a wrong guess
        if guess:
            assert backend.calls.count("commit") >= 3  # the failed guess, the read, the commit
        outcomes.append(inbox_records(backend))
    assert outcomes[0] == outcomes[1]


def test_another_terms_consumptions_are_not_guessed_from() -> None:
    """A leader that lost the lease and took it back plans from the records, not its ledger:
    the other term's consumptions count."""
    backend = CountingBackend()
    submitter, mine, other = RecordStore(backend), RecordStore(backend), RecordStore(backend)
    first = mine.cas_lease(AGENT, None, lease("n1", 1))
    for n in (1, 2, 3):
        submit(submitter, n)
    consume(mine, fence_of(first), 1, [1])
    second = other.cas_lease(AGENT, first.version, lease("n2", 2, session="s2"))
    consume(other, fence_of(second), 2, [2])
    third = mine.cas_lease(AGENT, second.version, lease("n1", 3, session="s3"))
    backend.calls.clear()
    consume(mine, fence_of(third), 3, [3])
    assert backend.calls.count("commit") == 2  # the listing and the records in one, then the commit
    assert inbox_records(backend)[KEYS.consumed] == b"3 " + str(3 * len("submission 1")).encode()


def test_a_new_terms_first_removal_reads_the_request_ids_the_next_ones_need() -> None:
    """A leader of a new term removing replies another term wrote reads their request ids
    once, with the oldest others', and its next consumptions are one commit each again."""
    backend = CountingBackend()
    run(backend, fresh_leader_each_time=False)
    submitter, taker = RecordStore(backend), RecordStore(backend, keep_replies=KEEP)
    held = taker.read_lease(AGENT)
    assert held is not None
    fence = fence_of(taker.cas_lease(AGENT, held.version, lease("n2", 2, session="s2")))
    calls = []
    for seq, n in enumerate((11, 12, 13), 11):
        submit(submitter, n)
        backend.calls.clear()
        consume(taker, fence, seq, [n])
        calls.append([call for call in backend.calls if call != "scan"])
    assert calls == [["commit", "commit", "commit"], ["commit"], ["commit"]]
    records = inbox_records(backend)
    assert sorted(key for key in records if key.startswith(KEYS.done)) == [
        KEYS.reply(n, f"r{n}") for n in (11, 12, 13)
    ]
    assert not any(KEYS.request(f"r{n}") in records for n in range(1, 11))
