"""The reader of the earlier etcd store's layout (``stores.earlier.etcd``): over keys that store
wrote (``tests/data/earlier/etcd.json.gz``) it answers every read as that store answered it,
junk planted raw is refused or skipped as that store did, listings stay bounded, and
``migrate`` copies through it into this version's layout, leaving out what does not open.

Needs nothing of the earlier store's code: the fixture holds its keys and its answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hamsterbunker.core.errors import ConfigError, CorruptRecord, StoreError, UnreadableLease
from hamsterbunker.core.limits import (
    MAX_EFFECT_BYTES,
    MAX_INBOX_COUNT,
    MAX_RECORD_BYTES,
    MAX_SUBMISSION_BYTES,
)
from hamsterbunker.records import CheckpointInfo, Heartbeat
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores.backends.etcd import EtcdBackend
from hamsterbunker.stores.backends.etcd_connection import EtcdConnection
from hamsterbunker.stores.earlier.etcd import EarlierEtcdStore, open_earlier_etcd
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.migrate import Migrated, migrate
from tests.support.agents import SECRET
from tests.support.earlier_etcd import (
    ASKED,
    answers_of,
    expected,
    load_earlier_etcd,
    plant,
    planted_many,
    raw_revision,
    request_ids_of,
    unplant,
)
from tests.support.etcd_server import etcd_url
from tests.support.records import fence_of, lease

PENDING = "agents/a1/inbox/pending/"


@pytest.fixture
def url() -> str:
    """A fresh prefix holding what the earlier etcd store wrote."""
    return load_earlier_etcd()


@pytest.fixture
def reader(url: str) -> Iterator[EarlierEtcdStore]:
    opened = open_earlier_etcd(url)
    yield opened
    opened.close()


@pytest.fixture
def target() -> Iterator[RecordStore]:
    """An empty store of this version's layout on another prefix."""
    store = RecordStore(EtcdBackend(etcd_url()))
    yield store
    store.close()


def _agent(reader: EarlierEtcdStore, agent: str = "a1") -> dict[str, Any]:
    answers: dict[str, Any] = answers_of(reader)["agents"][agent]
    return answers


def _recorded(agent: str = "a1") -> dict[str, Any]:
    answers: dict[str, Any] = expected()["answers"]["agents"][agent]
    return answers


# -- (a) every read as the earlier store answered it ---------------------------


def test_every_read_answers_as_the_earlier_store_did(url: str, reader: EarlierEtcdStore) -> None:
    """Cluster, agents, leases, heartbeats, checkpoints (one above 1 MiB) and their bytes, the
    effect journal, acceptance, inbox pages, admissions and request ids: as recorded."""
    recorded = expected()
    assert answers_of(reader) == recorded["answers"]
    assert request_ids_of(reader) == recorded["request_ids"]
    for agent, ids in recorded["request_ids"].items():
        assert set(ids) <= set(ASKED), "every request id listed has its admission recorded"
        assert reader.request_ids(agent, 2) == ids[:2]
    big = recorded["answers"]["agents"]["a2"]["checkpoints"][0]
    assert big["size"] > 1 << 20  # read whole, and the same bytes (its digest)


def test_a_lease_version_is_its_keys_mod_revision(url: str, reader: EarlierEtcdStore) -> None:
    """As the earlier store gave it, so a node's compare-and-set compares that revision."""
    for agent in ("a1", "a2"):
        held = reader.read_lease(agent)
        assert held is not None and held.version == raw_revision(url, f"agents/{agent}/lease")


def test_what_is_absent_reads_as_absent(reader: EarlierEtcdStore) -> None:
    """An unknown agent has no lease, checkpoints, journal, acceptance, inbox or ids."""
    assert reader.read_lease("a9") is None
    assert reader.list_heartbeats("a9") == [] and reader.list_checkpoints("a9") == []
    assert reader.read_effects("a9", 1) == {} and reader.read_acceptance("a9") is None
    assert reader.read_inbox("a9") == [] and reader.request_ids("a9", 10) == []
    assert reader.read_admission("a9", "r1") is None
    assert reader.read_inbox("a1", 2**53 - 1) == [] and reader.request_ids("a1", 0) == []
    gone = CheckpointInfo(epoch=3, seq=9, size=1, written=0.0)
    with pytest.raises(StoreError, match="no longer retained"):
        reader.read_checkpoint("a1", gone)


# -- opening --------------------------------------------------------------------


