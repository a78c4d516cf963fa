"""The store contract (hamsterbunker/stores/base.py), run unchanged against every backend.

The fixtures ``store`` and ``open_second`` come from conftest.py: ``store`` is a
client on a fresh, empty store, and ``open_second()`` opens another independent
client on the same store, so the races below are races between real clients.
Races start together on a threading.Barrier; nothing here sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from hamsterbunker.core.errors import (
    ConfigError,
    Fenced,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
)
from hamsterbunker.core.limits import MAX_CHECKPOINT_BYTES, MAX_EPOCH, MAX_RECORD_BYTES, MAX_SEQ
from hamsterbunker.records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord
from hamsterbunker.stores import open_store
from hamsterbunker.stores.base import Fence, RestoreRead, StoreGuarantees, StoreReport, newest_first
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.tail import TailRead

from .conftest import (
    BAD_URLS,
    CARRIES_LEASE,
    EVENT_BOUND,
    KEEP_CHECKPOINTS,
    READS_AS_IT_TAKES,
    WITH_PASSWORD,
    Gone,
    Opener,
    Spaces,
)

T = TypeVar("T")

THREADS = 8
RACE_ROUNDS = 30
WAIT_S = 30.0  # generous bound on every join and barrier


# -- helpers -----------------------------------------------------------------


def lease(holder: str | None, epoch: int, session: str = "s1", renewals: int = 0) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, region="eu", session=session, epoch=epoch, ttl_ms=2000, renewals=renewals
    )


def fence_of(record: LeaseRecord) -> Fence:
    assert record.holder is not None
    return Fence(holder=record.holder, session=record.session, epoch=record.epoch)


def cluster(tag: int) -> ClusterRecord:
    return ClusterRecord(
        format=1,
        kdf="scrypt",
        n=2**15,
        r=8,
        p=1,
        salt=f"c2FsdC{tag:04d}==",
        key_id=f"key-{tag}",
        key_check=f"Y2hlY2s{tag:04d}=",
        created=1000.0 + tag,
    )


def heartbeat(node: str, beats: int = 0, role: str = "standby") -> Heartbeat:
    return Heartbeat(
        node=node,
        region="eu",
        host=f"host-{node}",
        pid=4242,
        role=role,
        epoch=1,
        seq=beats,
        leader=None,
        time=1700000000.0 + beats,
        beats=beats,
    )


def event(node: str, n: int, kind: str = "agent.step") -> Event:
    return Event(node=node, n=n, type=kind, time=1700000000.0 + n, epoch=1, seq=n, detail={"i": n})


def race(count: int, work: Callable[[int], T]) -> list[T | BaseException]:
    """Run work(0..count-1) in threads released together; return each result or exception."""
    barrier = threading.Barrier(count)
    pending = object()
    results: list[Any] = [pending] * count

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=WAIT_S)
            results[i] = work(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)
        assert not thread.is_alive(), "a racing thread did not finish in time"
    assert all(r is not pending for r in results)
    return results


def clients(open_second: Opener, count: int) -> list[Store]:
    return [open_second() for _ in range(count)]


def seqs(store: Store, agent: str = "a") -> list[int]:
    return [info.seq for info in store.list_checkpoints(agent)]


# -- shape -------------------------------------------------------------------


def test_store_satisfies_the_protocol(store: Store) -> None:
    """A backend is a Store and states its URL, guarantees and warnings, and what it is
    (a report, and no chains: one lease keeps one chain)."""
    assert isinstance(store, Store)
    assert isinstance(store.url, str) and store.url
    assert isinstance(store.guarantees, StoreGuarantees)
    assert all(isinstance(w, str) for w in store.warnings)
    assert isinstance(store.report(), StoreReport) and store.chains is None


def test_invalid_agent_id_is_refused(store: Store) -> None:
    """An agent id that is not a plain name is a ConfigError, never a path."""
    with pytest.raises(ConfigError):
        store.read_lease("../escape")


# -- cluster record ----------------------------------------------------------


def test_cluster_is_none_at_first(store: Store) -> None:
    """An empty store has no cluster record."""
    assert store.read_cluster() is None


def test_create_cluster_stores_the_record(store: Store, open_second: Opener) -> None:
    """create_cluster returns the record, and every client then reads it."""
    assert store.create_cluster(cluster(1)) == cluster(1)
    assert store.read_cluster() == cluster(1)
    assert open_second().read_cluster() == cluster(1)


def test_second_create_returns_the_first_record(store: Store, open_second: Opener) -> None:
    """A second create_cluster keeps the first record and returns it."""
    store.create_cluster(cluster(1))
    assert open_second().create_cluster(cluster(2)) == cluster(1)
    assert store.read_cluster() == cluster(1)


def test_concurrent_creates_all_return_one_stored_record(open_second: Opener) -> None:
    """Eight clients creating different records at once all get back the one that is stored."""
    racers = clients(open_second, THREADS)
    results = race(THREADS, lambda i: racers[i].create_cluster(cluster(i)))
    assert all(isinstance(r, ClusterRecord) for r in results), results
    stored = racers[0].read_cluster()
    assert stored in [cluster(i) for i in range(THREADS)]
    assert all(r == stored for r in results)


# -- lease -------------------------------------------------------------------


def test_lease_is_none_at_first(store: Store) -> None:
    """An agent whose lease was never written has none."""
    assert store.read_lease("a") is None


def test_cas_from_none_creates_the_lease(store: Store, open_second: Opener) -> None:
    """cas_lease(None) on an empty record stores it and every client reads the same record."""
    stored = store.cas_lease("a", None, lease("n1", 1))
    assert (stored.holder, stored.epoch, stored.session) == ("n1", 1, "s1")
    assert store.read_lease("a") == stored
    assert open_second().read_lease("a") == stored


def test_store_assigns_the_version(store: Store) -> None:
    """The stored version is the store's and grows with every write, whatever the caller put in.

    (Not necessarily by one: etcd's mod_revision counts every write to the cluster.)
    """
    first = store.cas_lease("a", None, replace(lease("n1", 1), version=77))
    assert first.version != 77
    second = store.cas_lease("a", first.version, lease("n1", 1, renewals=1))
    assert second.version > first.version


def test_cas_from_none_when_a_lease_exists_conflicts(store: Store, open_second: Opener) -> None:
    """cas_lease(None) loses once any lease record exists."""
    stored = store.cas_lease("a", None, lease("n1", 1))
    with pytest.raises(LeaseConflict):
        open_second().cas_lease("a", None, lease("n2", 2))
    assert store.read_lease("a") == stored


def test_cas_from_the_current_version_succeeds(store: Store, open_second: Opener) -> None:
    """cas_lease against the version last read replaces the record."""
    first = store.cas_lease("a", None, lease("n1", 1))
    second = open_second().cas_lease("a", first.version, lease("n2", 2, session="s2"))
    assert (second.holder, second.epoch, second.session) == ("n2", 2, "s2")
    assert store.read_lease("a") == second


def test_stale_version_conflicts_and_leaves_the_record(store: Store, open_second: Opener) -> None:
    """cas_lease against an older version raises LeaseConflict and changes nothing."""
    first = store.cas_lease("a", None, lease("n1", 1))
    second = store.cas_lease("a", first.version, lease("n1", 1, renewals=1))
    other = open_second()
    with pytest.raises(LeaseConflict):
        other.cas_lease("a", first.version, lease("n2", 2))
    with pytest.raises(LeaseConflict):
        other.cas_lease("a", second.version + 5, lease("n2", 2))
    assert store.read_lease("a") == second
    assert other.read_lease("a") == second


def test_versions_strictly_increase(store: Store) -> None:
    """Every successful write, release included, stores a higher version."""
    record = store.cas_lease("a", None, lease("n1", 1))
    versions = [record.version]
    for i in range(1, 20):
        holder = None if i % 5 == 0 else f"n{i % 3}"
        record = store.cas_lease("a", record.version, lease(holder, i, renewals=i))
        versions.append(record.version)
        assert store.read_lease("a") == record
    assert versions == sorted(set(versions))


def test_racing_acquires_have_exactly_one_winner(open_second: Opener) -> None:
    """Eight clients racing cas_lease(None) for a fresh agent: exactly one wins, every round."""
    racers = clients(open_second, THREADS)
    for round_no in range(RACE_ROUNDS):
        agent = f"race-{round_no}"

        def acquire(i: int, agent: str = agent) -> LeaseRecord:
            return racers[i].cas_lease(agent, None, lease(f"n{i}", 1, f"s{i}"))

        results = race(THREADS, acquire)
        winners = [r for r in results if isinstance(r, LeaseRecord)]
        losers = [r for r in results if isinstance(r, LeaseConflict)]
        assert len(winners) == 1, f"round {round_no}: {results}"
        assert len(losers) == THREADS - 1, f"round {round_no}: {results}"
        assert racers[0].read_lease(agent) == winners[0]


def test_racing_renewals_have_exactly_one_winner(store: Store, open_second: Opener) -> None:
    """Eight clients racing cas_lease from the same version: exactly one wins, every round."""
    racers = clients(open_second, THREADS)
    current = store.cas_lease("a", None, lease("n0", 1))
    for round_no in range(RACE_ROUNDS):
        seen = current.version

        def renew(i: int, seen: int = seen, epoch: int = round_no + 2) -> LeaseRecord:
            return racers[i].cas_lease("a", seen, lease(f"n{i}", epoch, f"s{i}"))

        results = race(THREADS, renew)
        winners = [r for r in results if isinstance(r, LeaseRecord)]
        assert len(winners) == 1, f"round {round_no}: {results}"
        assert all(isinstance(r, LeaseConflict) for r in results if r is not winners[0])
        current = winners[0]
        assert current.version > seen
        assert store.read_lease("a") == current


def test_agents_are_isolated(store: Store, open_second: Opener) -> None:
    """Agents "a" and "b" have separate leases, checkpoints, heartbeats and events."""
    a = store.cas_lease("a", None, lease("n1", 1))
    assert store.read_lease("b") is None
    b = open_second().cas_lease("b", None, lease("n2", 7, session="s2"))
    assert store.read_lease("a") == a
    assert store.read_lease("b") == b
    store.put_checkpoint("a", fence_of(a), 1, b"for a")
    with pytest.raises(Fenced):
        store.put_checkpoint("b", fence_of(a), 2, b"a's fence on b")
    assert store.list_checkpoints("b") == []
    store.put_heartbeat("a", heartbeat("n1"))
    store.append_event("a", event("n1", 1))
    assert store.list_heartbeats("b") == []
    assert store.read_events("b") == []


# -- checkpoints -------------------------------------------------------------


def test_no_checkpoints_at_first(store: Store) -> None:
    """A fresh agent has no checkpoints."""
    assert store.list_checkpoints("a") == []


def test_checkpoint_under_the_current_fence_is_accepted(store: Store, open_second: Opener) -> None:
    """put_checkpoint under the current lease stores it and reports epoch, seq and size."""
    held = store.cas_lease("a", None, lease("n1", 3))
    info = store.put_checkpoint("a", fence_of(held), 1, b"sealed-1")
    assert (info.epoch, info.seq, info.size) == (3, 1, len(b"sealed-1"))
    listed = open_second().list_checkpoints("a")
    assert [(i.epoch, i.seq, i.size) for i in listed] == [(3, 1, 8)]


@pytest.mark.parametrize(
    "stale",
    [
        Fence(holder="n1", session="s1", epoch=1),  # old epoch
        Fence(holder="n2", session="s1", epoch=2),  # wrong holder
        Fence(holder="n1", session="s0", epoch=2),  # wrong session (same node, restarted)
        Fence(holder="n1", session="s1", epoch=3),  # an epoch from the future
    ],
    ids=["old-epoch", "wrong-holder", "wrong-session", "future-epoch"],
)
def test_write_under_a_stale_fence_is_fenced(store: Store, stale: Fence) -> None:
    """A checkpoint whose (holder, session, epoch) is not the lease's raises Fenced."""
    first = store.cas_lease("a", None, lease("n1", 1))
    current = store.cas_lease("a", first.version, lease("n1", 2))
    store.put_checkpoint("a", fence_of(current), 1, b"current")
    with pytest.raises(Fenced):
        store.put_checkpoint("a", stale, 2, b"stale")


def test_write_without_a_lease_is_fenced(store: Store) -> None:
    """A checkpoint for an agent that has no lease record raises Fenced."""
    with pytest.raises(Fenced):
        store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"no lease")
    assert store.list_checkpoints("a") == []


