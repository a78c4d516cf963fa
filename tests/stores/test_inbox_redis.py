"""The Redis store's inbox against hostile contents (DESIGN.md invariants 9 and 10).

Someone who can write the Redis database but lacks the secret may put anything
under the inbox's keys (``hamsterbunker.stores.redis.inbox``): keys of another
type, numbers that are not ours, huge values, a counter or byte total that is
junk. read_inbox and read_admission never raise or hang and read within their
bounds; admit rebuilds a counter or byte total that cannot be believed from the
stored entries (reported once), never giving a number twice; a checkpoint still
publishes and consumes.
Admission and consumption are each one script: a refused checkpoint consumes
nothing, whatever junk it met.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from hamsterbunker.errors import CorruptRecord, Fenced, NotNextNumber, StoreError
from hamsterbunker.limits import (
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    MAX_REPLY_BYTES,
    MAX_SEQ,
    MAX_SUBMISSION_BYTES,
)
from hamsterbunker.stores.base import AdmissionState, Consumed, Fence
from hamsterbunker.stores.redis import RedisStore
from hamsterbunker.stores.redis.inbox import REPLIES_REMOVED_PER_CHECKPOINT
from tests.support.records import fence_of, lease
from tests.support.redis_server import redis_url

pytestmark = pytest.mark.timeout(60)

KEEP_REPLIES = 4


@pytest.fixture
def store() -> Iterator[RedisStore]:
    opened = RedisStore(redis_url(), keep_replies=KEEP_REPLIES)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def raw(store: RedisStore) -> Any:
    return store._redis


def key(store: RedisStore, name: str = "") -> str:
    """The key of the inbox part named ('' for the counter's hash)."""
    return store._key("a", "inbox", *([name] if name else []))


def held(store: RedisStore) -> Fence:
    return fence_of(store.cas_lease("a", None, lease("n1", 1)))


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("hamsterbunker.stores.redis")
    ]


def snapshot(store: RedisStore, raw: Any) -> dict[str, Any]:
    """Everything stored under the inbox's keys, raw."""
    found: dict[str, Any] = {}
    for name in ("", "pending", "numbers", "ids", "consumed", "replies", "kept"):
        k = key(store, name)
        kind = raw.type(k)
        if kind == b"hash":
            found[name] = raw.hgetall(k)
        elif kind == b"zset":
            found[name] = raw.zrange(k, 0, -1, withscores=True)
        elif kind != b"none":
            found[name] = (kind, raw.dump(k))
    return found


# -- the layout ---------------------------------------------------------------------


def test_the_keys_are_as_documented(store: RedisStore, raw: Any) -> None:
    """Admission writes entry, number, request id, counter and byte total; consumption
    moves the entry to the consumed records and takes its bytes off the total."""
    store.admit("a", "r1", 1, b"abc")
    store.admit("a", "r2", 2, b"defgh")
    assert raw.hgetall(key(store)) == {b"last": b"2", b"bytes": b"8"}
    assert raw.hgetall(key(store, "pending")) == {b"1": b"abc", b"2": b"defgh"}
    assert raw.zrange(key(store, "numbers"), 0, -1, withscores=True) == [(b"1", 1.0), (b"2", 2.0)]
    assert raw.hgetall(key(store, "ids")) == {b"r1": b"1", b"r2": b"2"}
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(1, "r1", b"re")])
    assert raw.hgetall(key(store)) == {b"last": b"2", b"bytes": b"5"}
    assert raw.hgetall(key(store, "pending")) == {b"2": b"defgh"}
    assert raw.hgetall(key(store, "consumed")) == {b"1": b"r1"}
    assert raw.hgetall(key(store, "replies")) == {b"1": b"re"}
    assert raw.zrange(key(store, "kept"), 0, -1) == [b"1"]


def test_numbers_near_max_seq_are_exact(store: RedisStore, raw: Any) -> None:
    """A counter near MAX_SEQ is answered digit for digit (never 9.007e+15), and the
    number after MAX_SEQ is refused as damage, not admitted."""
    raw.hset(key(store), mapping={"last": str(MAX_SEQ - 1), "bytes": "0"})
    assert store.admit("a", "r1", MAX_SEQ, b"p") == (MAX_SEQ, False)
    assert store.read_inbox("a", after=MAX_SEQ - 1) == [(MAX_SEQ, b"p")]
    assert store.admit("a", "r1", 1, b"p") == (MAX_SEQ, True)
    with pytest.raises(CorruptRecord, match="past"):
        store.admit("a", "r2", 1, b"p")


# -- read_inbox --------------------------------------------------------------------