def test_opening_what_is_no_earlier_store_says_so_in_one_line() -> None:
    """An empty prefix, a store of this version, a bad URL: ConfigError, nothing written."""
    empty = etcd_url()
    with pytest.raises(ConfigError, match="no HamsterBunker store under"):
        open_earlier_etcd(empty)
    current = RecordStore(EtcdBackend(etcd_url()))
    current.create_cluster(new_cluster_record(SECRET))
    current.cas_lease("a1", None, lease("n1", 1))
    with pytest.raises(ConfigError, match="this version's layout"):
        open_earlier_etcd(current.url)
    current.close()
    with pytest.raises(ConfigError, match="key prefix"):
        open_earlier_etcd("etcd://127.0.0.1:2379")
    with pytest.raises(StoreError, match="cannot connect"):
        open_earlier_etcd("etcd://127.0.0.1:1/p?timeout=2")
    assert _keys_under(empty) == 0


def _keys_under(url: str) -> int:
    from hamsterbunker.stores.backends.etcd_connection import parse_etcd_url

    target = parse_etcd_url(url)
    connection = EtcdConnection(target)
    try:
        return len(connection.kv.get(target.prefix, range_end=target.prefix + "\xff"))
    finally:
        connection.close()


# -- (b) hostile contents ---------------------------------------------------------