def test_write_after_release_is_fenced(store: Store) -> None:
    """Once the holder released the lease (holder None), its fence no longer writes."""
    held = store.cas_lease("a", None, lease("n1", 1))
    store.cas_lease("a", held.version, lease(None, 1))
    with pytest.raises(Fenced):
        store.put_checkpoint("a", fence_of(held), 1, b"after release")


def test_fenced_write_leaves_checkpoints_unchanged(store: Store, open_second: Opener) -> None:
    """A Fenced write adds, removes and alters no checkpoint."""
    old = store.cas_lease("a", None, lease("n1", 1))
    for seq in (1, 2):
        store.put_checkpoint("a", fence_of(old), seq, f"v{seq}".encode())
    new = open_second().cas_lease("a", old.version, lease("n2", 2, session="s2"))
    before = store.list_checkpoints("a")
    with pytest.raises(Fenced):
        store.put_checkpoint("a", fence_of(old), 3, b"stale")
    assert store.list_checkpoints("a") == before
    assert [store.read_checkpoint("a", i) for i in before] == [b"v2", b"v1"]
    store.put_checkpoint("a", fence_of(new), 3, b"new leader")
    assert seqs(store) == [3, 2, 1]


@pytest.mark.parametrize("seq", [5, 4, 0], ids=["equal", "lower", "zero"])
def test_sequence_must_increase(store: Store, seq: int) -> None:
    """A seq not above the term's own raises StoreError (not Fenced) and stores nothing."""
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(held), 5, b"five")
    with pytest.raises(StoreError) as caught:
        store.put_checkpoint("a", fence_of(held), seq, b"not above")
    assert not isinstance(caught.value, Fenced)
    assert seqs(store) == [5]
    assert store.read_checkpoint("a", store.list_checkpoints("a")[0]) == b"five"


