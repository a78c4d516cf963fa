"""Hostile contents in the Redis and etcd stores, and in MemoryStore (DESIGN.md invariant 10).

Someone who can write the store but lacks the secret (or bit rot) may put
anything under the store's keys. These tests write such junk straight into
Redis (redis-py) or etcd (etcd3gw), past the store contract, and check the
backend itself: it raises only CorruptRecord (or StoreError/Fenced where the
contract says so) and skips and logs what does not parse, and junk under
another epoch never keeps the leader's publish out. What a whole node does
with such a store is tested in tests/node/test_hostile_store.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from hamsterbunker.errors import CorruptRecord, Fenced, LeaseConflict, StoreError, UnreadableLease
from hamsterbunker.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EFFECT_BYTES,
    MAX_EFFECTS_PER_STEP,
    MAX_RECORD_BYTES,
    MAX_SEQ,
)
from hamsterbunker.records import CheckpointInfo
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.testing import MemoryStore
from tests.support import each_ended
from tests.support.raw_store import RawRecords
from tests.support.records import lease
from tests.support.records import network_event as event
from tests.support.records import network_heartbeat as heartbeat

if TYPE_CHECKING:
    from hamsterbunker.stores.base import Store
    from hamsterbunker.stores.etcd import EtcdStore
    from hamsterbunker.stores.redis import RedisStore

KEEP = 3
Put = Callable[[str | bytes, bytes], None]  # a raw etcd put of a key under agent "a"


def description(epoch: int, size: int = 4, written: object = 1.0, **extra: object) -> bytes:
    return json.dumps({"epoch": epoch, "size": size, "written": written, **extra}).encode()


def listed(store: Store, agent: str = "a") -> list[tuple[int, int]]:
    infos = store.list_checkpoints(agent)
    return [(info.seq, info.epoch) for info in infos]


# Lease records that parse as JSON in Python's json module but must never be
# believed: non-finite and huge numbers, deep nesting, wrong types, over size.
BAD_LEASES = [
    b'{"holder": "n1", "region": "eu", "session": "s", "epoch": 1, "ttl_ms": 1e400}',
    b'{"holder": "n1", "region": "eu", "session": "s", "epoch": 1, "ttl_ms": Infinity}',
    b'{"holder": "n1", "region": "eu", "session": "s", "epoch": 1, "ttl_ms": NaN}',
    b'{"holder": "n1", "region": "eu", "session": "s", "epoch": 1, "ttl_ms": 1' + b"0" * 400 + b"}",
    b"[" * 60_000,
    b'{"holder": "n1", "region": "eu", "session": "s", "epoch": 99999999999, "ttl_ms": 2000}',
    b'{"holder": 5, "region": "eu", "session": "s", "epoch": 1, "ttl_ms": 2000}',
    b"\xff\xfe",
    b" " * (MAX_RECORD_BYTES + 1),
]
LEASE_IDS = [
    "ttl-1e400",
    "ttl-Infinity",
    "ttl-NaN",
    "ttl-huge-int",
    "nested",
    "epoch-too-big",
    "holder-int",
    "not-utf8",
    "oversize",
]

# Fences that are not [holder, session, epoch] as the store writes them.
BAD_FENCES = [
    b"[1,",
    b'"x"',
    b"[null]",
    b'{"a": 1}',
    b"[" * 60_000,
    b'["n2", "s2", 1e400]',
    b'["n2", "s2", "two"]',
    b"\xff",
]


# -- Redis -----------------------------------------------------------------------


@pytest.fixture
def redis_pair() -> Iterator[tuple[RedisStore, Any]]:
    """A RedisStore on a fresh prefix of the shared server, and a raw redis-py client."""
    from hamsterbunker.stores.redis import RedisStore
    from tests.support.redis_server import redis_url

    store = RedisStore(redis_url(), keep_checkpoints=KEEP, events_per_node=10)
    try:
        yield store, store._redis
    finally:
        store.close()


def rkey(store: RedisStore, *parts: str) -> str:
    return store._key("a", *parts)


def redis_junk_checkpoints(store: RedisStore, raw: Any) -> list[bytes]:
    """Plant junk in the checkpoints hash; return the fields the listing must leave out."""
    junk: dict[bytes, bytes] = {
        # Names that are not a seq as the store writes one (some of the fence's epoch:
        # read as numbers by Lua's tonumber, they would refuse the publish).
        b"zzz": description(1),
        b"": description(1),
        b"0": description(1),
        b"-5": description(1),
        b"1e3": description(1),
        b"0x10": description(1),
        b"007": description(1),
        b" 8": description(1),
        b"99999999999999999999": description(1),
        str(MAX_SEQ + 1).encode(): description(1),
        b"\xff\xfe": description(1),
        # Seqs above the new one whose descriptions do not decode or are out of range.
        b"50": b"{not json",
        b"51": b'{"epoch": "x", "size": 1, "written": 1}',
        b"52": b"[" * 60_000,
        b"53": b'{"epoch": Infinity, "size": 1, "written": 1}',
        b"54": b'{"epoch": 1e400, "size": 1, "written": 1}',
        b"55": description(1, size=10**30),
        b"56": description(1, size=-1),
        b"57": b"null",
        b"58": description(10_000_000_000),
        b"59": b" " * (MAX_RECORD_BYTES + 1),
        b"60": description(1, written="yesterday"),
        b"61": b'{"epoch": 1, "size": 1, "written": NaN}',
    }
    raw.hset(rkey(store, "checkpoints"), mapping=junk)
    # Well-formed, but of another epoch and above: junk the runtime cannot
    # authenticate. It is listed (only the runtime can judge it), never blocks.
    raw.hset(rkey(store, "checkpoints"), "99", description(9))
    raw.hset(rkey(store, "blobs"), "99", b"junk")
    return list(junk)


def test_redis_junk_checkpoint_fields_never_break_or_block_a_publish(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """Non-numeric fields, undecodable descriptions, odd numbers: the Lua script passes them
    over (no Lua error), the listing leaves them out, and retention never touches them."""
    store, raw = redis_pair
    junk = redis_junk_checkpoints(store, raw)
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    for seq in range(1, KEEP + 3):
        store.put_checkpoint("a", fence, seq, b"ours %d" % seq)
    kept = [(seq, 1) for seq in range(KEEP + 2, 2, -1)]
    assert listed(store) == [(99, 9), *kept]
    fields = set(raw.hkeys(rkey(store, "checkpoints")))
    assert set(junk) <= fields  # nothing above the new seq, nor any junk name, was removed
    infos = store.list_checkpoints("a")
    assert store.read_checkpoint("a", infos[1]) == b"ours %d" % (KEEP + 2)


def test_redis_own_epoch_checkpoint_above_still_refuses_among_junk(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """Amid junk fields, a well-formed description of the fence's own epoch above seq still
    refuses the write (StoreError, not a Lua error), as the contract says."""
    store, raw = redis_pair
    redis_junk_checkpoints(store, raw)
    held = store.cas_lease("a", None, lease("n1", 1))
    raw.hset(rkey(store, "checkpoints"), "40", description(1))
    with pytest.raises(StoreError, match="must increase: 3 is not above 40") as caught:
        store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 3, b"x")
    assert not isinstance(caught.value, Fenced)
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 41, b"x")
    assert listed(store) == [(99, 9), (41, 1), (40, 1)]


def test_redis_damaged_entries_are_logged_once(
    redis_pair: tuple[RedisStore, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Each damaged entry is warned about once, not on every listing; a changed one again."""
    store, raw = redis_pair
    junk = redis_junk_checkpoints(store, raw)
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.redis"):
        for _ in range(3):
            assert listed(store) == [(99, 9)]
        assert len(caplog.records) == len(junk)
        raw.hset(rkey(store, "checkpoints"), "50", b"{still not json")
        listed(store)
        assert len(caplog.records) == len(junk) + 1


