"""The inbox's part of the store contract (admit, read_inbox, read_admission, and the
consumption put_checkpoint commits), on every backend (DESIGN.md invariant 9).

A submission is admitted once per request id, in one atomic step of the store,
under the number the submitter sealed it for; consumption and replies commit
with the checkpoint of the step that consumed them, all or nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from hamsterbunker.core.errors import Fenced, InboxFull, NotNextNumber, StoreError
from hamsterbunker.core.limits import (
    MAX_CONSUMED_PER_STEP,
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    MAX_REPLY_BYTES,
    MAX_SUBMISSION_BYTES,
)
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.base import AdmissionState, Consumed, Fence
from hamsterbunker.stores.interface import Store
from tests.support.store_watch import WAIT_S, next_wake

from .conftest import KEEP_REPLIES, Opener


def lease(holder: str | None, epoch: int, session: str = "s1") -> LeaseRecord:
    return LeaseRecord(holder=holder, region="eu", session=session, epoch=epoch, ttl_ms=2000)


def held(store: Store, holder: str = "n1", epoch: int = 1) -> Fence:
    record = store.cas_lease("a", None, lease(holder, epoch))
    return Fence(holder=holder, session=record.session, epoch=record.epoch)


def admit_all(store: Store, count: int, prefix: str = "r") -> None:
    """Admit count submissions r1, r2, ... as numbers 1, 2, ... (a fresh inbox)."""
    for number in range(1, count + 1):
        assert store.admit("a", f"{prefix}{number}", number, b"p%d" % number) == (number, False)


def test_an_empty_inbox(store: Store) -> None:
    """Nothing admitted: nothing listed, no request id known."""
    assert store.read_inbox("a") == []
    assert store.read_admission("a", "r1") is None


def test_admitted_submissions_are_listed_to_another_client_oldest_first(
    store: Store, open_second: Opener
) -> None:
    """Each admission is durable and listed, byte for byte, by number."""
    assert store.admit("a", "r1", 1, b"first") == (1, False)
    assert store.admit("a", "r2", 2, b"\x00\xff" * 100) == (2, False)
    other = open_second()
    assert other.read_inbox("a") == [(1, b"first"), (2, b"\x00\xff" * 100)]
    assert other.read_inbox("a", after=1) == [(2, b"\x00\xff" * 100)]
    assert other.read_admission("a", "r2") == AdmissionState(2, consumed=False, reply=None)


def test_only_the_next_number_is_admitted(store: Store) -> None:
    """A number other than the next one is refused, storing nothing, and the next is named."""
    with pytest.raises(NotNextNumber) as refused:
        store.admit("a", "r1", 2, b"p")
    assert refused.value.next_number == 1
    assert store.read_inbox("a") == []
    store.admit("a", "r1", 1, b"p")
    for wrong in (1, 3, 100):
        with pytest.raises(NotNextNumber) as refused:
            store.admit("a", "r2", wrong, b"p")
        assert refused.value.next_number == 2
    assert store.read_admission("a", "r2") is None


def test_a_second_admission_of_a_request_id_is_a_duplicate_and_stores_nothing(
    store: Store,
) -> None:
    """Whatever number and bytes it brings, a known request id answers with its first number."""
    store.admit("a", "r1", 1, b"first")
    assert store.admit("a", "r1", 2, b"second") == (1, True)
    assert store.admit("a", "r1", 1, b"again") == (1, True)
    assert store.read_inbox("a") == [(1, b"first")]
    assert store.admit("a", "r2", 2, b"p") == (2, False)  # the next number did not move


def test_two_agents_have_separate_inboxes(store: Store) -> None:
    store.admit("a", "r1", 1, b"for a")
    assert store.admit("b", "r1", 1, b"for b") == (1, False)
    assert store.read_inbox("b") == [(1, b"for b")]


def test_clients_racing_with_one_request_id_get_one_admission(open_client: Opener) -> None:
    """Eight clients admit the same request id at once: exactly one is not a duplicate."""
    clients = [open_client() for _ in range(8)]
    barrier = threading.Barrier(len(clients))
    answers: list[tuple[int, bool]] = []

    def submit(client: Store) -> None:
        barrier.wait(timeout=30)
        answers.append(client.admit("a", "same", 1, b"p"))

    threads = [threading.Thread(target=submit, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == [(1, False)] + [(1, True)] * 7
    assert clients[0].read_inbox("a") == [(1, b"p")]


def test_clients_racing_for_numbers_each_get_their_own(open_client: Opener) -> None:
    """Racing admissions of different ids, each retried at the number it is told: no
    number is given twice, none is skipped, none overwrites another."""
    clients = [open_client() for _ in range(4)]
    per_client = 5
    admitted: dict[str, int] = {}
    lock = threading.Lock()

    def submit(index: int, client: Store) -> None:
        number = 1
        for k in range(per_client):
            request_id = f"c{index}-{k}"
            for _attempt in range(200):
                try:
                    got, duplicate = client.admit("a", request_id, number, request_id.encode())
                except NotNextNumber as exc:
                    number = exc.next_number
                    continue
                assert not duplicate
                with lock:
                    admitted[request_id] = got
                number = got + 1
                break

    threads = [threading.Thread(target=submit, args=pair) for pair in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    total = len(clients) * per_client
    assert sorted(admitted.values()) == list(range(1, total + 1))
    listed = clients[0].read_inbox("a")
    assert [number for number, _blob in listed] == list(range(1, total + 1))
    assert {blob.decode(): number for number, blob in listed} == admitted


def test_out_of_bounds_admissions_are_refused_and_store_nothing(store: Store) -> None:
    """An oversized payload or a request id that is no name: StoreError, nothing admitted."""
    with pytest.raises(StoreError, match=f"above the limit of {MAX_SUBMISSION_BYTES} bytes"):
        store.admit("a", "big", 1, b"x" * (MAX_SUBMISSION_BYTES + 1))
    for bad in ("", "a/b", "../x", " x", "x" * 129, "é"):
        with pytest.raises(StoreError, match="request id"):
            store.admit("a", bad, 1, b"p")
    with pytest.raises(StoreError, match="outside"):
        store.admit("a", "r", 0, b"p")
    assert store.read_inbox("a") == []
    assert store.admit("a", "ok", 1, b"x" * MAX_SUBMISSION_BYTES) == (1, False)


def test_the_inbox_count_limit_refuses_admissions_until_some_are_consumed(store: Store) -> None:
    """At MAX_INBOX_COUNT unconsumed, admission is refused with the limit in the message;
    consuming one makes room for one; a duplicate is still answered when full."""
    admit_all(store, MAX_INBOX_COUNT)
    with pytest.raises(InboxFull, match=str(MAX_INBOX_COUNT)):
        store.admit("a", "over", MAX_INBOX_COUNT + 1, b"p")
    assert store.read_admission("a", "over") is None
    assert store.admit("a", "r7", 1, b"p") == (7, True)
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(3, "r3", None)])
    assert store.admit("a", "over", MAX_INBOX_COUNT + 1, b"p") == (MAX_INBOX_COUNT + 1, False)
    with pytest.raises(InboxFull):
        store.admit("a", "over2", MAX_INBOX_COUNT + 2, b"p")


def test_the_inbox_byte_limit_refuses_admissions(store: Store) -> None:
    """Unconsumed submissions may hold MAX_INBOX_BYTES between them, not a byte more."""
    count = MAX_INBOX_BYTES // MAX_SUBMISSION_BYTES
    for number in range(1, count + 1):
        store.admit("a", f"r{number}", number, b"x" * MAX_SUBMISSION_BYTES)
    with pytest.raises(InboxFull, match=str(MAX_INBOX_BYTES)):
        store.admit("a", "one-more-byte", count + 1, b"x")
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(1, "r1", None)])
    assert store.admit("a", "fits", count + 1, b"x" * MAX_SUBMISSION_BYTES) == (count + 1, False)


def test_consumption_commits_with_the_checkpoint(store: Store, open_second: Opener) -> None:
    """Once the checkpoint is stored, the consumed are no longer listed and their replies
    are readable; the request ids are still known as duplicates."""
    admit_all(store, 3)
    fence = held(store)
    info = store.put_checkpoint(
        "a", fence, 1, b"cp", [Consumed(1, "r1", b"reply one"), Consumed(3, "r3", None)]
    )
    assert info.seq == 1
    other = open_second()
    assert other.read_inbox("a") == [(2, b"p2")]
    assert other.read_admission("a", "r1") == AdmissionState(1, consumed=True, reply=b"reply one")
    assert other.read_admission("a", "r3") == AdmissionState(3, consumed=True, reply=None)
    assert other.read_admission("a", "r2") == AdmissionState(2, consumed=False, reply=None)
    assert other.admit("a", "r1", 4, b"again") == (1, True)
    assert [i.seq for i in other.list_checkpoints("a")] == [1]


def test_a_fenced_checkpoint_consumes_nothing(store: Store) -> None:
    """A checkpoint refused by the fence leaves every submission unconsumed, no reply."""
    admit_all(store, 2)
    stale = held(store)
    current = store.read_lease("a")
    assert current is not None
    store.cas_lease("a", current.version, lease("n2", 2, session="s2"))
    with pytest.raises(Fenced):
        store.put_checkpoint("a", stale, 1, b"cp", [Consumed(1, "r1", b"no")])
    assert [n for n, _b in store.read_inbox("a")] == [1, 2]
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=False, reply=None)


@pytest.mark.parametrize("problem", ["too many", "reply too big", "bad request id"])
def test_a_checkpoint_with_out_of_bounds_consumption_stores_nothing(
    store: Store, problem: str
) -> None:
    """Over the per-step limit, an oversized reply, a malformed id: StoreError, and neither
    the checkpoint nor any consumption is stored."""
    admit_all(store, MAX_CONSUMED_PER_STEP + 1)
    consumed = {
        "too many": [Consumed(n, f"r{n}", None) for n in range(1, MAX_CONSUMED_PER_STEP + 2)],
        "reply too big": [Consumed(1, "r1", b"x" * (MAX_REPLY_BYTES + 1))],
        "bad request id": [Consumed(1, "r/1", None)],
    }[problem]
    with pytest.raises(StoreError):
        store.put_checkpoint("a", held(store), 1, b"cp", consumed)
    assert store.list_checkpoints("a") == []
    assert len(store.read_inbox("a")) == MAX_CONSUMED_PER_STEP + 1
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=False, reply=None)


def test_the_most_a_step_may_consume_fits_in_one_checkpoint(store: Store) -> None:
    """MAX_CONSUMED_PER_STEP consumed, each with a reply at the size limit, commit together."""
    admit_all(store, MAX_CONSUMED_PER_STEP)
    reply = b"y" * MAX_REPLY_BYTES
    consumed = [Consumed(n, f"r{n}", reply) for n in range(1, MAX_CONSUMED_PER_STEP + 1)]
    store.put_checkpoint("a", held(store), 1, b"cp", consumed)
    assert store.read_inbox("a") == []
    last = store.read_admission("a", f"r{MAX_CONSUMED_PER_STEP}")
    assert last == AdmissionState(MAX_CONSUMED_PER_STEP, consumed=True, reply=reply)


def test_a_number_without_a_pending_entry_is_still_recorded_consumed(store: Store) -> None:
    """Consuming a number the store no longer lists records it (and its reply) all the same."""
    admit_all(store, 1)
    fence = held(store)
    store.put_checkpoint("a", fence, 1, b"cp", [Consumed(1, "r1", b"one")])
    store.put_checkpoint("a", fence, 2, b"cp", [Consumed(1, "r1", b"one")])  # a retried write
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=True, reply=b"one")
    assert store.read_inbox("a") == []


def test_only_the_newest_consumed_are_kept_and_older_ids_are_new_again(store: Store) -> None:
    """Past keep_replies consumed, the oldest are forgotten: no reply, and their request
    id is admitted again as new, under the next number (numbers are never reused)."""
    total = KEEP_REPLIES + 2
    admit_all(store, total)
    fence = held(store)
    for n in range(1, total + 1):
        store.put_checkpoint("a", fence, n, b"cp", [Consumed(n, f"r{n}", b"re%d" % n)])
    assert store.read_admission("a", "r1") is None
    assert store.read_admission("a", "r2") is None
    for n in range(3, total + 1):
        assert store.read_admission("a", f"r{n}") == AdmissionState(n, True, b"re%d" % n)
    assert store.admit("a", "r1", total + 1, b"again") == (total + 1, False)
    assert store.admit("a", f"r{total}", total + 2, b"dup") == (total, True)


def test_numbers_go_on_after_everything_was_consumed(store: Store, open_second: Opener) -> None:
    """The next number never goes back, even when nothing is left in the inbox."""
    admit_all(store, 2)
    store.put_checkpoint(
        "a", held(store), 1, b"cp", [Consumed(1, "r1", None), Consumed(2, "r2", None)]
    )
    with pytest.raises(NotNextNumber) as refused:
        open_second().admit("a", "r3", 1, b"p")
    assert refused.value.next_number == 3


def test_watch_wakes_on_an_admission_and_on_a_consumption(
    store: Store, open_second: Opener
) -> None:
    """A node waiting on its inbox and a client waiting for a reply are woken by the store."""
    writer = open_second()

    async def run() -> None:
        watcher = store.watch("a")
        try:
            await next_wake(watcher, writer)  # the watch is set up from here on
            wakes = _Wakes(watcher)
            fence = await asyncio.to_thread(_fence_of_current, writer)
            await wakes.until_quiet()
            await asyncio.to_thread(writer.admit, "a", "r1", 1, b"p")
            assert await wakes.next(WAIT_S), "no wake for an admission"
            await wakes.until_quiet()
            await asyncio.to_thread(
                writer.put_checkpoint, "a", fence, 1, b"cp", [Consumed(1, "r1", b"r")]
            )
            assert await wakes.next(WAIT_S), "no wake for a consumption"
            wakes.close()
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(run())


def _fence_of_current(store: Store) -> Fence:
    current = store.read_lease("a")
    assert current is not None and current.holder is not None
    return Fence(current.holder, current.session, current.epoch)


class _Wakes:
    """A watch's wakes one by one, waited for without cancelling the watch in between."""

    def __init__(self, watcher: AsyncIterator[None]) -> None:
        self._watcher = watcher
        self._pending: asyncio.Future[None] | None = None

    async def next(self, timeout: float) -> bool:
        if self._pending is None:
            self._pending = asyncio.ensure_future(anext(self._watcher))
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if done:
            self._pending.result()
            self._pending = None
        return bool(done)

    async def until_quiet(self, quiet_s: float = 0.5) -> None:
        """Take the wakes still owed for earlier writes, until none comes for quiet_s
        (bounded), so that the next wake is for the next write."""
        for _ in range(100):
            if not await self.next(quiet_s):
                return
        raise AssertionError("the watch never went quiet")

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