def listed(store: Store, agent: str = "a") -> list[tuple[int, int]]:
    """(seq, epoch) of every listed checkpoint, in the order listed."""
    return [(info.seq, info.epoch) for info in store.list_checkpoints(agent)]


def test_new_leader_may_number_below_another_epochs_checkpoint(
    store: Store, open_second: Opener
) -> None:
    """Only the runtime can authenticate: another epoch's higher seq keeps no write out."""
    old = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(old), 9, b"nine")
    new = store.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    info = store.put_checkpoint("a", fence_of(new), 3, b"three")
    assert (info.epoch, info.seq) == (2, 3)
    other = open_second()
    assert listed(other) == [(9, 1), (3, 2)]
    assert [other.read_checkpoint("a", i) for i in other.list_checkpoints("a")] == [
        b"nine",
        b"three",
    ]


@pytest.mark.parametrize("seq", [4, 3, 2], ids=["equal", "lower", "lowest"])
def test_own_epochs_checkpoint_at_or_above_seq_refuses(store: Store, seq: int) -> None:
    """A term numbers upwards and never overwrites its own, whatever other epochs hold."""
    old = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(old), 9, b"nine")
    new = store.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    store.put_checkpoint("a", fence_of(new), 4, b"four")
    with pytest.raises(StoreError) as caught:
        store.put_checkpoint("a", fence_of(new), seq, b"not above")
    assert not isinstance(caught.value, Fenced)
    assert "must increase" in str(caught.value)
    assert listed(store) == [(9, 1), (4, 2)]
    assert store.read_checkpoint("a", store.list_checkpoints("a")[1]) == b"four"
    store.put_checkpoint("a", fence_of(new), 5, b"five")
    assert listed(store) == [(9, 1), (5, 2), (4, 2)]


def test_retention_never_removes_checkpoints_above_seq(store: Store) -> None:
    """Retention keeps the newest KEEP_CHECKPOINTS at or below seq; above it, nothing goes."""
    old = store.cas_lease("a", None, lease("n1", 1))
    for seq in (20, 21):
        store.put_checkpoint("a", fence_of(old), seq, f"old {seq}".encode())
    new = store.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    written = list(range(1, KEEP_CHECKPOINTS + 4))
    for seq in written:
        store.put_checkpoint("a", fence_of(new), seq, f"new {seq}".encode())
        kept = sorted(written[:seq], reverse=True)[:KEEP_CHECKPOINTS]
        assert listed(store) == [(21, 1), (20, 1), *((s, 2) for s in kept)]
    assert [store.read_checkpoint("a", i) for i in store.list_checkpoints("a")][:2] == [
        b"old 21",
        b"old 20",
    ]