def test_records_asked_for_by_name_that_do_not_parse_are_corrupt(
    url: str, reader: EarlierEtcdStore
) -> None:
    """A junk cluster or lease record, an acceptance over its limit: CorruptRecord (the lease's
    naming the revision that wrote it, as the earlier store named it)."""
    plant(url, "agents/a1/acceptance", b"x" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(CorruptRecord, match="above the limit"):
        reader.read_acceptance("a1")
    plant(url, "agents/a1/lease", b"{not json")
    with pytest.raises(UnreadableLease) as lease_error:
        reader.read_lease("a1")
    assert lease_error.value.found == f"revision {raw_revision(url, 'agents/a1/lease')}"
    plant(url, "cluster", b"[]")
    with pytest.raises(CorruptRecord):
        reader.read_cluster()


def test_junk_in_listings_is_skipped_as_the_earlier_store_skipped_it(
    url: str, reader: EarlierEtcdStore
) -> None:
    """Names not written by that store, values that do not parse or are over their limits:
    left out of agents, heartbeats, checkpoints, effects, inbox and request ids."""
    beat = json.loads(Heartbeat(node="n2", region="eu", host="h", pid=1, role="standby",
                                epoch=3, seq=4, leader="n1", time=0.0).to_json())  # fmt: skip
    info = json.dumps({"epoch": 3, "seq": 9, "size": 1, "written": 1.0}).encode()
    for key, value in {
        "agents/bad name!/lease": b"{}",  # no agent id
        "agents/a1/heartbeats/n2": json.dumps({**beat, "node": "n3"}).encode(),  # n3's copy
        "agents/a1/heartbeats/n4": b"junk",
        "agents/a1/heartbeats/n5": b" " * (MAX_RECORD_BYTES + 1),
        "agents/a1/checkpoint-info/9": info,  # not 20 digits
        "agents/a1/checkpoint-info/00000000000000000009": b"junk",
        "agents/a1/effects/00000000000000000005/0001/nonsense": b"x",
        "agents/a1/effects/00000000000000000005/0002/outcome": b"x" * (MAX_EFFECT_BYTES + 1),
        PENDING + "8": b"x",
        PENDING + "00000000000000000009": b"x" * (MAX_SUBMISSION_BYTES + 1),
        "agents/a1/inbox/ids/-not-an-id": b"{}",
        "agents/a1/inbox/ids/r5": b"junk",  # pending r5's record replaced by junk
    }.items():
        plant(url, key, value)
    assert reader.list_agents() == ["a1", "a2"]
    recorded = _recorded()
    now = _agent(reader)
    assert now["heartbeats"] == recorded["heartbeats"]
    assert now["checkpoints"] == recorded["checkpoints"]
    assert now["effects"] == recorded["effects"]
    assert now["inbox_pages"] == recorded["inbox_pages"]
    assert now["admissions"] == {**recorded["admissions"], "r5": None}  # junk: unknown
    assert reader.request_ids("a1", 100) == expected()["request_ids"]["a1"]


def test_a_reply_missing_or_over_its_limit_reads_as_none(
    url: str, reader: EarlierEtcdStore
) -> None:
    """The earlier store took a consumed submission's unreadable reply as no reply yet."""
    reply = "agents/a1/inbox/replies/00000000000000000003/0000000003-00000000000000000003"
    unplant(url, reply)
    state = reader.read_admission("a1", "r3")
    assert state is not None and (state.number, state.consumed, state.reply) == (3, True, None)
    plant(url, reply, b"x" * (256 * 1024 + 1))
    state = reader.read_admission("a1", "r3")
    assert state is not None and state.reply is None


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many keys each txn the reader sends fetched (a spy on the connection)."""
    counts: list[int] = []
    original: Callable[..., dict[str, Any]] = EtcdConnection.txn

    def counted(self: EtcdConnection, *args: Any, **kwargs: Any) -> dict[str, Any]:
        response = original(self, *args, **kwargs)
        ranges = [op.get("response_range", {}) for op in response.get("responses", [])]
        counts.append(sum(len(each.get("kvs", [])) for each in ranges))
        return response

    monkeypatch.setattr(EtcdConnection, "txn", counted)
    return counts


def test_a_large_planted_inbox_listing_is_read_bounded(
    url: str, reader: EarlierEtcdStore, fetched: list[int]
) -> None:
    """Junk keys sorting before the genuine entries: one read looks at no more than twice a
    full inbox's keys (in pages), as the earlier store did, and returns what it found."""
    # Each sorts after number 1's name and before number 2's: before 5 and 6.
    junk = [f"{PENDING}{1:020d}{n:05d}x" for n in range(2 * MAX_INBOX_COUNT + 200)]
    planted_many(url, junk, b"j")
    assert reader.read_inbox("a1") == []  # the genuine ones lie past the keys looked at
    assert sum(fetched) <= 2 * MAX_INBOX_COUNT + 64
    assert max(fetched) <= 64


def test_a_large_planted_ids_listing_is_read_bounded(
    url: str, reader: EarlierEtcdStore, fetched: list[int]
) -> None:
    """request_ids looks at about twice the ids asked for, names only, junk included."""
    planted_many(url, [f"agents/a1/inbox/ids/.{n:04d}" for n in range(500)])
    assert reader.request_ids("a1", 10) == []
    assert sum(fetched) <= 2 * 10 + 64


# -- (c), (d) migration into this version's layout ----------------------------------


def _migrate(reader: EarlierEtcdStore, target: RecordStore, **kwargs: Any) -> Migrated:
    cluster = reader.read_cluster()
    assert cluster is not None
    kwargs.setdefault("pause", lambda _s: None)
    return migrate(reader, target, Sealer(SECRET, cluster), say=lambda _l: None, **kwargs)


def test_migrate_copies_everything_and_a_node_goes_on(
    reader: EarlierEtcdStore, target: RecordStore
) -> None:
    """What the target reads back is what the earlier store read, but for the old nodes'
    heartbeats and the submission that does not open; the lease's epoch and the newest
    checkpoint are the source's, and a node takes the next term and checkpoints on."""
    _migrate(reader, target)
    recorded = expected()["answers"]
    copied = answers_of(target)
    assert copied["cluster"] == recorded["cluster"]
    assert list(copied["agents"]) == list(recorded["agents"])
    for agent, was in recorded["agents"].items():
        now = copied["agents"][agent]
        left = [page for page in ([e for e in p if e[0] != 7] for p in was["inbox_pages"]) if page]
        admissions = {**was["admissions"], "junk": None}
        # This version keeps a checkpoint's time in milliseconds (in its key's name).
        for info in was["checkpoints"]:
            info["written"] = pytest.approx(info["written"], abs=1e-3)
        assert now == {**was, "heartbeats": [], "inbox_pages": left, "admissions": admissions}
        source, copy = reader.read_lease(agent), target.read_lease(agent)
        assert source is not None and copy is not None and copy.epoch == source.epoch == 3
        newest = target.list_checkpoints(agent)[0]
        assert (newest.seq, newest.epoch) == (reader.list_checkpoints(agent)[0].seq, 3)
        taken = target.cas_lease(agent, copy.version, lease("n2", 4, session="s4"))
        target.put_checkpoint(agent, fence_of(taken), newest.seq + 1, b"on")


def test_the_submission_that_does_not_open_is_left_out_and_said(
    reader: EarlierEtcdStore, target: RecordStore
) -> None:
    migrated = _migrate(reader, target)
    said = [line for line in migrated.left_out if line.startswith("agent a1: submission #7")]
    assert said, migrated.left_out
    assert [n for n, _ in target.read_inbox("a1")] == [5, 6]


def test_a_source_that_changes_during_the_migration_is_refused(
    url: str, reader: EarlierEtcdStore, target: RecordStore
) -> None:
    """A heartbeat written while the source is watched: refused, and no cluster copied."""
    beat = _recorded()["heartbeats"][0]
    moved = json.dumps({**beat, "beats": beat["beats"] + 1}).encode()
    with pytest.raises(StoreError, match="stop every node first"):
        _migrate(reader, target, pause=lambda _s: plant(url, "agents/a1/heartbeats/n1", moved))
    assert target.read_cluster() is None