@pytest.mark.parametrize("fence", BAD_FENCES)
def test_redis_malformed_fence_is_fenced_not_a_crash(
    redis_pair: tuple[RedisStore, Any], fence: bytes
) -> None:
    """A fence field that does not parse refuses the write as Fenced, saying it is unreadable."""
    store, raw = redis_pair
    store.cas_lease("a", None, lease("n1", 1))
    raw.hset(rkey(store, "lease"), "fence", fence)
    with pytest.raises(Fenced, match="the lease is now"):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"x")
    assert store.list_checkpoints("a") == []


def test_redis_huge_version_and_fence_are_not_sent_back_whole(
    redis_pair: tuple[RedisStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease version or fence a store writer made huge refuses as any other (LeaseConflict;
    Fenced by an unreadable fence), the scripts sending back only its first bytes."""
    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    huge = b"9" * (4 * MAX_RECORD_BYTES)
    raw.hset(rkey(store, "lease"), mapping={"version": huge, "fence": huge})
    answers: list[Any] = []

    def answers_kept(script: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            answers.append(script(*args, **kwargs))
            return answers[-1]

        return run

    for name in ("_cas_lease", "_put_checkpoint"):
        monkeypatch.setattr(store, name, answers_kept(getattr(store, name)))
    with pytest.raises(LeaseConflict):
        store.cas_lease("a", held.version, lease("n1", 1))
    with pytest.raises(Fenced, match="an unreadable fence"):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"x")
    assert [len(answer[1]) for answer in answers] == [24, MAX_RECORD_BYTES + 1]


@pytest.mark.parametrize("record", BAD_LEASES, ids=LEASE_IDS)
def test_redis_unbelievable_lease_record_is_corrupt(
    redis_pair: tuple[RedisStore, Any], record: bytes
) -> None:
    """A lease record with an absurd TTL or epoch, deep nesting or of any size: CorruptRecord."""
    store, raw = redis_pair
    raw.hset(rkey(store, "lease"), "record", record)
    with pytest.raises(CorruptRecord):
        store.read_lease("a")


def test_redis_oversize_records_are_corrupt(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """Cluster, lease and acceptance records over MAX_RECORD_BYTES: CorruptRecord naming the size."""
    store, raw = redis_pair
    big = b"x" * (MAX_RECORD_BYTES + 1)
    raw.set(f"{store.prefix}:cluster", big)
    raw.hset(rkey(store, "lease"), "record", big)
    raw.set(rkey(store, "acceptance"), big)
    for read in (
        store.read_cluster,
        lambda: store.read_lease("a"),
        lambda: store.read_acceptance("a"),
    ):
        with pytest.raises(CorruptRecord, match=f"{MAX_RECORD_BYTES + 1} bytes"):
            read()
    # A restore's first read says so of the acceptance alone.
    restore_read = store.read_for_restore("a")
    assert restore_read.acceptance is None and restore_read.infos == []
    assert f"{MAX_RECORD_BYTES + 1} bytes" in restore_read.acceptance_problem


def test_redis_oversize_checkpoint_is_corrupt(
    redis_pair: tuple[RedisStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob over MAX_CHECKPOINT_BYTES (lowered here) is a CorruptRecord, its bytes left unsent."""
    from hamsterbunker.stores.redis import store as redis_module

    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 1, b"small")
    monkeypatch.setattr(redis_module, "MAX_CHECKPOINT_BYTES", 1000)
    raw.hset(rkey(store, "blobs"), "1", b"y" * 1001)
    [info] = store.list_checkpoints("a")
    with pytest.raises(CorruptRecord, match="1001 bytes"):
        store.read_checkpoint("a", info)
    raw.hset(rkey(store, "blobs"), "1", b"y" * 1000)
    assert store.read_checkpoint("a", info) == b"y" * 1000


def test_redis_hostile_event_counts_and_logs_are_skipped(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """Counts that are not numbers (or absurd ones), node names that are not ids, lists of the
    wrong type and oversize lines: the tail and read_events skip them and go on."""
    store, raw = redis_pair
    for n in (1, 2, 3):
        store.append_event("a", event("good", n))
    counts = rkey(store, "event-counts")
    raw.hset(
        counts,
        mapping={
            "n1": "1e300",
            "n2": "abc",
            "n3": "99999999999999999999",
            "n4": "-5",
            "n5": "",
            "../x": "3",
            b"\xff": "1",
            "wrongtype": "2",
        },
    )
    raw.set(rkey(store, "events", "wrongtype"), "not a list")
    for node in ("n1", "n2", "n3", "n4", "n5", "../x"):
        raw.rpush(rkey(store, "events", node), event("someone", 1).to_json())
    # Lines in a good node's list that must be skipped: oversize, not JSON, another node's.
    events = rkey(store, "events", "good")
    raw.rpush(events, b"[" * (MAX_RECORD_BYTES + 10), b"{nope", event("other", 4).to_json())
    raw.hincrby(counts, "good", 3)
    store.append_event("a", event("good", 7))

    tail = store.tail("a")
    assert [(e.node, e.n) for e in tail.read().events] == [("good", n) for n in (1, 2, 3, 7)]
    store.append_event("a", event("good", 8))
    assert [(e.node, e.n) for e in tail.read().events] == [("good", 8)]
    read = store.read_events("a")
    assert [(e.node, e.n) for e in read] == [("good", n) for n in (1, 2, 3, 7, 8)]


@pytest.mark.parametrize("count", [b"abc", b"1e300", b"9223372036854775807"])
def test_redis_appends_go_on_after_junk_count_or_list(
    redis_pair: tuple[RedisStore, Any], count: bytes
) -> None:
    """A node's count that is not an integer (or would overflow), or its list replaced by a
    string, does not fail every later append of that node: its log starts afresh."""
    store, raw = redis_pair
    store.append_event("a", event("n1", 1))
    raw.hset(rkey(store, "event-counts"), "n1", count)
    store.append_event("a", event("n1", 2))
    raw.delete(rkey(store, "events", "n1"))
    raw.set(rkey(store, "events", "n1"), "not a list")
    store.append_event("a", event("n1", 3))
    store.append_event("a", event("n1", 4))
    assert [e.n for e in store.read_events("a")] == [3, 4]
    assert [e.n for e in store.tail("a").read().events] == [3, 4]


def test_redis_keys_of_another_type_stall_nothing_for_ever(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """Keys replaced by another Redis type: checkpoints, heartbeats and event counts are
    written afresh; a lease or cluster key of another type is a CorruptRecord (the lease
    fences and conflicts), never a WRONGTYPE error on every call."""
    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    for name in ("checkpoints", "blobs", "heartbeats", "event-counts"):
        raw.set(rkey(store, name), "junk")
    assert store.list_checkpoints("a") == []
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 1, b"ours")
    [info] = store.list_checkpoints("a")
    assert store.read_checkpoint("a", info) == b"ours"
    store.put_heartbeat("a", heartbeat("n1"))
    assert [b.node for b in store.list_heartbeats("a")] == ["n1"]
    raw.set(rkey(store, "heartbeats"), "junk")
    store.remove_heartbeat("a", "n1")
    store.append_event("a", event("n1", 1))
    assert [e.n for e in store.read_events("a")] == [1]

    raw.delete(rkey(store, "blobs"))
    raw.set(rkey(store, "blobs"), "junk")
    with pytest.raises(StoreError, match="no longer retained"):
        store.read_checkpoint("a", info)
    raw.rpush(f"{store.prefix}:cluster", "junk")
    with pytest.raises(CorruptRecord, match="Redis list"):
        store.read_cluster()
    raw.delete(rkey(store, "lease"))
    raw.set(rkey(store, "lease"), "junk")
    with pytest.raises(CorruptRecord, match="Redis string"):
        store.read_lease("a")
    with pytest.raises(Fenced):
        store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 2, b"x")
    with pytest.raises(LeaseConflict):
        store.cas_lease("a", held.version, lease("n1", 1))


REDIS_LEASE_DAMAGE: dict[str, Callable[[Any, str], Any]] = {
    "string": lambda raw, key: (raw.delete(key), raw.set(key, "junk")),
    "list": lambda raw, key: (raw.delete(key), raw.rpush(key, "junk")),
    "no-record": lambda raw, key: raw.hdel(key, "record"),
    "no-version": lambda raw, key: raw.hdel(key, "version"),
    "junk-version": lambda raw, key: raw.hset(key, "version", "seven"),
    "huge-version": lambda raw, key: raw.hset(key, "version", "9" * (4 * MAX_RECORD_BYTES)),
    "huge-record": lambda raw, key: raw.hset(key, "record", b"x" * (MAX_RECORD_BYTES + 1)),
}


@pytest.mark.parametrize("damage", list(REDIS_LEASE_DAMAGE))
def test_redis_a_lease_hash_no_compare_and_set_could_match_is_unreadable_and_replaceable(
    redis_pair: tuple[RedisStore, Any], damage: str
) -> None:
    """A lease key of another type, a hash without its record or version, or with a version
    that is no number or huge, or a record over the limit, is an UnreadableLease (a single
    such write would otherwise leave every compare-and-set failing for ever); replacing it
    against what was found writes a lease that renews, and the old fence stays fenced."""
    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    REDIS_LEASE_DAMAGE[damage](raw, rkey(store, "lease"))
    with pytest.raises(UnreadableLease) as caught:
        store.read_lease("a")
    new = replace(lease("n2", 2, session="s2"), version=77)
    written = store.replace_unreadable_lease("a", caught.value.found, new)
    assert store.read_lease("a") == written
    renewed = store.cas_lease("a", written.version, replace(new, renewals=1))
    assert store.read_lease("a") == renewed
    with pytest.raises(Fenced):
        store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 1, b"stale")
    store.put_checkpoint("a", Fence("n2", "s2", 2), 1, b"ours")