def test_equal_seqs_of_two_epochs_list_the_newer_epoch_first(
    store: Store, open_second: Opener
) -> None:
    """Two epochs under one seq: the later epoch is listed first (the earlier may be replaced)."""
    old = store.cas_lease("a", None, lease("n1", 1))
    for seq in (4, 5):
        store.put_checkpoint("a", fence_of(old), seq, f"old {seq}".encode())
    new = store.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    store.put_checkpoint("a", fence_of(new), 5, b"new 5")
    other = open_second()
    assert listed(other) in ([(5, 2), (5, 1), (4, 1)], [(5, 2), (4, 1)])
    infos = other.list_checkpoints("a")
    assert other.read_checkpoint("a", infos[0]) == b"new 5"
    assert other.read_checkpoint("a", infos[-1]) == b"old 4"
    if len(infos) == 3:
        assert other.read_checkpoint("a", infos[1]) == b"old 5"


# -- bounds (hamsterbunker.core.limits) -----------------------------------------------


@pytest.mark.parametrize(
    ("seq", "epoch", "size", "named"),
    [
        (0, 1, 4, "outside 1.."),
        (MAX_SEQ + 1, 1, 4, "outside 1.."),
        (-3, 1, 4, "outside 1.."),
        (1, MAX_EPOCH + 1, 4, "outside 1.."),
        (1, 0, 4, "outside 1.."),
        (1, 1, MAX_CHECKPOINT_BYTES + 1, f"limit of {MAX_CHECKPOINT_BYTES} bytes"),
    ],
    ids=["seq-0", "seq-too-big", "seq-negative", "epoch-too-big", "epoch-0", "too-large"],
)
def test_checkpoint_outside_the_bounds_is_refused(
    store: Store, seq: int, epoch: int, size: int, named: str
) -> None:
    """A seq, epoch or size outside hamsterbunker.core.limits is a StoreError naming the bound.

    Checked before anything else (the fence included), so nothing is stored or sent.
    """
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = replace(fence_of(held), epoch=epoch)
    with pytest.raises(StoreError) as caught:
        store.put_checkpoint("a", fence, seq, bytes(size))
    assert not isinstance(caught.value, Fenced)
    assert named in str(caught.value)
    assert store.list_checkpoints("a") == []


def test_checkpoint_at_the_bounds_is_stored_and_listed(store: Store, open_second: Opener) -> None:
    """The largest seq and epoch allowed are stored and listed (names hold them)."""
    held = store.cas_lease("a", None, lease("n1", MAX_EPOCH))
    info = store.put_checkpoint("a", fence_of(held), MAX_SEQ, b"last")
    assert (info.seq, info.epoch) == (MAX_SEQ, MAX_EPOCH)
    other = open_second()
    assert listed(other) == [(MAX_SEQ, MAX_EPOCH)]
    assert other.read_checkpoint("a", other.list_checkpoints("a")[0]) == b"last"


# -- loss acceptance -------------------------------------------------------------


def test_acceptance_is_none_at_first(store: Store) -> None:
    """An agent without a loss acceptance has none."""
    assert store.read_acceptance("a") is None


def test_acceptance_put_read_replace(store: Store, open_second: Opener) -> None:
    """put_acceptance stores opaque bytes every client reads; a second put replaces them."""
    first = b'{"sealed": "x"}\x00\xff' * 10
    store.put_acceptance("a", first)
    other = open_second()
    assert other.read_acceptance("a") == first
    other.put_acceptance("a", b"second")
    assert store.read_acceptance("a") == b"second"
    assert store.read_acceptance("b") is None


def test_an_acceptance_record_over_the_record_limit_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match=f"limit of {MAX_RECORD_BYTES} bytes"):
        store.put_acceptance("a", b"x" * (MAX_RECORD_BYTES + 1))
    assert store.read_acceptance("a") is None


def test_checkpoints_listed_newest_first_and_retained(store: Store, open_second: Opener) -> None:
    """list_checkpoints is newest first and only the newest KEEP_CHECKPOINTS are kept."""
    held = store.cas_lease("a", None, lease("n1", 1))
    written = [1, 2, 4, 8, 9, 15, 16]
    for seq in written:
        store.put_checkpoint("a", fence_of(held), seq, f"cp{seq}".encode())
        expected = sorted((s for s in written if s <= seq), reverse=True)[:KEEP_CHECKPOINTS]
        assert seqs(store) == expected
    other = open_second()
    assert seqs(other) == [16, 15, 9]
    assert [other.read_checkpoint("a", i) for i in other.list_checkpoints("a")] == [
        b"cp16",
        b"cp15",
        b"cp9",
    ]


def test_read_checkpoint_returns_the_exact_bytes(store: Store, open_second: Opener) -> None:
    """read_checkpoint gives back every byte as written, binary and large ones too."""
    held = store.cas_lease("a", None, lease("n1", 1))
    blobs = [b"", bytes(range(256)) * 4, b"\x00\r\n\xff" * 300_000]
    for seq, blob in enumerate(blobs, start=1):
        info = store.put_checkpoint("a", fence_of(held), seq, blob)
        assert info.size == len(blob)
    other = open_second()
    by_seq = {info.seq: other.read_checkpoint("a", info) for info in other.list_checkpoints("a")}
    assert by_seq == {1: blobs[0], 2: blobs[1], 3: blobs[2]}


def test_read_for_restore_finds_what_the_single_reads_find(
    store: Store, open_second: Opener
) -> None:
    """A restore's first read: the checkpoints listed newest first by epoch then seq, the
    acceptance record, and the bytes of the newest (below another epoch's higher seq)."""
    other = open_second()
    assert other.read_for_restore("a") == RestoreRead([], None, None)
    old = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(old), 9, b"nine")
    new = store.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    store.put_checkpoint("a", fence_of(new), 3, b"three")
    read = other.read_for_restore("a")
    assert [(i.seq, i.epoch) for i in read.infos] == [(3, 2), (9, 1)]
    assert (read.newest, read.acceptance, read.acceptance_problem) == (b"three", None, "")
    store.put_acceptance("a", b"accepted")
    store.put_checkpoint("a", fence_of(new), 10, b"ten")
    read = other.read_for_restore("a")
    assert read.infos == newest_first(other.list_checkpoints("a"))
    assert [(i.seq, i.epoch) for i in read.infos][:2] == [(10, 2), (3, 2)]
    assert (read.newest, read.acceptance) == (b"ten", b"accepted")


