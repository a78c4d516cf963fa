"""The reader of the earlier Redis store's layout (``stores.earlier.redis``): over a store that
store wrote (tests/data/earlier/redis.json.gz) it answers as that store did; planted junk
is skipped or refused in one line, every read within its bounds; and hb migrate-store
copies through it a store a node goes on from."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from hamsterbunker.core.errors import ConfigError, CorruptRecord, StoreError, UnreadableLease
from hamsterbunker.core.limits import MAX_CHECKPOINTS_LISTED, MAX_RECORD_BYTES, MAX_SUBMISSION_BYTES
from hamsterbunker.core.read_bounds import INBOX_READ, ReadBound
from hamsterbunker.records import CheckpointInfo, Heartbeat, LeaseRecord
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Fence
from hamsterbunker.stores.base import MAX_LISTED_AGENTS, Consumed
from hamsterbunker.stores.earlier import SourceStore
from hamsterbunker.stores.earlier import redis as earlier_redis
from hamsterbunker.stores.earlier.redis import EarlierRedis, open_earlier_redis
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.migrate import Migrated, migrate
from tests.support.agents import SECRET
from tests.support.earlier_redis import Loaded, expected, load_earlier_redis, unb64
from tests.support.records import fence_of, lease, network_heartbeat
from tests.support.redis_server import redis_url

AGENTS = ("a1", "a2")


@pytest.fixture
def loaded() -> Iterator[Loaded]:
    fixture = load_earlier_redis()
    yield fixture
    fixture.close()


@pytest.fixture
def reader(loaded: Loaded) -> Iterator[EarlierRedis]:
    opened = open_earlier_redis(loaded.url)
    yield opened
    opened.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _raw(loaded: Loaded) -> dict[bytes, Any]:
    """Every key under the prefix with its contents (as a hash or sorted set holds them:
    their encoding's order may change on any read)."""
    client, found = loaded.client, {}
    for key in client.scan_iter(match=f"{loaded.prefix}:*"):
        kind = client.type(key)
        if kind == b"hash":
            found[key] = client.hgetall(key)
        elif kind == b"zset":
            found[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            found[key] = client.get(key)  # the fixture holds no list or set
    return found


# -- (a) the fixture, read as the earlier store read it ----------------------------


def test_each_read_answers_as_the_earlier_store_did(loaded: Loaded, reader: EarlierRedis) -> None:
    """Every read of SourceStore, per agent, equals what the earlier store answered, and
    reading changed nothing."""
    want = expected()
    before = _raw(loaded)
    cluster = reader.read_cluster()
    assert cluster is not None and cluster.to_json().decode() == want["cluster"]
    assert reader.list_agents() == sorted(want["agents"]) == list(AGENTS)
    for agent, was in want["agents"].items():
        held = reader.read_lease(agent)
        assert held is not None and held.to_json().decode() == was["lease"]
        assert [b.to_json().decode() for b in reader.list_heartbeats(agent)] == was["heartbeats"]
        listed = reader.list_checkpoints(agent)
        assert [info.to_json().decode() for info in listed] == was["checkpoints"]
        digests = {str(i.seq): _sha(reader.read_checkpoint(agent, i)) for i in listed}
        assert digests == was["checkpoint_sha256"]
        effects = reader.read_effects(agent, was["effects_step"])
        assert effects == {(i, kind): unb64(data) for i, kind, data in was["effects"]}
        assert reader.read_acceptance(agent) == unb64(was["acceptance"])
        for page in was["inbox_pages"]:
            entries = [(n, unb64(blob)) for n, blob in page["entries"]]
            assert reader.read_inbox(agent, page["after"]) == entries
        assert reader.read_inbox(agent, was["inbox_pages"][-1]["entries"][-1][0]) == []
        assert sorted(reader.request_ids(agent, 100)) == was["request_ids"]
        for request_id, state in was["admissions"].items():
            got = reader.read_admission(agent, request_id)
            shown = None if got is None else [got.number, got.consumed, got.reply]
            assert shown == (None if state is None else [*state[:2], unb64(state[2])])
    assert _raw(loaded) == before


def test_the_fixture_holds_what_the_tests_rely_on() -> None:
    """A pruned reply, a junk submission, a checkpoint above 1 MiB: what it was written for."""
    agents = expected()["agents"]
    assert agents["a1"]["admissions"]["r1"] is None  # pruned (3 replies kept)
    assert [n for n, _ in agents["a1"]["inbox_pages"][0]["entries"]] == [5, 6, 7]
    sizes = [json.loads(info)["size"] for info in agents["a2"]["checkpoints"]]
    assert max(sizes) > 2**20


# -- (b) hostile contents ------------------------------------------------------------


def test_open_refuses_what_is_no_earlier_store(loaded: Loaded) -> None:
    """No store under the prefix, this version's layout, a bad URL, no server: one line."""
    with pytest.raises(ConfigError, match="holds no store an earlier version wrote"):
        open_earlier_redis(redis_url())
    url = redis_url()
    loaded.client.zadd("{" + url.split("prefix=")[1] + "}:index", {b"x": 0})
    with pytest.raises(ConfigError, match="this version's layout"):
        open_earlier_redis(url)
    with pytest.raises(ConfigError, match="database number"):
        open_earlier_redis("redis://127.0.0.1:1/zero")
    with pytest.raises(StoreError, match=r"127\.0\.0\.1:1"):
        open_earlier_redis("redis://127.0.0.1:1/0?socket_connect_timeout=1")


@pytest.mark.parametrize(
    ("field", "doc"),
    [
        (b"abc", b'{"epoch":3,"size":1,"written":1.0}'),  # a name that is no seq
        (b"007", b'{"epoch":3,"size":1,"written":1.0}'),  # a leading zero
        (b"9", b"not json"),
        (b"9", b'{"epoch":3,"seq":8,"size":1,"written":1.0}'),  # names another seq
        (b"9", b" " * (MAX_RECORD_BYTES + 1)),  # oversize: left out unread
    ],
)
def test_a_junk_checkpoint_entry_is_left_out(
    loaded: Loaded, reader: EarlierRedis, field: bytes, doc: bytes
) -> None:
    """A checkpoint entry of a name or description not as the store wrote it is left out
    of the listing, the genuine ones kept."""
    loaded.client.hset(loaded.key("agent", "a1", "checkpoints"), field, doc)
    loaded.client.hset(loaded.key("agent", "a1", "blobs"), field, b"sealed")
    listed = [info.to_json().decode() for info in reader.list_checkpoints("a1")]
    assert listed == expected()["agents"]["a1"]["checkpoints"]


def test_keys_of_another_type_read_as_the_earlier_store_read_them(
    loaded: Loaded, reader: EarlierRedis
) -> None:
    """A key of another type reads as empty where the earlier store read it so, and is
    refused in one line where it refused it."""
    for name in ("checkpoints", "inbox:numbers", "inbox:ids", "effects:5", "heartbeats"):
        loaded.plant(f"agent:a1:{name}", "string", b"planted")
    assert reader.list_checkpoints("a1") == []
    assert reader.read_inbox("a1") == []
    assert reader.request_ids("a1", 100) == []
    assert reader.read_admission("a1", "r3") is None
    assert reader.read_effects("a1", 5) == {}
    assert reader.list_heartbeats("a1") == []
    loaded.plant("agent:a1:lease", "list", [b"x"])
    with pytest.raises(UnreadableLease, match="stored as a Redis list"):
        reader.read_lease("a1")
    loaded.plant("agent:a1:acceptance", "hash", {b"x": b"y"})
    with pytest.raises(CorruptRecord, match="loss-acceptance record of 'a1' is stored as"):
        reader.read_acceptance("a1")
    info = CheckpointInfo.from_json(expected()["agents"]["a1"]["checkpoints"][0].encode(), 4)
    with pytest.raises(StoreError, match="no longer retained"):
        reader.read_checkpoint("a1", info)


def test_oversize_and_junk_records_are_refused_in_one_line(
    loaded: Loaded, reader: EarlierRedis
) -> None:
    """An oversize cluster, acceptance or lease record, or a lease version not as written,
    is a CorruptRecord, unread."""
    loaded.plant("cluster", "string", b"{" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(CorruptRecord, match=f"cluster record is {MAX_RECORD_BYTES + 1} bytes"):
        reader.read_cluster()
    loaded.plant("agent:a1:acceptance", "string", b"x" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(CorruptRecord, match="above the limit"):
        reader.read_acceptance("a1")
    lease_key = loaded.key("agent", "a1", "lease")
    loaded.client.hset(lease_key, "record", b"x" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(UnreadableLease, match="above the limit") as too_big:
        reader.read_lease("a1")
    assert f"size:{MAX_RECORD_BYTES + 1}" in too_big.value.found
    long_version = {"record": lease("n1", 3).to_json(), "version": "1" * 100}
    loaded.client.hset(lease_key, mapping=long_version)
    with pytest.raises(UnreadableLease, match="version field is 100 bytes, above the limit"):
        reader.read_lease("a1")
    loaded.client.hset(lease_key, mapping={"record": lease("n1", 3).to_json(), "version": "01"})
    with pytest.raises(UnreadableLease, match="not a version"):
        reader.read_lease("a1")
    loaded.client.hset(lease_key, "record", b"not json")
    with pytest.raises(UnreadableLease):
        reader.read_lease("a1")


def test_a_checkpoint_over_the_limit_is_refused_unread(
    loaded: Loaded, reader: EarlierRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the limit at 1 MiB, a2's checkpoint of 1.1 MB is a CorruptRecord, not bytes."""
    monkeypatch.setattr(earlier_redis, "MAX_CHECKPOINT_BYTES", 2**20)
    newest = reader.list_checkpoints("a2")[0]
    with pytest.raises(CorruptRecord, match=f"checkpoint 5 of 'a2' is {newest.size} bytes"):
        reader.read_checkpoint("a2", newest)


def test_a_value_that_changes_while_it_is_read_is_not_fetched(
    loaded: Loaded, reader: EarlierRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob made huge between its measure and its fetch aborts the read (WATCH)."""
    blobs = loaded.key("agent", "a1", "blobs")
    client = reader._redis
    real = client.pipeline

    def pipeline(transaction: bool = True) -> Any:
        pipe = real(transaction=transaction)
        if not transaction:  # the measuring one: the value grows right after it
            measured = pipe.execute

            def execute() -> Any:
                sizes = measured()
                loaded.client.hset(blobs, "4", b"x" * (2**20))
                return sizes

            pipe.execute = execute
        return pipe

    monkeypatch.setattr(client, "pipeline", pipeline)
    info = reader.list_checkpoints("a1")[0]
    with pytest.raises(StoreError, match="changed while it was read"):
        reader.read_checkpoint("a1", info)


def test_junk_in_the_inbox_is_left_out(loaded: Loaded, reader: EarlierRedis) -> None:
    """Numbers not of the store's shape or score, and a submission over its limit, are left out."""
    numbers, pending = (
        loaded.key("agent", "a1", "inbox:numbers"),
        loaded.key("agent", "a1", "inbox:pending"),
    )
    loaded.client.zadd(numbers, {b"abc": 8, b"9": 10, b"11": 11, b"12": 12})
    loaded.client.hset(pending, mapping={b"9": b"s9", b"11": b"x" * (MAX_SUBMISSION_BYTES + 1)})
    loaded.client.hset(pending, b"12", b"s12")
    assert [n for n, _ in reader.read_inbox("a1")] == [5, 6, 7, 12]


def test_a_planted_inbox_is_read_within_its_bounds(
    loaded: Loaded, reader: EarlierRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 planted entries: one read takes INBOX_READ.count; a byte bound stops a read
    early and the next goes on from the last number read."""
    numbers, pending = (
        loaded.key("agent", "a1", "inbox:numbers"),
        loaded.key("agent", "a1", "inbox:pending"),
    )
    planted = range(8, 3008)
    loaded.client.zadd(numbers, {str(n): n for n in planted})
    loaded.client.hset(pending, mapping={str(n): b"s" * 10 for n in planted})
    read = reader.read_inbox("a1")
    assert len(read) == INBOX_READ.count
    assert [n for n, _ in read[:4]] == [5, 6, 7, 8]
    first = reader.read_inbox("a1", 100)
    small = ReadBound(INBOX_READ.count, INBOX_READ.entry_bytes, 55)
    monkeypatch.setattr(earlier_redis, "INBOX_READ", small)
    assert reader.read_inbox("a1", 100) == first[:5]
    assert reader.read_inbox("a1", 105) == first[5:10]


def test_a_planted_listing_is_refused_or_cut_at_its_bound(
    loaded: Loaded, reader: EarlierRedis
) -> None:
    """More checkpoint entries or heartbeats than a read looks at: CorruptRecord, values
    unread; more agents than listed: cut at MAX_LISTED_AGENTS."""
    checkpoints = loaded.key("agent", "a1", "checkpoints")
    loaded.client.hset(checkpoints, mapping={f"j{n}": b"" for n in range(MAX_CHECKPOINTS_LISTED)})
    with pytest.raises(CorruptRecord, match=f"holds {MAX_CHECKPOINTS_LISTED + 4} entries"):
        reader.list_checkpoints("a1")
    beats = loaded.key("agent", "a2", "heartbeats")
    loaded.client.hset(beats, mapping={f"n{n}": b"" for n in range(5000)})  # n1 was there
    with pytest.raises(CorruptRecord, match="heartbeats of 'a2' holds 5000 entries"):
        reader.list_heartbeats("a2")
    pipe = loaded.client.pipeline(transaction=False)
    for n in range(MAX_LISTED_AGENTS + 200):
        pipe.set(loaded.key("agent", f"b{n:05}", "acceptance"), b"")
    pipe.execute()
    listed = reader.list_agents()
    assert len(listed) == MAX_LISTED_AGENTS and listed == sorted(listed)


def test_junk_names_and_records_are_skipped(loaded: Loaded, reader: EarlierRedis) -> None:
    """Agent names, request ids and effect fields not of the earlier store's shape are passed
    over; a heartbeat that does not parse, or is another node's, is skipped."""
    for name in ("bad name!", "x" * 65, "-dash"):
        loaded.client.set(loaded.key("agent", name, "acceptance"), b"")
    assert reader.list_agents() == list(AGENTS)
    loaded.client.hset(loaded.key("agent", "a1", "inbox:ids"), mapping={"bad id!": 3, "-x": 4})
    assert sorted(reader.request_ids("a1", 100)) == expected()["agents"]["a1"]["request_ids"]
    effects = loaded.key("agent", "a1", "effects:5")
    loaded.client.hset(effects, mapping={"999:intent": b"x", "0:other": b"x", "junk": b"x"})
    loaded.client.hset(effects, "1:outcome", b"x" * (512 * 1024 + 1))  # over MAX_EFFECT_BYTES
    assert list(reader.read_effects("a1", 5)) == [(0, "intent")]
    beats = loaded.key("agent", "a1", "heartbeats")
    loaded.client.hset(beats, mapping={"n2": b"{", "n3": network_heartbeat("n4").to_json()})
    assert [beat.node for beat in reader.list_heartbeats("a1")] == ["n1"]


def test_a_damaged_admission_reads_as_the_earlier_store_read_it(
    loaded: Loaded, reader: EarlierRedis
) -> None:
    """An id naming no number is unknown; one consumed under another id, or with a reply
    over its limit, gives no reply."""
    ids = loaded.key("agent", "a1", "inbox:ids")
    loaded.client.hset(ids, mapping={"r5": "junk", "r6": "3"})  # r6 -> a number r3 consumed
    assert reader.read_admission("a1", "r5") is None
    state = reader.read_admission("a1", "r6")
    assert state is not None and (state.number, state.consumed, state.reply) == (3, True, None)
    loaded.client.hset(loaded.key("agent", "a1", "inbox:replies"), "4", b"x" * (2**18 + 1))
    state = reader.read_admission("a1", "r4")
    assert state is not None and (state.number, state.consumed, state.reply) == (4, True, None)


# -- (c), (d) hb migrate-store through the reader ------------------------------------


def _target() -> RecordStore:
    from hamsterbunker.stores.backends.redis import RedisBackend

    return RecordStore(RedisBackend(redis_url()))


def _migrate(source: SourceStore, target: RecordStore, pause: Any = None) -> Migrated:
    cluster = source.read_cluster()
    assert cluster is not None
    return migrate(
        source,
        target,
        Sealer(SECRET, cluster),
        say=lambda _line: None,
        pause=pause or (lambda _s: None),
    )


def test_the_copy_holds_what_the_earlier_store_held(reader: EarlierRedis) -> None:
    """What the target reads back is what the earlier store answered (but the junk
    submission), and a node goes on from it: the next epoch, the newest checkpoint's seq."""
    target = _target()
    migrated = _migrate(reader, target)
    want = expected()
    cluster = target.read_cluster()
    assert cluster is not None and cluster.to_json().decode() == want["cluster"]
    assert sorted(target.list_agents()) == list(AGENTS)
    for agent, was in want["agents"].items():
        held, had = target.read_lease(agent), LeaseRecord.from_json(was["lease"].encode())
        assert held is not None
        assert (held.holder, held.session, held.epoch, held.proof) == (
            had.holder, had.session, had.epoch, had.proof,
        )  # fmt: skip
        listed = target.list_checkpoints(agent)
        wanted = [
            CheckpointInfo.from_json(i.encode(), json.loads(i)["seq"]) for i in was["checkpoints"]
        ]
        assert sorted((i.seq, i.epoch, i.size) for i in listed) == sorted(
            (i.seq, i.epoch, i.size) for i in wanted
        )
        for info in listed:
            assert (
                _sha(target.read_checkpoint(agent, info)) == was["checkpoint_sha256"][str(info.seq)]
            )
        effects = target.read_effects(agent, was["effects_step"])
        assert effects == {(i, kind): unb64(data) for i, kind, data in was["effects"]}
        assert target.read_acceptance(agent) == unb64(was["acceptance"])
        pending = [(n, unb64(b)) for page in was["inbox_pages"] for n, b in page["entries"]]
        assert target.read_inbox(agent) == [(n, b) for n, b in pending if n != 7 or agent != "a1"]
        for request_id, state in was["admissions"].items():
            got = target.read_admission(agent, request_id)
            shown = None if got is None else [got.number, got.consumed, got.reply]
            if (agent, request_id) == ("a1", "r7"):
                assert shown is None  # the junk submission was left out
            else:
                assert shown == (None if state is None else [*state[:2], unb64(state[2])])
        assert target.list_heartbeats(agent) == []
    assert migrated.left_out == [line for line in migrated.left_out if "a1" in line]

    sealer = Sealer(SECRET, cluster)
    for agent, seq in (("a1", 5), ("a2", 6)):
        held = target.read_lease(agent)
        assert held is not None and held.epoch == 3
        fence = fence_of(target.cas_lease(agent, held.version, lease("n2", 4, session="s4")))
        with pytest.raises(StoreError):  # the earlier term stays fenced out
            target.put_checkpoint(agent, Fence("n1", "s3", 3), seq, b"zombie")
        reply = sealer.seal_reply(agent, 5, "r5", {"done": 5})
        target.put_checkpoint(agent, fence, seq, b"next", consumed=[Consumed(5, "r5", reply)])
        assert target.list_checkpoints(agent)[0].seq == seq
        assert [n for n, _ in target.read_inbox(agent)] == [6]
    target.close()


def test_the_junk_submission_is_left_out_and_said(reader: EarlierRedis) -> None:
    """The fixture's submission that does not open is not copied, and the migration says so."""
    target = _target()
    migrated = _migrate(reader, target)
    assert [line for line in migrated.left_out if line.startswith("agent a1: submission #7")]
    assert [n for n, _ in target.read_inbox("a1")] == [5, 6]
    target.close()


def test_a_source_that_changes_refuses_the_migration(loaded: Loaded, reader: EarlierRedis) -> None:
    """A heartbeat beating while the source is watched: refused, no cluster in the target."""
    target = _target()
    beat = Heartbeat.from_json(expected()["agents"]["a1"]["heartbeats"][0].encode())

    def beating(_s: float) -> None:
        newer = replace(beat, beats=beat.beats + 1)
        loaded.client.hset(loaded.key("agent", "a1", "heartbeats"), "n1", newer.to_json())

    with pytest.raises(StoreError, match="stop every node first"):
        _migrate(reader, target, pause=beating)
    assert target.read_cluster() is None
    target.close()