def test_redis_hostile_heartbeats_are_skipped(redis_pair: tuple[RedisStore, Any]) -> None:
    """Heartbeats under names that are not ids, oversize, nested or another node's: skipped."""
    store, raw = redis_pair
    store.put_heartbeat("a", heartbeat("good"))
    beats = rkey(store, "heartbeats")
    raw.hset(
        beats,
        mapping={
            b"\xff": heartbeat("x").to_json(),
            "big": b" " * (MAX_RECORD_BYTES + 1),
            "nested": b"[" * 60_000,
            "copy": heartbeat("good").to_json(),
        },
    )
    assert [b.node for b in store.list_heartbeats("a")] == ["good"]
    assert [b.node for b in store.tail("a").read().heartbeats] == ["good"]
    raw.delete(beats)
    raw.set(beats, "not a hash")
    assert store.list_heartbeats("a") == []


# -- Redis: the effect journal ---------------------------------------------------


def kept_answers(store: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every answer of the script store.name from now on (the script still runs)."""
    answers: list[Any] = []
    script = getattr(store, name)

    def run(*args: Any, **kwargs: Any) -> Any:
        answers.append(script(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(store, name, run)
    return answers


def redis_effect_hashes(store: RedisStore, raw: Any) -> set[int]:
    """The steps that have a journal hash in Redis."""
    prefix = rkey(store, "effects", "").encode()
    return {int(key[len(prefix) :]) for key in raw.scan_iter(match=prefix + b"*", count=1000)}


def test_redis_effect_keys_of_another_type_stall_nothing(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """A step's journal or the effect-steps set replaced by another Redis type: read_effects
    leaves it out (no WRONGTYPE error), put_effect writes afresh, a checkpoint goes through."""
    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    raw.set(rkey(store, "effects", "1"), "junk")
    raw.rpush(rkey(store, "effect-steps"), "1")
    assert store.read_effects("a", 1) == {}
    store.put_effect("a", fence, 1, 0, "outcome", b"ours")
    assert store.read_effects("a", 1) == {(0, "outcome"): b"ours"}
    store.put_effect("a", fence, 2, 0, "outcome", b"two")
    raw.delete(rkey(store, "effect-steps"))
    raw.set(rkey(store, "effect-steps"), "junk")
    store.put_checkpoint("a", fence, 1, b"checkpoint")
    assert store.read_effects("a", 1) == {}
    assert store.read_effects("a", 2) == {(0, "outcome"): b"two"}
    assert raw.exists(rkey(store, "effect-steps")) == 0  # the junk set is dropped
    raw.set(rkey(store, "effects", "2"), "junk")
    store.put_checkpoint("a", fence, 2, b"checkpoint")  # its own step's journal: any type
    assert raw.exists(rkey(store, "effects", "2")) == 0


@pytest.mark.parametrize("fence", BAD_FENCES)
def test_redis_malformed_fence_refuses_effect_records(
    redis_pair: tuple[RedisStore, Any], fence: bytes
) -> None:
    """An effect record under a fence field that does not parse is Fenced, and not stored."""
    store, raw = redis_pair
    store.cas_lease("a", None, lease("n1", 1))
    raw.hset(rkey(store, "lease"), "fence", fence)
    with pytest.raises(Fenced, match="the lease is now"):
        store.put_effect("a", Fence("n1", "s1", 1), 1, 0, "intent", b"x")
    assert store.read_effects("a", 1) == {}


def test_redis_planted_journal_fields_cost_a_read_nothing(
    redis_pair: tuple[RedisStore, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Thousands of fields that are not a record's name, a record over MAX_EFFECT_BYTES: the
    script looks up only the names it writes, sends a huge record's length instead of its
    bytes, and the read logs what it left out (once) and returns the rest."""
    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_effect("a", Fence("n1", "s1", held.epoch), 5, 3, "outcome", b"ours")
    journal = rkey(store, "effects", "5")
    junk = {f"junk{i}": b"j" for i in range(5000)}
    junk.update({"03:outcome": b"j", "128:outcome": b"j", "-1:intent": b"j", "1:result": b"j"})
    raw.hset(journal, mapping=junk)
    raw.hset(journal, "4:intent", b"y" * (MAX_EFFECT_BYTES + 1))
    raw.hset(journal, "0:intent", b"")  # an empty record is a record
    answers = kept_answers(store._effects, "_read", monkeypatch)
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.redis"):
        for _ in range(3):
            assert store.read_effects("a", 5) == {(3, "outcome"): b"ours", (0, "intent"): b""}
    [answer] = answers[:1]
    assert answer[0] == len(junk) + 3  # counted, never sent
    assert len(answer) == 1 + 2 * 3
    assert (MAX_EFFECT_BYTES + 1) in answer  # its length, not its bytes
    assert sum(len(item) for item in answer if isinstance(item, bytes)) < 100
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2, said  # each problem once, not on every read
    assert any(f"{MAX_EFFECT_BYTES + 1} bytes" in line for line in said)
    assert any(f"left out {len(junk)} fields" in line for line in said)


def test_redis_planted_steps_are_removed_a_bounded_number_per_checkpoint(
    redis_pair: tuple[RedisStore, Any],
) -> None:
    """A thousand planted steps in effect-steps: each checkpoint removes the journals of at
    most STEPS_REMOVED_PER_CHECKPOINT of them (the lowest) besides its own step's, so it does
    bounded work, and later checkpoints remove the rest. A member's score is not believed:
    one naming a step above the checkpoint keeps its journal; one naming no step is dropped."""
    from hamsterbunker.stores.redis.effects import STEPS_REMOVED_PER_CHECKPOINT as PER

    store, raw = redis_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    steps = rkey(store, "effect-steps")
    planted = range(1, 1001)
    for first in range(1, 1001, 250):
        pipe = raw.pipeline(transaction=False)
        for seq in range(first, first + 250):
            pipe.hset(rkey(store, "effects", str(seq)), "0:outcome", b"old")
        pipe.zadd(steps, {str(seq): seq for seq in range(first, first + 250)})
        pipe.execute()
    raw.zadd(steps, {"abc": 0, "05": 0, "9" * 30: 0, "2500": 0})  # names no step, or a lie
    raw.hset(rkey(store, "effects", "2500"), "0:outcome", b"a step to come")
    store.put_effect("a", fence, 1500, 0, "outcome", b"this step")

    store.put_checkpoint("a", fence, 1500, b"checkpoint")
    left = redis_effect_hashes(store, raw)
    assert 2500 in left and 1500 not in left
    # Bounded: the four members scored 0 and the lowest planted steps, PER in all; the
    # rest wait for the next checkpoints.
    assert 4 < PER <= 64
    assert set(planted) - left == set(range(1, PER - 4 + 1))
    for seq in range(1501, 1501 + len(planted) // PER + 2):
        store.put_checkpoint("a", fence, seq, b"checkpoint")
    assert redis_effect_hashes(store, raw) == {2500}
    assert [(m, int(s)) for m, s in raw.zrange(steps, 0, -1, withscores=True)] == [(b"2500", 2500)]
    assert store.read_effects("a", 2500) == {(0, "outcome"): b"a step to come"}


# -- etcd ------------------------------------------------------------------------


@pytest.fixture
def etcd_pair() -> Iterator[tuple[EtcdStore, Put]]:
    """An EtcdStore on a fresh prefix of the shared server, and put(key under agent "a", value)."""
    from hamsterbunker.stores.etcd import EtcdStore
    from tests.support.etcd_server import etcd_url

    with each_ended(EtcdStore, EtcdStore.close) as opened:
        store = opened(etcd_url(), keep_checkpoints=KEEP, events_per_node=10)
        agent = store._agent_prefix("a").encode()

        def put(rest: str | bytes, value: bytes) -> None:
            key = agent + (rest.encode() if isinstance(rest, str) else rest)
            store._kv.put(key, value)

        yield store, put


def etcd_keys(store: EtcdStore, under: str) -> list[bytes]:
    prefix = store._agent_prefix("a") + under
    found = store._kv.get_prefix(prefix)
    return [meta["key"][len(prefix) :] for _value, meta in found]


def pad(seq: int, epoch: int | None = None) -> str:
    return f"{seq:020d}" if epoch is None else f"{seq:020d}-{epoch:010d}"


def etcd_junk_checkpoints(put: Put) -> int:
    """Plant junk checkpoint keys; return how many description entries the listing leaves out."""
    bad_names = [
        "checkpoint-info/zzz",
        f"checkpoint-info/{pad(0)}",
        f"checkpoint-info/{'9' * 20}",
        "checkpoint-info/42",
        b"checkpoint-info/\xff",
        f"checkpoint-info/{pad(60)}/deeper",
    ]
    for name in bad_names:
        put(name, description(1, seq=60))
    bad_values = {
        50: b"{not json",
        51: b"[" * 60_000,
        52: b'{"epoch": Infinity, "seq": 52, "size": 1, "written": 1}',
        53: description(1, seq=54),  # names another seq
        54: description(1, seq=54, size=10**30),
        55: description(10_000_000_000, seq=55),
        56: b" " * (MAX_RECORD_BYTES + 1),
        57: description(True, seq=57),
    }
    for seq, value in bad_values.items():
        put(f"checkpoint-info/{pad(seq)}", value)
    # Bytes under names that do not parse, and under another epoch above.
    for name in ("checkpoints/zzz", f"checkpoints/{pad(70)}", f"checkpoints/{pad(71, 1)}x"):
        put(name, b"junk")
    put(f"checkpoints/{pad(99, 9)}", b"junk")
    put(f"checkpoint-info/{pad(99)}", description(9, seq=99))
    return len(bad_names) + len(bad_values)


def test_etcd_junk_checkpoint_keys_never_break_or_block_a_publish(
    etcd_pair: tuple[EtcdStore, Put],
) -> None:
    """checkpoint-info/zzz and the like: no ValueError on publish, left out of the listing,
    and nothing above the new seq is removed by retention."""
    store, put = etcd_pair
    etcd_junk_checkpoints(put)
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    for seq in range(1, KEEP + 3):
        store.put_checkpoint("a", fence, seq, b"ours %d" % seq)
    kept = [(seq, 1) for seq in range(KEEP + 2, 2, -1)]
    assert listed(store) == [(99, 9), *kept]
    infos = store.list_checkpoints("a")
    assert store.read_checkpoint("a", infos[1]) == b"ours %d" % (KEEP + 2)
    names = etcd_keys(store, "checkpoints/")
    assert pad(99, 9).encode() in names and f"{pad(71, 1)}x".encode() in names
    assert b"zzz" in names  # sorts above every number: never in a retention range


def test_etcd_damaged_entries_are_logged_once(
    etcd_pair: tuple[EtcdStore, Put],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each damaged description is warned about once, not on every listing."""
    store, put = etcd_pair
    damaged = etcd_junk_checkpoints(put)
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.etcd"):
        for _ in range(3):
            assert listed(store) == [(99, 9)]
        assert len(caplog.records) == damaged
        put(f"checkpoint-info/{pad(50)}", b"{still not json")
        listed(store)
        assert len(caplog.records) == damaged + 1


def test_etcd_own_epoch_checkpoint_above_still_refuses(
    etcd_pair: tuple[EtcdStore, Put],
) -> None:
    """A checkpoint key of the fence's own epoch above seq refuses the write (StoreError)."""
    store, put = etcd_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    put(f"checkpoints/{pad(40, 1)}", b"x")
    with pytest.raises(StoreError, match="must increase") as caught:
        store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 3, b"x")
    assert not isinstance(caught.value, Fenced)


def test_etcd_another_epochs_bytes_under_the_same_seq_are_replaced(
    etcd_pair: tuple[EtcdStore, Put],
) -> None:
    """Publishing seq 5 under epoch 2 over epoch 1's seq 5 leaves no orphaned bytes of epoch 1."""
    store, _put = etcd_pair
    old = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", Fence("n1", "s1", 1), 5, b"old")
    store.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    store.put_checkpoint("a", Fence("n2", "s2", 2), 5, b"new")
    assert etcd_keys(store, "checkpoints/") == [pad(5, 2).encode()]
    assert listed(store) == [(5, 2)]


@pytest.mark.parametrize("fence", BAD_FENCES)
def test_etcd_malformed_fence_is_fenced_not_a_crash(
    etcd_pair: tuple[EtcdStore, Put], fence: bytes
) -> None:
    """A fence key that does not parse refuses the write as Fenced."""
    store, put = etcd_pair
    store.cas_lease("a", None, lease("n1", 1))
    put("fence", fence)
    with pytest.raises(Fenced, match="the lease is now"):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"x")


@pytest.mark.parametrize("record", BAD_LEASES, ids=LEASE_IDS)
def test_etcd_unbelievable_lease_record_is_corrupt(
    etcd_pair: tuple[EtcdStore, Put], record: bytes
) -> None:
    """A lease record with an absurd TTL or epoch, deep nesting or of any size: CorruptRecord."""
    store, put = etcd_pair
    put("lease", record)
    with pytest.raises(CorruptRecord):
        store.read_lease("a")


def test_etcd_oversize_checkpoint_and_acceptance_are_corrupt(
    etcd_pair: tuple[EtcdStore, Put],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stored blob over MAX_CHECKPOINT_BYTES (lowered here) or an acceptance over
    MAX_RECORD_BYTES is a CorruptRecord naming its size."""
    from hamsterbunker.stores.etcd import store as etcd_module

    store, put = etcd_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 1, b"small")
    monkeypatch.setattr(etcd_module, "MAX_CHECKPOINT_BYTES", 1000)
    put(f"checkpoints/{pad(1, 1)}", b"y" * 1001)
    [info] = store.list_checkpoints("a")
    with pytest.raises(CorruptRecord, match="1001 bytes"):
        store.read_checkpoint("a", info)
    with pytest.raises(CorruptRecord, match="1001 bytes"):
        store.read_for_restore("a")
    put(f"checkpoints/{pad(1, 1)}", b"small")
    put("acceptance", b"z" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(CorruptRecord, match=f"{MAX_RECORD_BYTES + 1} bytes"):
        store.read_acceptance("a")
    # A restore's one read says so of the acceptance alone, and reads the rest.
    read = store.read_for_restore("a")
    assert (read.newest, read.acceptance) == (b"small", None)
    assert f"{MAX_RECORD_BYTES + 1} bytes" in read.acceptance_problem


def test_etcd_hostile_heartbeat_and_event_keys_are_skipped(
    etcd_pair: tuple[EtcdStore, Put],
) -> None:
    """Keys that are not UTF-8 or not node ids, and records that do not parse: skipped."""
    store, put = etcd_pair
    store.put_heartbeat("a", heartbeat("good"))
    put(b"heartbeats/\xff", heartbeat("x").to_json())
    put("heartbeats/nested", b"[" * 60_000)
    put("heartbeats/copy", heartbeat("good").to_json())
    assert [b.node for b in store.list_heartbeats("a")] == ["good"]
    store.append_event("a", event("good", 1))
    put(b"event-nodes/\xff", b"")
    put("event-nodes/../lease", b"")
    put(f"events/good/{pad(2)}", b"{nope")
    put(f"events/good/{pad(3)}", event("other", 3).to_json())
    store.append_event("a", event("good", 4))
    assert [(e.node, e.n) for e in store.read_events("a")] == [("good", 1), ("good", 4)]


# -- MemoryStore (the contract's reference) ----------------------------------------


# -- etcd: the effect journal ----------------------------------------------------


def put_many(store: EtcdStore, items: dict[str, bytes]) -> None:
    """Put many keys under agent "a", a txn of at most TXN_OPS puts at a time."""
    from hamsterbunker.stores.etcd.kv import TXN_OPS, put_op

    agent = store._agent_prefix("a")
    ops = [put_op(agent + name, value) for name, value in items.items()]
    for first in range(0, len(ops), TXN_OPS):
        store._connection.txn([], ops[first : first + TXN_OPS])


def kept_txns(store: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every txn response of store from now on (the txn still runs)."""
    responses: list[dict[str, Any]] = []
    txn = store._connection.txn

    def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        responses.append(txn(*args, **kwargs))
        return responses[-1]

    monkeypatch.setattr(store._connection, "txn", run)
    return responses


@pytest.mark.parametrize("fence", BAD_FENCES)
def test_etcd_malformed_fence_refuses_effect_records(
    etcd_pair: tuple[EtcdStore, Put], fence: bytes
) -> None:
    """An effect record under a fence key that does not parse is Fenced, and not stored."""
    store, put = etcd_pair
    store.cas_lease("a", None, lease("n1", 1))
    put("fence", fence)
    with pytest.raises(Fenced, match="the lease is now"):
        store.put_effect("a", Fence("n1", "s1", 1), 1, 0, "intent", b"x")
    assert etcd_keys(store, "effects/") == []


def test_etcd_planted_journal_keys_are_read_within_bounds(
    etcd_pair: tuple[EtcdStore, Put],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thousand planted keys in a step's journal: the read lists keys only, no more than
    2 * MAX_EFFECTS_PER_STEP of them; junk filled the listing, so it fetches the values
    under every name a record can have (one crowded out of the listing is read too), never
    a junk name's (a huge junk value is never sent), logs each junk name listed once, and
    how many keys it left unread."""
    store, put = etcd_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    store.put_effect("a", fence, 5, 0, "intent", b"i0")
    store.put_effect("a", fence, 5, 0, "outcome", b"o0")
    store.put_effect("a", fence, 5, 9, "outcome", b"crowded out")
    step = f"effects/{pad(5)}/"
    put_many(store, {f"{step}0001/junk{i:04d}": b"j" for i in range(1000)})
    huge = b"h" * (MAX_EFFECT_BYTES + 1000)
    put(f"{step}0000/intentX", huge)  # listed (a junk name), never fetched
    put(f"{step}0000/outcome/deeper", huge)
    put(f"{step}-001/intent", b"j")  # outside the listed names: never seen
    put(f"{step}{MAX_EFFECTS_PER_STEP:04d}/intent", b"j")
    responses = kept_txns(store, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.stores.etcd"):
        for _ in range(2):
            assert store.read_effects("a", 5) == {
                (0, "intent"): b"i0",
                (0, "outcome"): b"o0",
                (9, "outcome"): b"crowded out",
            }
    listing, *values = responses[: len(responses) // 2]
    listed, counted = listing["responses"]
    assert "kvs" not in counted["response_range"]  # the rest only counted
    assert len(listed["response_range"]["kvs"]) == 2 * MAX_EFFECTS_PER_STEP
    assert all("value" not in kv for kv in listed["response_range"]["kvs"])
    # Every name a record can have, nothing else fetched.
    assert sum(len(txn["responses"]) for txn in values) == 2 * MAX_EFFECTS_PER_STEP
    assert len(json.dumps(responses)) < 200_000
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2 * MAX_EFFECTS_PER_STEP - 2 + 1  # each junk name once, and the rest
    assert any("left out 751 keys unread" in line for line in said)


def test_etcd_checkpoint_removes_any_number_of_planted_journal_keys_in_its_txn(
    etcd_pair: tuple[EtcdStore, Put], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of keys under effects/ at or below the checkpoint's seq, junk names among
    them: one delete-range in the checkpoint's txn removes them all (no read of them, no
    txn per key), and the journal of a step above stays."""
    store, put = etcd_pair
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    store.put_effect("a", fence, 41, 0, "outcome", b"a step to come")
    old = {f"effects/{pad(seq)}/{i:04d}/outcome": b"old" for seq in range(1, 41) for i in range(50)}
    put_many(store, old)
    for name in ("effects/!", f"effects/{pad(7)}", f"effects/{pad(40)}/junk", "effects/000"):
        put(name, b"junk")
    responses = kept_txns(store, monkeypatch)
    store.put_checkpoint("a", fence, 40, b"checkpoint")
    assert len(responses) == 2  # the names read (checkpoints only), then the fenced txn
    assert etcd_keys(store, "effects/") == [f"{pad(41)}/0000/outcome".encode()]
    assert store.read_effects("a", 41) == {(0, "outcome"): b"a step to come"}


def test_memory_store_skips_planted_junk_like_the_real_backends() -> None:
    """Out-of-range checkpoints, damaged heartbeats and events planted in a MemoryStore are
    left out, as the network backends leave them out; other epochs never block a publish."""
    store = MemoryStore(keep_checkpoints=KEEP)
    held = store.cas_lease("a", None, lease("n1", 1))
    raw, keys = RawRecords(store), AgentKeys("a")

    def plant_info(info: CheckpointInfo) -> None:
        raw.put(keys.checkpoint(info), b"sealed bytes, say")

    plant_info(CheckpointInfo(epoch=9, seq=99, size=4, written=0.0))
    plant_info(CheckpointInfo(epoch=1, seq=98, size=-1, written=0.0))
    plant_info(CheckpointInfo(epoch=2, seq=97, size=MAX_CHECKPOINT_BYTES + 1, written=0.0))
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 1, b"ours")
    assert listed(store) == [(99, 9), (1, 1)]
    raw.put_heartbeat("a", "bad", b"[" * 60_000)
    raw.put_heartbeat("a", "copy", heartbeat("good").to_json())
    store.put_heartbeat("a", heartbeat("good"))
    assert [b.node for b in store.list_heartbeats("a")] == ["good"]
    raw.put(keys.event("n1", 5), b"{nope")
    store.append_event("a", event("n1", 1))  # appended after the junk
    store.append_event("a", event("n1", 2))
    assert [e.n for e in store.read_events("a")] == [1, 2]