def test_take_lease_writes_as_cas_lease_does_and_reads_for_the_restore(
    store: Store, open_second: Opener, backend: str
) -> None:
    """take_lease is cas_lease, with read_for_restore as of the write where
    the backend reads as it takes, and what the first step reads (the journals from the
    step after the named checkpoint on, the inbox); on a conflict it writes nothing."""
    old = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", fence_of(old), 7, b"seven")
    store.put_checkpoint("a", fence_of(old), 8, b"eight")  # after the last renewal (below)
    store.put_effect("a", fence_of(old), 9, 0, "intent", b"the step in flight's intent")
    store.put_acceptance("a", b"accepted")
    store.admit("a", "r1", 1, b"sealed submission")
    other = open_second()
    with pytest.raises(LeaseConflict):
        other.take_lease("a", old.version + 1000, lease("n2", 2, session="s2"))
    assert other.read_lease("a") == old
    # The newest checkpoint the taker knew accepted, as a node's record names it: the one
    # published after it is read along too.
    taking = replace(lease("n2", 2, session="s2"), seq=7, seq_epoch=1)
    taken, read = other.take_lease("a", old.version, taking)
    assert taken == store.read_lease("a") and (taken.holder, taken.epoch) == ("n2", 2)
    if backend in READS_AS_IT_TAKES:
        assert read is not None and read.journals is not None
        assert replace(read, journals=None, inbox=None) == store.read_for_restore("a")
        assert read.newest == b"eight" and read.acceptance == b"accepted"
        assert read.journals.of(9) == store.read_effects("a", 9) != {}
        assert (read.journals.of(8), read.journals.of(7)) == ({}, None)  # 7: not read along
        assert read.inbox == store.read_inbox("a", 0) != []
    else:
        assert read is None
    with pytest.raises(Fenced):  # the old term is fenced off by the same write
        store.put_checkpoint("a", fence_of(old), 9, b"nine")


def test_a_last_publish_releases_the_lease_in_its_own_commit_where_the_store_can(
    store: Store, open_second: Opener, backend: str
) -> None:
    """put_checkpoint_and_release: the checkpoint and the lease released in one commit on the
    record layer's stores (the old fence refused after it); elsewhere the checkpoint alone
    (None: the caller releases). A lease record changed since (an operator's request
    written into it): the checkpoint alone, everywhere."""
    held = store.cas_lease("a", None, lease("n1", 1))
    released = replace(held, holder=None, renewals=held.renewals + 1, seq=2, seq_epoch=1)
    info, record = store.put_checkpoint_and_release(
        "a", fence_of(held), 2, b"two", (), held.version, released
    )
    other = open_second()
    assert (info.seq, other.read_checkpoint("a", info)) == (2, b"two")
    stored = other.read_lease("a")
    assert stored is not None
    if backend in READS_AS_IT_TAKES:  # the record layer's stores
        assert record == stored and (stored.holder, stored.seq) == (None, 2)
        with pytest.raises(Fenced):
            store.put_checkpoint("a", fence_of(held), 3, b"three")
    else:
        assert record is None and stored == held
    term = other.cas_lease("a", stored.version, lease("n2", 2, session="s2"))
    assert store.read_lease("a") == term  # as its holder last saw it
    asked = other.cas_lease("a", term.version, replace(term, control="an operator's request"))
    released = replace(term, holder=None, seq=3, seq_epoch=2)
    info, record = store.put_checkpoint_and_release(
        "a", fence_of(term), 3, b"three", (), term.version, released
    )
    assert record is None and other.read_lease("a") == asked
    assert other.read_checkpoint("a", info) == b"three"


def test_a_standby_reads_the_checkpoint_a_lease_names_or_the_next_one_in_one_read(
    store: Store,
) -> None:
    """read_checkpoint_from (a standby's hot copy): the checkpoint of seq under epoch with
    its description; the next one retained when that one is not (pruned, or never
    published under that epoch); None past the newest."""
    held = store.cas_lease("a", None, lease("n1", 1))
    two = store.put_checkpoint("a", fence_of(held), 2, b"two")
    three = store.put_checkpoint("a", fence_of(held), 3, b"three")
    listed = {(info.seq, info.epoch): info for info in store.list_checkpoints("a")}

    def read_from(seq: int, epoch: int) -> tuple[int, bytes] | None:
        found = store.read_checkpoint_from("a", seq, epoch)
        if found is None:
            return None
        info, blob = found
        assert info == listed[(info.seq, info.epoch)]  # as the listing describes it
        return info.seq, blob

    assert (two.seq, three.seq) == (2, 3)
    assert read_from(2, 1) == (2, b"two")
    assert read_from(3, 1) == (3, b"three")
    assert read_from(1, 1) == (2, b"two")
    assert read_from(2, 2) == (3, b"three")  # seq 2 never under epoch 2
    assert read_from(3, 2) is None
    assert read_from(4, 1) is None


def test_reading_a_pruned_checkpoint_raises(store: Store) -> None:
    """Reading a checkpoint that retention removed raises StoreError."""
    held = store.cas_lease("a", None, lease("n1", 1))
    first = store.put_checkpoint("a", fence_of(held), 1, b"first")
    for seq in range(2, KEEP_CHECKPOINTS + 2):
        store.put_checkpoint("a", fence_of(held), seq, b"later")
    with pytest.raises(StoreError):
        store.read_checkpoint("a", first)
    missing = CheckpointInfo(epoch=1, seq=999, size=1, written=0.0)
    with pytest.raises(StoreError):
        store.read_checkpoint("a", missing)