def test_read_inbox_leaves_out_what_is_not_ours(
    store: RedisStore, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Members that are no number as we write one, a score that is not the member's,
    numbers above MAX_SEQ, a number without an entry, an oversized entry: left out and
    logged; the admitted ones are listed."""
    store.admit("a", "r1", 1, b"one")
    store.admit("a", "r2", 2, b"two")
    numbers, pending = key(store, "numbers"), key(store, "pending")
    raw.zadd(numbers, {"abc": 1.5, "01": 1, "-3": 1, "1.5": 1.5, "7": 3, "x" * 10_000: 1.2})
    raw.zadd(numbers, {str(MAX_SEQ + 1): MAX_SEQ + 1, "5": 5, "6": 6})
    raw.hset(pending, "6", b"x" * (MAX_SUBMISSION_BYTES + 1))  # 5 has no entry at all
    raw.hset(pending, "abc", b"junk")
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.redis"):
        assert store.read_inbox("a") == [(1, b"one"), (2, b"two")]
        assert store.read_inbox("a", after=1) == [(2, b"two")]
    logged = " ".join(warnings_logged(caplog))
    assert "not ours" in logged and f"above the limit of {MAX_SUBMISSION_BYTES}" in logged


@pytest.mark.parametrize("name", ["pending", "numbers"])
def test_read_inbox_of_a_key_of_another_type_is_empty(
    store: RedisStore, raw: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    store.admit("a", "r1", 1, b"one")
    raw.delete(key(store, name))
    raw.rpush(key(store, name), b"junk")
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.redis"):
        assert store.read_inbox("a") == []
    assert any(f"inbox:{name} is a Redis list" in m for m in warnings_logged(caplog))


def test_read_inbox_sends_no_more_than_the_byte_limit(
    store: RedisStore, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A planted inbox over MAX_INBOX_BYTES is read up to that limit, oldest first,
    and no further: the rest follows once some are consumed."""
    count = MAX_INBOX_BYTES // MAX_SUBMISSION_BYTES + 1
    pipe = raw.pipeline(transaction=False)
    for n in range(1, count + 1):
        pipe.hset(key(store, "pending"), str(n), b"x" * MAX_SUBMISSION_BYTES)
        pipe.zadd(key(store, "numbers"), {str(n): n})
    pipe.execute()
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.redis"):
        listed = store.read_inbox("a")
    assert [n for n, _b in listed] == list(range(1, count))
    assert sum(len(b) for _n, b in listed) <= MAX_INBOX_BYTES
    assert any("stopped reading" in m for m in warnings_logged(caplog))
    assert [n for n, _b in store.read_inbox("a", after=count - 1)] == [count]


def test_read_inbox_looks_at_no_more_than_the_count_limit(store: RedisStore, raw: Any) -> None:
    pipe = raw.pipeline(transaction=False)
    for n in range(1, MAX_INBOX_COUNT + 51):
        pipe.hset(key(store, "pending"), str(n), b"p")
        pipe.zadd(key(store, "numbers"), {str(n): n})
    pipe.execute()
    listed = store.read_inbox("a")
    assert [n for n, _b in listed] == list(range(1, MAX_INBOX_COUNT + 1))


# -- read_admission ----------------------------------------------------------------


@pytest.mark.parametrize("junk", [b"x", b"0", b"01", b"-1", b"1.5", b"9" * 17, b"9" * 100_000])
def test_a_request_id_naming_no_number_is_unknown(
    store: RedisStore, raw: Any, junk: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    raw.hset(key(store, "ids"), "r1", junk)
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.redis"):
        assert store.read_admission("a", "r1") is None
    assert any("taken as unknown" in m for m in warnings_logged(caplog))


def test_a_damaged_consumed_record_gives_no_reply(store: RedisStore, raw: Any) -> None:
    """A reply over MAX_REPLY_BYTES is not read; a record under another request id (or
    a huge one) gives no reply: consumed, without one."""
    store.admit("a", "r1", 1, b"p")
    store.admit("a", "r2", 2, b"p")
    store.admit("a", "r3", 3, b"p")
    consumed = [Consumed(1, "r1", b"a"), Consumed(2, "r2", b"b"), Consumed(3, "r3", b"c")]
    store.put_checkpoint("a", held(store), 1, b"cp", consumed)
    raw.hset(key(store, "replies"), "1", b"y" * (MAX_REPLY_BYTES + 1))
    raw.hset(key(store, "consumed"), "2", b"someone-else")
    raw.hset(key(store, "consumed"), "3", b"r" * 1_000_000)
    for n in (1, 2, 3):
        assert store.read_admission("a", f"r{n}") == AdmissionState(n, consumed=True, reply=None)


@pytest.mark.parametrize("name", ["ids", "consumed", "replies"])
def test_read_admission_of_a_key_of_another_type_is_unknown(
    store: RedisStore, raw: Any, name: str
) -> None:
    store.admit("a", "r1", 1, b"p")
    raw.delete(key(store, name))
    raw.set(key(store, name), b"junk")
    assert store.read_admission("a", "r1") is None


# -- admit -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "junk"),
    [
        ("last", b"abc"),
        ("last", b"-1"),
        ("last", b"007"),
        ("last", b"1e3"),
        ("last", b""),
        ("last", str(MAX_SEQ + 1).encode()),
        ("last", b"1" * 1_000_000),
        ("bytes", b"lots"),
        ("bytes", b"-5"),
        ("bytes", b"9" * 40),
        ("", b"string"),  # the counter's key of another type
        ("", b"list"),
    ],
)
def test_a_junk_counter_or_total_is_rebuilt_from_the_stored_entries(
    store: RedisStore, raw: Any, field: str, junk: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """One junk write never stops admissions (DESIGN.md invariant 10): the counter is
    rebuilt as the highest number stored (here a kept consumed one, above the pending),
    the total as the pending entries' bytes, reported once, never a Lua error. The next
    admission goes above every stored entry, the pending entries are untouched, and the
    consumption and the limits count right afterwards."""
    for n, blob in ((1, b"one"), (2, b"two"), (3, b"three")):
        store.admit("a", f"r{n}", n, blob)
    fence = held(store)
    store.put_checkpoint("a", fence, 1, b"cp", [Consumed(3, "r3", b"re")])
    if field:
        raw.hset(key(store), field, junk)
    else:
        raw.delete(key(store))
        if junk == b"list":
            raw.rpush(key(store), b"junk")
        else:
            raw.set(key(store), b"junk")
    caplog.set_level(logging.WARNING)
    with pytest.raises(NotNextNumber) as refused:  # a client starting over: never 1 again
        store.admit("a", "r4", 1, b"four")
    assert refused.value.next_number == 4
    assert raw.hgetall(key(store)) == {b"last": b"3", b"bytes": b"6"}  # kept, never back
    assert store.admit("a", "r4", 4, b"four") == (4, False)
    assert store.read_inbox("a") == [(1, b"one"), (2, b"two"), (4, b"four")]
    assert store.read_admission("a", "r4") == AdmissionState(4, consumed=False, reply=None)
    assert store.read_admission("a", "r3") == AdmissionState(3, consumed=True, reply=b"re")
    assert raw.hgetall(key(store)) == {b"last": b"4", b"bytes": b"10"}
    rebuilt = [m for m in warnings_logged(caplog) if "rebuilt" in m]
    assert len(rebuilt) == 1 and key(store) in rebuilt[0]
    assert "lua" not in rebuilt[0].lower()
    consumed = [Consumed(1, "r1", None), Consumed(2, "r2", None), Consumed(4, "r4", b"re4")]
    store.put_checkpoint("a", fence, 2, b"cp", consumed)
    assert store.read_inbox("a") == []
    assert raw.hgetall(key(store)) == {b"last": b"4", b"bytes": b"0"}
    assert store.admit("a", "r5", 5, b"five!") == (5, False)
    assert raw.hgetall(key(store)) == {b"last": b"5", b"bytes": b"5"}


def test_a_total_forged_to_look_full_is_counted_again_before_a_refusal(
    store: RedisStore, raw: Any
) -> None:
    """A byte total that parses but says the inbox is full (one write) does not refuse
    admissions for good: it is counted again from the pending entries, and the
    submission is admitted."""
    store.admit("a", "r1", 1, b"one")
    raw.hset(key(store), "bytes", str(MAX_INBOX_BYTES).encode())
    assert store.admit("a", "r2", 2, b"two") == (2, False)
    assert raw.hgetall(key(store)) == {b"last": b"2", b"bytes": b"6"}


def test_a_rebuilt_counter_counts_the_pending_entries_up_to_the_limits(
    store: RedisStore, raw: Any
) -> None:
    """Rebuilt from the pending entries alone: the highest of them, and their bytes,
    but never from a number above MAX_SEQ nor an entry bigger than a submission may be
    (never read, so never consumed): one planted key must not fill the inbox for good."""
    store.admit("a", "r1", 1, b"one")
    store.admit("a", "r2", 2, b"two")
    raw.hset(key(store, "pending"), "3", b"z" * (MAX_SUBMISSION_BYTES + 1))
    raw.zadd(key(store, "numbers"), {"3": 3, "junk": MAX_SEQ + 10})
    raw.hset(key(store), mapping={"last": b"junk", "bytes": b"junk"})
    assert store.admit("a", "r4", 4, b"four") == (4, False)
    assert raw.hgetall(key(store)) == {b"last": b"4", b"bytes": b"10"}


@pytest.mark.parametrize("name", ["pending", "numbers", "ids", "consumed", "replies", "kept"])
def test_other_inbox_keys_of_another_type_are_replaced_by_an_admission(
    store: RedisStore, raw: Any, name: str
) -> None:
    """They hold nothing readable: the next admission replaces them and is listed (the
    byte total restarting when the pending entries were lost)."""
    store.admit("a", "r1", 1, b"one")
    raw.delete(key(store, name))
    raw.set(key(store, name), b"junk")
    assert store.admit("a", "r2", 2, b"two") == (2, False)
    listed = store.read_inbox("a")
    assert listed[-1] == (2, b"two")
    if name in ("pending", "numbers"):
        assert listed == [(2, b"two")]
        assert raw.hget(key(store), "bytes") == b"3"
    assert store.read_admission("a", "r2") == AdmissionState(2, consumed=False, reply=None)


def test_a_planted_entry_above_the_counter_is_replaced_not_counted_twice(
    store: RedisStore, raw: Any
) -> None:
    store.admit("a", "r1", 1, b"one")
    raw.hset(key(store, "pending"), "2", b"z" * 1000)
    raw.zadd(key(store, "numbers"), {"2": 2})
    assert store.admit("a", "r2", 2, b"two") == (2, False)
    assert store.read_inbox("a") == [(1, b"one"), (2, b"two")]
    assert raw.hget(key(store), "bytes") == b"6"


# -- consumption is one script with the checkpoint ---------------------------------


def test_a_fenced_checkpoint_consumes_nothing_among_junk(store: RedisStore, raw: Any) -> None:
    """Refused by the fence: not one byte of the inbox changes, junk keys included."""
    store.admit("a", "r1", 1, b"one")
    stale = held(store)
    current = store.read_lease("a")
    assert current is not None
    store.cas_lease("a", current.version, lease("n2", 2, session="s2"))
    raw.set(key(store, "kept"), b"junk")  # would be replaced by an accepted checkpoint
    before = snapshot(store, raw)
    with pytest.raises(Fenced):
        store.put_checkpoint("a", stale, 1, b"cp", [Consumed(1, "r1", b"no")])
    assert snapshot(store, raw) == before


def test_a_checkpoint_refused_for_its_seq_consumes_nothing(store: RedisStore, raw: Any) -> None:
    """The seq check refuses after the fence passed, still before the first write."""
    store.admit("a", "r1", 1, b"one")
    fence = held(store)
    store.put_checkpoint("a", fence, 2, b"cp")
    before = snapshot(store, raw)
    with pytest.raises(StoreError, match="must increase"):
        store.put_checkpoint("a", fence, 2, b"cp", [Consumed(1, "r1", b"no")])
    assert snapshot(store, raw) == before
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=False, reply=None)


def test_a_checkpoint_consumes_whatever_the_inbox_keys_hold(store: RedisStore, raw: Any) -> None:
    """Every inbox key but the counter's of another type: the checkpoint is still published
    (never a Lua error) and the consumption recorded; the counter is left alone, and the
    byte total restarts at 0 with the pending entries, which were lost."""
    store.admit("a", "r1", 1, b"one")
    for name in ("pending", "numbers", "ids", "consumed", "replies", "kept"):
        raw.delete(key(store, name))
        raw.rpush(key(store, name), b"junk")
    raw.hset(key(store), "bytes", b"junk")
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(1, "r1", b"re")])
    assert [i.seq for i in store.list_checkpoints("a")] == [1]
    assert store.read_admission("a", "r1") == AdmissionState(1, consumed=True, reply=b"re")
    assert raw.hgetall(key(store)) == {b"last": b"1", b"bytes": b"0"}


def test_retention_work_is_bounded_whatever_was_planted(store: RedisStore, raw: Any) -> None:
    """A kept set planted with many numbers: one checkpoint removes no more than its bound,
    and the request ids of what it removes only if they still name that number."""
    planted = 5000
    pipe = raw.pipeline(transaction=False)
    for n in range(1, planted + 1):
        pipe.zadd(key(store, "kept"), {str(n): n})
    pipe.execute()
    raw.hset(key(store, "consumed"), mapping={"1": "old", "2": "moved"})
    raw.hset(key(store, "ids"), mapping={"old": "1", "moved": "9999999"})
    raw.hset(key(store), mapping={"last": str(planted), "bytes": "0"})
    store.admit("a", "new", planted + 1, b"p")
    store.put_checkpoint("a", held(store), 1, b"cp", [Consumed(planted + 1, "new", None)])
    assert raw.zcard(key(store, "kept")) == planted + 1 - REPLIES_REMOVED_PER_CHECKPOINT
    assert raw.hgetall(key(store, "ids")) == {b"moved": b"9999999", b"new": b"5001"}
    assert raw.hgetall(key(store, "consumed")) == {str(planted + 1).encode(): b"new"}