def test_no_write_starting_after_a_takeover_is_accepted(store: Store, open_second: Opener) -> None:
    """While an old leader writes in a loop, no write it starts after a takeover is accepted."""
    writer_client, taker_client = open_second(), open_second()
    old = store.cas_lease("a", None, lease("n1", 1))
    wrote_some = threading.Event()
    taken_over = threading.Event()
    outcome: dict[str, Any] = {"late_successes": [], "ended_by": None, "last_seq": 0}

    def old_leader() -> None:
        for seq in range(1, 20_001):
            started_after = taken_over.is_set()
            try:
                writer_client.put_checkpoint("a", fence_of(old), seq, b"old %d" % seq)
            except Fenced as exc:
                outcome["ended_by"] = exc
                return
            outcome["last_seq"] = seq
            if started_after:
                outcome["late_successes"].append(seq)
            if seq >= 3:
                wrote_some.set()

    thread = threading.Thread(target=old_leader, daemon=True)
    thread.start()
    assert wrote_some.wait(WAIT_S), "the old leader never wrote"
    new = taker_client.cas_lease("a", old.version, lease("n2", 2, session="s2"))
    taken_over.set()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert isinstance(outcome["ended_by"], Fenced), "the old leader was never fenced"
    assert outcome["late_successes"] == []
    info = taker_client.put_checkpoint("a", fence_of(new), outcome["last_seq"] + 1, b"new")
    newest = store.list_checkpoints("a")[0]
    assert (newest.epoch, newest.seq) == (2, info.seq)


# -- heartbeats --------------------------------------------------------------


def test_heartbeats_put_replace_list_remove(store: Store, open_second: Opener) -> None:
    """A node's heartbeat is replaced by its next one, listed per node, and removable."""
    assert store.list_heartbeats("a") == []
    store.put_heartbeat("a", heartbeat("n1", 1))
    other = open_second()
    other.put_heartbeat("a", heartbeat("n2", 1, role="active"))
    store.put_heartbeat("a", heartbeat("n1", 2))
    by_node = {b.node: b for b in other.list_heartbeats("a")}
    assert by_node == {"n1": heartbeat("n1", 2), "n2": heartbeat("n2", 1, role="active")}
    other.remove_heartbeat("a", "n1")
    assert store.list_heartbeats("a") == [heartbeat("n2", 1, role="active")]


def test_removing_an_absent_heartbeat_is_fine(store: Store) -> None:
    """remove_heartbeat of a node that has none raises nothing and changes nothing."""
    store.remove_heartbeat("a", "ghost")
    store.put_heartbeat("a", heartbeat("n1"))
    store.remove_heartbeat("a", "ghost")
    store.remove_heartbeat("a", "n1")
    store.remove_heartbeat("a", "n1")
    assert store.list_heartbeats("a") == []


# -- events ------------------------------------------------------------------


def _by_node(events: list[Event]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in events:
        out.setdefault(e.node, []).append(e.n)
    return out


def test_events_append_and_read_in_order(store: Store, open_second: Opener) -> None:
    """Events read back whole and, per node, in the order appended."""
    assert store.read_events("a") == []
    other = open_second()
    for n in range(1, 5):
        store.append_event("a", event("n1", n))
        other.append_event("a", event("n2", n, kind="lease.renew_failed"))
    read = open_second().read_events("a")
    assert sorted(read, key=lambda e: (e.node, e.n)) == [
        *(event("n1", n) for n in range(1, 5)),
        *(event("n2", n, kind="lease.renew_failed") for n in range(1, 5)),
    ]
    assert _by_node(read) == {"n1": [1, 2, 3, 4], "n2": [1, 2, 3, 4]}


def test_events_read_after_per_node_cursors(store: Store) -> None:
    """read_events(after={node: n}) returns only each node's events above its cursor."""
    for n in range(1, 7):
        store.append_event("a", event("n1", n))
    for n in range(1, 4):
        store.append_event("a", event("n2", n))
    assert _by_node(store.read_events("a", after={"n1": 4})) == {"n1": [5, 6], "n2": [1, 2, 3]}
    assert _by_node(store.read_events("a", after={"n1": 6, "n2": 1})) == {"n2": [2, 3]}
    assert store.read_events("a", after={"n1": 6, "n2": 3}) == []
    assert _by_node(store.read_events("a", after={})) == {"n1": list(range(1, 7)), "n2": [1, 2, 3]}


def test_concurrent_appends_of_different_nodes(open_second: Opener) -> None:
    """Nodes appending at once through their own clients each keep their whole, ordered log."""
    racers = clients(open_second, 4)
    per_node = EVENT_BOUND

    def append_all(i: int) -> None:
        for n in range(1, per_node + 1):
            racers[i].append_event("a", event(f"n{i}", n))

    results = race(4, append_all)
    assert results == [None] * 4, results
    assert _by_node(racers[0].read_events("a")) == {
        f"n{i}": list(range(1, per_node + 1)) for i in range(4)
    }


def test_event_logs_are_bounded(store: Store) -> None:
    """After many appends a node keeps only its newest events, contiguous and in order."""
    total = 6 * EVENT_BOUND + 3
    for n in range(1, total + 1):
        store.append_event("a", event("busy", n))
    store.append_event("a", event("quiet", 1))
    kept = _by_node(store.read_events("a"))
    assert kept["quiet"] == [1]
    busy = kept["busy"]
    assert EVENT_BOUND <= len(busy) <= 2 * EVENT_BOUND, len(busy)
    assert busy == list(range(total - len(busy) + 1, total + 1))
    newest = _by_node(store.read_events("a", after={"busy": total - 2, "quiet": 1}))
    assert newest == {"busy": [total - 1, total]}


# -- the tail ----------------------------------------------------------------


def test_a_tail_returns_each_event_once_in_order_and_every_current_heartbeat(
    store: Store, open_second: Opener
) -> None:
    """Each read returns the events appended since the last one, in order, and every node's
    current heartbeat; past the bound it returns the retained newest, and a new tail starts
    from what is retained."""
    tail = store.tail("a")
    assert tail.read() == TailRead([], [])
    writer = open_second()
    for n in (1, 2, 3):
        writer.append_event("a", event("n1", n))
    writer.append_event("a", event("n2", 1))
    writer.put_heartbeat("a", heartbeat("n1", 1))
    first = tail.read()
    assert sorted(first.events, key=lambda e: (e.node, e.n)) == [
        event("n1", 1), event("n1", 2), event("n1", 3), event("n2", 1)
    ]  # fmt: skip
    assert _by_node(first.events) == {"n1": [1, 2, 3], "n2": [1]}
    assert first.heartbeats == [heartbeat("n1", 1)]
    assert tail.read() == TailRead([], [heartbeat("n1", 1)])
    writer.append_event("a", event("n1", 4))
    writer.put_heartbeat("a", heartbeat("n2", 1, role="active"))
    second = tail.read()
    assert second.events == [event("n1", 4)]
    assert {b.node: b for b in second.heartbeats} == {
        "n1": heartbeat("n1", 1), "n2": heartbeat("n2", 1, role="active")
    }  # fmt: skip
    last = 4 + 3 * EVENT_BOUND  # more than a log keeps: only the retained newest come back
    for n in range(5, last + 1):
        writer.append_event("a", event("n1", n))
    got = _by_node(tail.read().events)["n1"]
    assert got == list(range(last - len(got) + 1, last + 1)) and len(got) >= EVENT_BOUND, got
    assert tail.read().events == []
    writer.remove_heartbeat("a", "n1")
    assert tail.read().heartbeats == [heartbeat("n2", 1, role="active")]
    retained = _by_node(store.read_events("a"))
    assert _by_node(open_second().tail("a").read().events) == retained


# -- reachability ------------------------------------------------------------


def test_check_passes_while_the_store_is_there(store: Store, open_second: Opener) -> None:
    """check() raises nothing on a store that is there, empty or written, from any client."""
    store.check()
    store.cas_lease("a", None, lease("n1", 1))
    store.check()
    open_second().check()


def test_a_store_that_is_gone_is_store_unavailable(gone: Gone) -> None:
    """Once its server is stopped or its directory removed, check() raises StoreUnavailable at
    once, naming the store and the reason; so does every call of a networked store."""
    store = gone.store
    held = store.cas_lease("a", None, lease("n1", 1))
    store.check()
    gone.take_away()
    calls: list[Callable[[], object]] = [store.check]
    if gone.every_call_fails:
        calls += [
            lambda: store.read_lease("a"),
            lambda: store.cas_lease("a", held.version, lease("n1", 1)),
            lambda: store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"x"),
            lambda: store.list_heartbeats("a"),
            lambda: store.read_events("a"),
        ]
    started = time.monotonic()
    for call in calls:
        with pytest.raises(StoreUnavailable) as raised:
            call()
        assert re.search(gone.says, str(raised.value)), raised.value
    assert time.monotonic() - started < 5.0


# -- prefixes ----------------------------------------------------------------


def test_every_key_is_under_the_prefix_and_prefixes_are_isolated(spaces: Spaces) -> None:
    """All records live under the store's prefix (the file store's: its root), and a store
    under a prefix that merely starts the same sees none of them."""
    store = spaces.open("mine")
    held = store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"x")
    store.put_heartbeat("a", heartbeat("n1"))
    store.append_event("a", event("n1", 1))
    keys = spaces.keys()
    beside = spaces.beside("mine", "a")
    assert keys and all(
        key.startswith(spaces.agent_prefix("mine", "a")) or key in beside for key in keys
    ), keys
    store.create_cluster(cluster(1))
    keys = spaces.keys()
    assert keys and all(key.startswith(spaces.prefix("mine")) for key in keys), keys
    other = spaces.open("mine-too")
    assert other.read_cluster() is None
    assert other.read_lease("a") is None
    assert other.list_checkpoints("a") == [] and other.list_heartbeats("a") == []
    assert other.read_events("a") == []
    with pytest.raises(Fenced):
        other.put_checkpoint("a", Fence("n1", "s1", held.epoch), 2, b"y")


# -- URLs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "url"),
    [(backend, url) for backend, urls in BAD_URLS.items() for url in urls.values()],
    ids=[f"{backend}-{name}" for backend, urls in BAD_URLS.items() for name in urls],
)
def test_a_bad_url_is_a_config_error_in_one_readable_line(backend: str, url: str) -> None:
    """A URL a store cannot use is a ConfigError at open, before any connection is tried,
    saying in one line what is wrong, and never showing a password the URL holds."""
    with pytest.raises(ConfigError) as caught:
        open_store(url)
    assert str(caught.value).strip() and "\n" not in str(caught.value)
    if backend in WITH_PASSWORD:
        with pytest.raises(ConfigError) as caught:
            open_store(WITH_PASSWORD[backend](url))
        assert "s3cret" not in str(caught.value)


# -- watch -------------------------------------------------------------------


@pytest.mark.parametrize("lease_only", [False, True], ids=["all", "lease-only"])
def test_watch_yields_after_another_client_changes_the_lease(
    store: Store, open_second: Opener, lease_only: bool
) -> None:
    """A watcher (of everything, or of the lease alone) wakes when another client writes the lease."""
    other = open_second()
    held = other.cas_lease("a", None, lease("n1", 1))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        watcher = store.watch("a", lease_only=lease_only)
        woke = asyncio.ensure_future(watcher.__anext__())
        version, renewals = held.version, 0
        deadline = loop.time() + 10.0
        try:
            # Renew until the watcher wakes: the watcher may not be set up yet
            # when the first renewal lands, and a watch is only a hint.
            while not woke.done():
                assert loop.time() < deadline, "watch did not yield within 10 s of lease changes"
                renewals += 1
                renewed = await asyncio.to_thread(
                    other.cas_lease, "a", version, lease("n1", 1, renewals=renewals)
                )
                version = renewed.version
                await asyncio.wait({woke}, timeout=0.25)
            assert woke.result() is None or lease_only
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


@pytest.mark.parametrize("terms_only", [False, True], ids=["lease", "terms"])
def test_a_lease_watch_carries_the_record_written_with_its_version(
    store: Store, open_second: Opener, backend: str, terms_only: bool
) -> None:
    """A lease watch yields exactly a record another client wrote, version and all (or
    None, on a backend whose notices carry nothing): a node takes it for a read."""
    other = open_second()
    written: dict[int, LeaseRecord] = {}
    version = None

    async def main() -> None:
        nonlocal version
        loop = asyncio.get_running_loop()
        watcher = store.watch("a", lease_only=True, terms_only=terms_only)
        woke = asyncio.ensure_future(anext(watcher))
        try:
            epoch, deadline = 0, loop.time() + 10.0
            while not woke.done():  # new terms until the watch wakes: then it is set up
                assert loop.time() < deadline, "watch did not yield within 10 s of new terms"
                epoch += 1
                record = lease("n1", epoch, renewals=epoch)
                stored = await asyncio.to_thread(other.cas_lease, "a", version, record)
                version = stored.version
                written[stored.version] = stored
                await asyncio.wait({woke}, timeout=0.25)
            heard = woke.result()
            if backend not in CARRIES_LEASE:
                assert heard is None
                return
            assert heard is not None, "the watch carried no record"
            assert heard == written.get(heard.version), "not a record written, or another version"
            # Then the release comes as written, with the version the store gave it
            # (after the wakes of the writes above still due, each a record written).
            stored = await asyncio.to_thread(other.cas_lease, "a", version, lease(None, epoch))
            written[stored.version] = stored
            deadline = loop.time() + 10.0
            while heard != stored:
                assert loop.time() < deadline, "the release did not come within 10 s"
                woke = asyncio.ensure_future(anext(watcher))
                await asyncio.wait({woke}, timeout=deadline - loop.time())
                heard = woke.result() if woke.done() else heard
                assert heard is not None and heard == written.get(heard.version)
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_watch_of_terms_sleeps_through_renewals_and_wakes_on_a_release(
    store: Store, open_second: Opener
) -> None:
    """With terms_only, the holder's renewals wake nobody; a release does.

    A standby that woke for each renewal would read the lease twice a tick for
    nothing (its ticks see renewals anyway).
    """
    other = open_second()
    version = other.cas_lease("a", None, lease("n1", 1)).version

    async def write(record: LeaseRecord) -> None:
        nonlocal version
        version = (await asyncio.to_thread(other.cas_lease, "a", version, record)).version

    async def main() -> None:
        loop = asyncio.get_running_loop()
        watcher = store.watch("a", lease_only=True, terms_only=True)
        woke = asyncio.ensure_future(anext(watcher))
        try:
            # New terms until the watch wakes: then it is surely set up.
            epoch, deadline = 1, loop.time() + 10.0
            while not woke.done():
                assert loop.time() < deadline, "watch did not yield within 10 s of new terms"
                epoch += 1
                await write(lease("n1", epoch))
                await asyncio.wait({woke}, timeout=0.25)
            for _ in range(40):  # the wakes of the other new terms, if any are still due
                woke = asyncio.ensure_future(anext(watcher))
                if not (await asyncio.wait({woke}, timeout=0.5))[0]:
                    break
            for renewals in range(1, 6):
                await write(lease("n1", epoch, renewals=renewals))
            await asyncio.wait({woke}, timeout=1.0)
            assert not woke.done(), "a renewal woke a watch of terms"
            await write(lease(None, epoch, renewals=6))
            await asyncio.wait({woke}, timeout=10.0)
            assert woke.done(), "a release did not wake a watch of terms within 10 s"
        finally:
            woke.cancel()
            await asyncio.gather(woke, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_watch_ends_when_cancelled_at_any_moment(store: Store) -> None:
    """Cancelling the task that waits on a watch ends it, whenever the cancel lands.

    A watch is cancelled whenever a term ends or a result() returns; a cancel
    the backend swallows (redis-py lost those that landed in subscribe()) leaves
    its canceller waiting for ever. Cancels land from 0 to 20 ms in: while the
    watch connects, subscribes and waits.
    """
    rounds = 100
    rng = random.Random(1729)

    async def cancel_one(after_s: float) -> bool:
        watcher = store.watch("a")
        waiting = asyncio.ensure_future(anext(watcher))
        await asyncio.sleep(after_s)
        waiting.cancel()
        done, _ = await asyncio.wait({waiting}, timeout=5.0)
        if done:
            await watcher.aclose()  # type: ignore[attr-defined]
        return bool(done)

    async def main() -> list[float]:
        stuck = []
        for _ in range(rounds):
            after_s = rng.uniform(0.0, 0.02)
            if not await cancel_one(after_s):
                stuck.append(after_s)
                break  # the stuck task keeps its watch; stop here
        return stuck

    # Not asyncio.run: it would wait for ever on a stuck watch's task at its end.
    loop = asyncio.new_event_loop()
    try:
        stuck = loop.run_until_complete(main())
    finally:
        loop.close()
    assert not stuck, f"a watch cancelled {stuck[0] * 1000:.1f} ms in ran on for 5 s"
