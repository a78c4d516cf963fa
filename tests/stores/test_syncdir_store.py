"""The syncdir store (docs/syncdir.md) on plain local folders.

Each node has a folder of its own (a machine's copy of the synced folder);
``Sync.copy`` (``tests.support.syncdir``) plays the sync tool: it copies one
node's subtree (and the root's records, once) from that node's folder to
another, and remembers what it copied.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.errors import (
    ConfigError,
    Fenced,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
    StoreUnsafe,
)
from hamsterbunker.core.read_bounds import HEARTBEATS_READ, INBOX_READ, TERM_RECORDS_READ
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.records import CheckpointInfo, ClusterRecord, LeaseRecord
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.stores.base import Fence, Refusal
from hamsterbunker.stores.dirs.lease_watch import open_lease_watch
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.stores.syncdir import SyncDirStore
from hamsterbunker.stores.syncdir.claims import merged_lease, winning_node
from hamsterbunker.stores.syncdir.first_start import ANNOUNCEMENT
from hamsterbunker.stores.syncdir.layout import MARKER
from hamsterbunker.stores.syncdir.published import ClaimPublisher, is_claim_name
from hamsterbunker.stores.syncdir.terms import MAX_TERM_RECORD_BYTES
from tests.support import wait_until
from tests.support.raw_inbox import plant_submissions
from tests.support.raw_store import RawRecords, file_key
from tests.support.records import cluster, event, fence_of, heartbeat, lease
from tests.support.syncdir import Sync, SyncPump

AGENT = "a"
DELAY_MS = 1000
WAIT_S = 10.0


@pytest.fixture
def sync(tmp_path: Path) -> Sync:
    return Sync(tmp_path)


def published(root: Path, node: str) -> Path:
    """node's published records of AGENT in the folder at root: claims, terms/, choices/."""
    return root / "nodes" / node / "published" / AGENT


def claim_path(root: Path, node: str) -> Path:
    """node's own claim in the folder at root: its subtree's lease record, a file-backend key."""
    return file_key(root / "nodes" / node, AgentKeys(AGENT).lease)


def raw_subtree(root: Path, node: str) -> RawRecords:
    """node's subtree in the folder at root, written past the store as a hostile writer would."""
    backend = FileBackend(root / "nodes" / node, in_synced_folder=True)
    return RawRecords(backend, owned=True)


def take(store: SyncDirStore, node: str, epoch: int, session: str = "s1") -> LeaseRecord:
    """node takes the lease at epoch, against the merged record it reads now."""
    current = store.read_lease(AGENT)
    return store.cas_lease(
        AGENT, None if current is None else current.version, lease(node, epoch, session)
    )


def renew(store: SyncDirStore, held: LeaseRecord) -> LeaseRecord:
    return store.cas_lease(AGENT, held.version, replace(held, renewals=held.renewals + 1))


# -- opening ------------------------------------------------------------------------


def test_a_new_folder_is_marked_and_holds_only_the_nodes_own_subtree(sync: Sync) -> None:
    """Opening makes the marker and nodes/NODE/, nothing else."""
    store = sync.open("n1")
    root = sync.root("n1")
    assert (root / MARKER).is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted([MARKER, "nodes"])
    assert [p.name for p in (root / "nodes").iterdir()] == ["n1"]
    assert store.url == "syncdir://" + root.as_posix()
    assert "NOT" not in store.guarantees.mutual_exclusion
    assert store.guarantees.mutual_exclusion.startswith("none")


@pytest.mark.parametrize("delay", [0, -1, 3_600_001, 1.5, True, "1000"])
def test_sync_delay_must_be_a_sane_whole_number_of_ms(tmp_path: Path, delay: object) -> None:
    """sync_delay_ms outside 1 ms .. 1 hour, or not an int, is a ConfigError."""
    with pytest.raises(ConfigError, match="sync_delay_ms"):
        SyncDirStore(tmp_path, "n1", sync_delay_ms=delay)  # type: ignore[arg-type]
    assert not (tmp_path / MARKER).exists()


def test_the_delay_is_kept_and_node_ids_are_checked(tmp_path: Path) -> None:
    """The store keeps sync_delay_ms; a node id that is not one is refused."""
    assert SyncDirStore(tmp_path, "n1", sync_delay_ms=250).sync_delay_ms == 250
    with pytest.raises(ConfigError, match="node id"):
        SyncDirStore(tmp_path, "../x", sync_delay_ms=250)


def test_a_file_store_folder_and_an_unmarked_one_are_refused(tmp_path: Path) -> None:
    """A folder holding a file:// store is not taken; a reader needs the marker."""
    FileStore(tmp_path / "file").create_cluster(cluster(1))
    with pytest.raises(StoreError, match="file:// store"):
        SyncDirStore(tmp_path / "file", "n1", sync_delay_ms=DELAY_MS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="not a syncdir store"):
        SyncDirStore(tmp_path / "empty", "n1", sync_delay_ms=DELAY_MS, create=False)


def test_a_reader_creates_nothing_and_refuses_writes(sync: Sync) -> None:
    """Opened with create=False on a machine where the node never ran: reads work, writes don't."""
    store = sync.open("n1")
    take(store, "n1", 1)
    before = sorted(p.relative_to(sync.root("n1")) for p in sync.root("n1").rglob("*"))
    reader = SyncDirStore(sync.root("n1"), "monitor", sync_delay_ms=DELAY_MS, create=False)
    record = reader.read_lease(AGENT)
    assert record is not None and record.holder == "n1"
    with pytest.raises(StoreError, match="opened to read"):
        reader.put_heartbeat(AGENT, heartbeat("monitor"))
    with pytest.raises(StoreError, match="opened to read"):
        reader.create_cluster(cluster(1))
    assert reader.read_inbox(AGENT) == [] and reader.read_acceptance(AGENT) is None
    assert reader.read_effects(AGENT, 1) == {} and reader.read_admission(AGENT, "r") is None
    after = sorted(p.relative_to(sync.root("n1")) for p in sync.root("n1").rglob("*"))
    assert after == before


def plant_earlier_subtree(root: Path, node: str) -> None:
    """node's subtree as an earlier version wrote it: its records under agents/, no kv/."""
    agent_dir = root / "nodes" / node / "agents" / AGENT
    (agent_dir / "checkpoints").mkdir(parents=True)
    (agent_dir / "lease.json").write_bytes(replace(lease(node, 4), version=9).to_json())
    (agent_dir / "checkpoints" / f"ckpt-{7:020d}-{4:010d}.hbc").write_bytes(b"sealed-7")


@pytest.mark.parametrize("whose", ["own", "another"])
def test_a_folder_with_a_subtree_in_the_earlier_layout_is_refused_in_one_line(
    sync: Sync, whose: str
) -> None:
    """A syncdir folder an earlier version wrote (subtrees with agents/, no kv/) is never
    read as empty, which would start its agents afresh: a writer and a reader are refused,
    in one line naming hb migrate-store, before anything is written."""
    root = sync.root("n1")
    sync.open("n1").create_cluster(cluster(1))
    if whose == "own":
        shutil.rmtree(root / "nodes" / "n1")
    plant_earlier_subtree(root, "n1" if whose == "own" else "n2")
    before = sorted(root.rglob("*"))
    opening = [
        lambda: SyncDirStore(root, "n1", sync_delay_ms=DELAY_MS),
        lambda: SyncDirStore(root, "n3", sync_delay_ms=DELAY_MS),  # a node new to the folder
        lambda: SyncDirStore(root, create=False),
    ]
    for store in opening:
        with pytest.raises(ConfigError, match="earlier version") as refused:
            store()
        assert "hb migrate-store" in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(root.rglob("*")) == before


def test_a_subtree_in_the_earlier_layout_brought_later_fails_reads_not_reads_as_none(
    sync: Sync,
) -> None:
    """A node of an earlier version whose subtree the sync brings once a store is open makes
    its reads fail (StoreError), rather than leave that node's lease and chain out."""
    one = sync.open("n1")
    take(one, "n1", 1)
    plant_earlier_subtree(sync.root("n1"), "n2")
    with pytest.raises(StoreError, match="earlier version"):
        one.read_lease(AGENT)
    with pytest.raises(StoreError, match="earlier version"):
        one.list_chains(AGENT)


def test_another_nodes_subtree_is_only_read_never_written(sync: Sync) -> None:
    """Every read of another node's subtree leaves it as the sync brought it: no lock file,
    no keys folder, no redo log finished or set aside, no temp file swept (any write there
    would be a sync conflict)."""
    one, two = sync.open("n1"), sync.open("n2")
    one.create_cluster(cluster(1))
    held = take(two, "n2", 1)
    two.put_checkpoint(AGENT, fence_of(held), 1, b"sealed-1")
    two.put_effect(AGENT, fence_of(held), 2, 0, "intent", b"intent")
    two.put_heartbeat(AGENT, heartbeat("n2"))
    two.append_event(AGENT, event("n2", 1))
    two.put_term_start(AGENT, 1, b"record-1")
    sync.copy("n2", "n1")
    peer = sync.root("n1") / "nodes" / "n2"
    (peer / ".lock").unlink(missing_ok=True)
    (peer / ".redo").write_bytes(b"a redo log the sync brought")
    stale = peer / "tmp-hb-0123456789abcdef"
    stale.write_bytes(b"a write cut short on n2's machine")
    os.utime(stale, (0, 0))
    before = {p: p.read_bytes() if p.is_file() else None for p in sorted(peer.rglob("*"))}
    reader = SyncDirStore(sync.root("n1"), create=False)
    for store in (one, reader):
        assert store.read_lease(AGENT) is not None
        assert [info.seq for info in store.list_chains(AGENT)["n2"]] == [1]
        assert store.read_chain_effects(AGENT, "n2", 2) == {(0, "intent"): b"intent"}
        assert [beat.node for beat in store.list_heartbeats(AGENT)] == ["n2"]
        assert [e.n for e in store.read_events(AGENT)] == [1]
        assert store.list_agents() == [AGENT]
        assert store.read_term_starts(AGENT) == {(1, "n2"): b"record-1"}
    with pytest.raises(StoreError, match="subtree"):
        one.forget_node(AGENT, "n2")
    after = {p: p.read_bytes() if p.is_file() else None for p in sorted(peer.rglob("*"))}
    assert after == before


# -- claims ---------------------------------------------------------------------------


def test_the_winner_is_the_highest_epoch_then_a_self_claim_then_the_node_id() -> None:
    """Claim order: epoch; at one epoch the holder's own claim before a hand-over; node id."""
    one = lease("n1", 3)
    assert winning_node({"n1": lease("n1", 2), "n2": lease("n2", 3)}) == "n2"
    assert winning_node({"n1": lease("n1", 4), "n2": lease("n2", 3)}) == "n1"
    # n9 handed epoch 3 to n1: n1's own claim of it wins, whatever the node ids.
    assert winning_node({"n1": one, "n9": lease("n1", 3)}) == "n1"
    # A release (holder None) is no self-claim either.
    assert winning_node({"n1": one, "n9": lease(None, 3)}) == "n1"
    # Two self-claims at one epoch (a partition): the higher node id.
    assert winning_node({"n1": one, "n2": lease("n2", 3)}) == "n2"
    assert winning_node({}) is None
    merged = merged_lease({"n1": replace(one, version=5), "n2": replace(lease("n2", 2), version=7)})
    assert merged is not None and (merged.holder, merged.version) == ("n1", 12)


def test_two_nodes_see_each_others_claims_once_synced(sync: Sync) -> None:
    """A claim written on one machine is the lease on the other once the sync brought it."""
    one, two = sync.open("n1"), sync.open("n2")
    held = take(one, "n1", 1)
    assert held.holder == "n1" and held.version == 1
    assert two.read_lease(AGENT) is None  # not synced yet
    sync.copy("n1", "n2")
    seen = two.read_lease(AGENT)
    assert seen is not None and (seen.holder, seen.epoch, seen.version) == ("n1", 1, 1)
    assert two.claims(AGENT) == {"n1": replace(held, version=1)}


def test_the_merged_version_grows_and_a_stale_compare_and_set_fails(sync: Sync) -> None:
    """Any claim that arrives moves the merged version on; a CAS against the old one fails."""
    one, two = sync.open("n1"), sync.open("n2")
    held = take(one, "n1", 1)
    sync.copy("n1", "n2")
    seen = two.read_lease(AGENT)
    assert seen is not None
    held = renew(one, held)
    assert held.version == 2
    sync.copy("n1", "n2")
    newer = two.read_lease(AGENT)
    assert newer is not None and newer.version > seen.version and newer.renewals == 1
    with pytest.raises(LeaseConflict, match="merged version"):
        two.cas_lease(AGENT, seen.version, lease("n2", 2))
    # n2's own claim (version 1) adds to n1's (version 2).
    took = two.cas_lease(AGENT, newer.version, lease("n2", 2))
    assert (took.holder, took.epoch, took.version) == ("n2", 2, 3)


def test_a_takeover_at_the_next_epoch_wins_once_synced(sync: Sync) -> None:
    """n2 takes epoch 2: once synced, n1 sees it, its renewal fails, its checkpoint is Fenced."""
    one, two = sync.open("n1"), sync.open("n2")
    held = take(one, "n1", 1)
    one.put_checkpoint(AGENT, fence_of(held), 1, b"sealed-1")
    sync.copy("n1", "n2")
    take(two, "n2", 2, session="s2")
    # Before the sync, n1 still leads on its own copy.
    held = renew(one, held)
    sync.copy("n2", "n1")
    now = one.read_lease(AGENT)
    assert now is not None and (now.holder, now.epoch) == ("n2", 2)
    with pytest.raises(LeaseConflict):
        renew(one, held)
    with pytest.raises(Fenced, match="epoch 2 held by n2"):
        one.put_checkpoint(AGENT, fence_of(held), 2, b"sealed-2")
    with pytest.raises(Fenced):
        one.put_effect(AGENT, fence_of(held), 2, 0, "intent", b"e")
    assert [i.seq for i in one.list_chains(AGENT)["n1"]] == [1]


def test_a_partition_ends_with_one_winner_on_both_sides(sync: Sync) -> None:
    """Both take epoch E+1 unsynced; after the sync both see n2 win, n1's renewal fails."""
    one, two = sync.open("n1"), sync.open("n2")
    take(one, "n1", 1)
    sync.both_ways("n1", "n2")
    held_one = take(one, "n1", 2, session="a")
    held_two = take(two, "n2", 2, session="b")
    assert held_one.holder == "n1" and held_two.holder == "n2"  # each leads on its side
    one.put_checkpoint(AGENT, fence_of(held_one), 1, b"one-1")
    two.put_checkpoint(AGENT, fence_of(held_two), 1, b"two-1")
    sync.both_ways("n1", "n2")
    seen_one, seen_two = one.read_lease(AGENT), two.read_lease(AGENT)
    assert seen_one == seen_two
    assert seen_one is not None and (seen_one.holder, seen_one.epoch) == ("n2", 2)
    with pytest.raises(LeaseConflict):
        renew(one, held_one)
    with pytest.raises(Fenced):
        one.put_checkpoint(AGENT, fence_of(held_one), 2, b"one-2")
    # The winner's renewal fails once (a claim arrived), then succeeds on the record it reads.
    with pytest.raises(LeaseConflict):
        renew(two, held_two)
    renewed = renew(two, seen_two)  # type: ignore[arg-type]
    assert (renewed.holder, renewed.renewals) == ("n2", 1)
    two.put_checkpoint(AGENT, fence_of(held_two), 2, b"two-2")
    # Both chains are kept; the shared (seq 1, epoch 2) is read from n2's on both sides.
    sync.both_ways("n1", "n2")
    for store in (one, two):
        chains = store.list_chains(AGENT)
        assert {n: [i.seq for i in c] for n, c in chains.items()} == {"n1": [1], "n2": [2, 1]}
        listed = store.list_checkpoints(AGENT)
        assert [(i.seq, i.epoch) for i in listed] == [(2, 2), (1, 2)]
        assert store.read_checkpoint(AGENT, listed[1]) == b"two-1"
        assert store.read_chain_checkpoint(AGENT, "n1", chains["n1"][0]) == b"one-1"
    sync.assert_only_copies_of_others("n1")
    sync.assert_only_copies_of_others("n2")


def test_a_hand_over_is_led_without_a_write_and_confirmed_by_the_first_fenced_write(
    sync: Sync,
) -> None:
    """n1 writes n2's next term in its own claim; n2 publishes under it; n2's claim then wins."""
    one, two = sync.open("n1"), sync.open("n2")
    held = take(one, "n1", 1)
    handed = one.cas_lease(AGENT, held.version, replace(lease("n2", 2, session="s2")))
    assert (handed.holder, handed.epoch) == ("n2", 2)
    sync.copy("n1", "n2")
    seen = two.read_lease(AGENT)
    assert seen is not None and seen.holder == "n2"
    assert "n2" not in two.claims(AGENT)
    fence = Fence("n2", "s2", 2)
    two.put_checkpoint(AGENT, fence, 1, b"sealed-1")
    assert two.claims(AGENT)["n2"].holder == "n2"
    # The keeper's next renewal fails once (the merged version moved) and finds it ours.
    with pytest.raises(LeaseConflict):
        renew(two, seen)
    now = two.read_lease(AGENT)
    assert now is not None and (now.holder, now.session, now.epoch) == ("n2", "s2", 2)
    renew(two, now)
    sync.copy("n2", "n1")
    with pytest.raises(Fenced):
        one.put_checkpoint(AGENT, fence_of(held), 2, b"late")


def test_a_claim_written_for_a_node_that_is_not_this_one_does_not_let_it_write(
    sync: Sync,
) -> None:
    """A fence that is not the winning claim's is refused, whatever the own claim says."""
    one = sync.open("n1")
    take(one, "n1", 1)
    with pytest.raises(Fenced):
        one.put_checkpoint(AGENT, Fence("n1", "other-session", 1), 1, b"x")
    with pytest.raises(Fenced):
        one.put_checkpoint(AGENT, Fence("n3", "s1", 1), 1, b"x")


# -- the lease keeper, unchanged, over claims ------------------------------------------------


def _keeper(store: SyncDirStore, clock: FakeClock) -> LeaseKeeper:
    return LeaseKeeper(store, AGENT, store.node, "eu", clock=clock)


def test_keepers_on_both_sides_of_a_partition_end_with_one_leader(sync: Sync) -> None:
    """The lease keeper as every store uses it: after a partition, the loser loses, the
    winner renews on, and each side's standby judges the one winner."""
    clock = FakeClock()
    one, two = sync.open("n1"), sync.open("n2")
    k1, k2 = _keeper(one, clock), _keeper(two, clock)
    assert k1.tick().outcome is Outcome.ACQUIRED
    sync.both_ways("n1", "n2")
    assert k2.tick().outcome is Outcome.STANDBY
    # The sync is cut: n2 sees n1's claim stand still for a TTL and takes over.
    clock.advance(k2.timing.lease_ttl_s)
    assert k1.tick().outcome is Outcome.RENEWED
    took = k2.tick()
    assert took.outcome is Outcome.ACQUIRED and took.record is not None
    assert took.record.epoch == 2
    assert k1.tick().outcome is Outcome.RENEWED  # both lead, each on its side
    sync.both_ways("n1", "n2")
    lost = k1.tick()
    assert lost.outcome is Outcome.LOST
    renewed = k2.tick()
    assert renewed.outcome is Outcome.RENEWED  # the arrived claim moved the version: adopted
    assert k2.tick().outcome is Outcome.RENEWED
    sync.both_ways("n1", "n2")
    assert one.read_lease(AGENT) == two.read_lease(AGENT)
    assert k1.tick().outcome is Outcome.STANDBY  # n1 now watches n2's renewals
    with pytest.raises(Fenced):
        one.put_checkpoint(AGENT, Fence("n1", k1.session, 1), 5, b"late")
    two.put_checkpoint(AGENT, k2.fence(), 1, b"sealed-1")


def test_a_keepers_switchover_is_led_by_the_successor_on_its_own_machine(sync: Sync) -> None:
    """hand_over writes the successor's term in the leader's claim; once synced, the
    successor's keeper leads without a write, publishes, and renews into its own claim."""
    clock = FakeClock()
    one, two = sync.open("n1"), sync.open("n2")
    k1, k2 = _keeper(one, clock), _keeper(two, clock)
    assert k1.tick().outcome is Outcome.ACQUIRED
    sync.copy("n1", "n2")
    assert k2.tick().outcome is Outcome.STANDBY
    assert k1.hand_over("n2", k2.session, "eu")
    sync.copy("n1", "n2")
    adopted = k2.tick()
    assert adopted.outcome is Outcome.ACQUIRED and adopted.reason == "switchover"
    two.put_checkpoint(AGENT, k2.fence(), 1, b"sealed-1")
    assert k2.tick().outcome is Outcome.RENEWED
    sync.copy("n2", "n1")
    seen = one.read_lease(AGENT)
    assert seen is not None and (seen.holder, seen.epoch) == ("n2", 2)
    assert one.claims(AGENT)["n2"].holder == "n2"


# -- chains, heartbeats, events -----------------------------------------------------------


def test_heartbeats_and_events_are_read_from_every_node(sync: Sync) -> None:
    """Each node writes its own; every node reads all of them, each node's log in order."""
    one, two = sync.open("n1"), sync.open("n2")
    one.put_heartbeat(AGENT, heartbeat("n1"))
    two.put_heartbeat(AGENT, heartbeat("n2"))
    for n in (1, 2, 3):
        one.append_event(AGENT, event("n1", n))
    two.append_event(AGENT, event("n2", 1))
    sync.both_ways("n1", "n2")
    for store in (one, two):
        assert [b.node for b in store.list_heartbeats(AGENT)] == ["n1", "n2"]
        got = [(e.node, e.n) for e in store.read_events(AGENT, {"n1": 1})]
        assert got == [("n1", 2), ("n1", 3), ("n2", 1)]
        assert store.list_agents() == [AGENT]
        read = store.tail(AGENT).read()
        assert len(read.events) == 4 and len(read.heartbeats) == 2
    two.remove_heartbeat(AGENT, "n2")
    sync.copy("n2", "n1")
    assert [b.node for b in one.list_heartbeats(AGENT)] == ["n1"]
    # A copy of n2's records in n1's subtree does not count: n2 has a subtree of its own.
    one.put_heartbeat(AGENT, heartbeat("n2"))
    assert [b.node for b in one.list_heartbeats(AGENT)] == ["n1"]
    sync.assert_only_copies_of_others("n1")


def test_heartbeats_merged_from_every_subtree_keep_to_the_bound_of_one_read(sync: Sync) -> None:
    """Heartbeats in two subtrees, each within the bound, more than it together: the merged
    read returns those of the lowest node ids, as many as the bound."""
    one = sync.open("n1")
    nodes = [f"x{number:04d}" for number in range(HEARTBEATS_READ.count + 3)]
    for subtree, held in (("n6", nodes[: HEARTBEATS_READ.count]), ("n7", nodes[-3:])):
        raw = raw_subtree(sync.root("n1"), subtree)
        for node in held:
            raw.put_heartbeat(AGENT, node, heartbeat(node).to_json())
        raw.close()
    assert [beat.node for beat in one.list_heartbeats(AGENT)] == nodes[: HEARTBEATS_READ.count]


def test_forgetting_another_nodes_subtree_is_refused(sync: Sync) -> None:
    """hb forget of a node with its own subtree would delete its files: refused."""
    one, two = sync.open("n1"), sync.open("n2")
    two.put_heartbeat(AGENT, heartbeat("n2"))
    sync.copy("n2", "n1")
    with pytest.raises(StoreError, match="subtree"):
        one.forget_node(AGENT, "n2")
    assert [b.node for b in one.list_heartbeats(AGENT)] == ["n2"]
    one.put_heartbeat(AGENT, heartbeat("n1"))
    one.forget_node(AGENT, "n1")
    assert [b.node for b in one.list_heartbeats(AGENT)] == ["n2"]


# -- the cluster record and rotation ---------------------------------------------------------


def test_the_cluster_record_is_created_once_and_brought_by_the_sync(sync: Sync) -> None:
    """The first node creates it; a node that sees another node's records but no cluster
    record waits for it (never creates a second one), and has it once the sync brings it."""
    one = sync.open("n1")
    assert one.create_cluster(cluster(1)) == cluster(1)
    assert one.create_cluster(cluster(2)) == cluster(1)
    one.put_heartbeat(AGENT, heartbeat("n1"))
    two = sync.open("n2")
    sync.copy("n1", "n2")
    (sync.root("n2") / "cluster.json").unlink()  # the subtree came first, the record not yet
    with pytest.raises(StoreUnavailable, match=r"holds the records of node n1 .* waiting for"):
        two.create_cluster(cluster(2))
    assert not (sync.root("n2") / "cluster.json").exists()
    assert not (sync.root("n2") / "nodes" / "n2" / ANNOUNCEMENT).exists()
    sync.copy("n1", "n2")
    assert two.read_cluster() == cluster(1)
    assert two.create_cluster(cluster(2)) == cluster(1)


def settle(stores: dict[str, SyncDirStore], records: dict[str, ClusterRecord]) -> dict[str, str]:
    """Each store's create_cluster tried until it answers (as a node's start does); the
    last message each one waited with, by node."""
    waited: dict[str, str] = {}
    answered: dict[str, ClusterRecord] = {}

    def all_answered() -> bool:
        for node, store in stores.items():
            if node not in answered:
                try:
                    answered[node] = store.create_cluster(records[node])
                except StoreUnavailable as exc:
                    waited[node] = str(exc)
        return len(answered) == len(stores)

    wait_until(all_answered, "every first start to settle", WAIT_S)
    return waited


def test_two_first_starts_at_once_make_one_cluster_record(sync: Sync) -> None:
    """Two nodes that may create the store start at the same moment on empty folders: both
    announce before either sees the other; after twice the sync delay n1 (first by id)
    creates the record, n2 waits for it to sync in, saying so. No conflict copy."""
    stores = {node: sync.open(node, first_start_wait_ms=300) for node in ("n2", "n1")}
    for store in stores.values():  # neither sees the other yet: both announce
        with pytest.raises(StoreUnavailable, match="announced it may create one"):
            store.create_cluster(cluster(1))
    with SyncPump(sync, "n1", "n2"):
        waited = settle(stores, {"n1": cluster(1), "n2": cluster(2)})
    assert "node n1 creates it" in waited["n2"]
    for node in ("n1", "n2"):
        assert stores[node].read_cluster() == cluster(1)
        assert stores[node].sync_files() == []
        assert (sync.root(node) / "nodes" / node / ANNOUNCEMENT).is_file()


def test_a_node_that_sees_an_announcement_first_stays_out_and_waits(sync: Sync) -> None:
    """n2 announced and its announcement reached n1's folder: n1, though first by id, does
    not announce, and waits for n2's record (else n2, deciding without n1, and n1 would
    both create one)."""
    two = sync.open("n2", first_start_wait_ms=0)
    one = sync.open("n1", first_start_wait_ms=0)
    assert two.create_cluster(cluster(2)) == cluster(2)
    (sync.root("n2") / "cluster.json").rename(sync.root("n2") / "later.json")
    sync.copy("n2", "n1")  # the announcement, not yet the record
    with pytest.raises(StoreUnavailable, match="node n2 creates it"):
        one.create_cluster(cluster(1))
    assert not (sync.root("n1") / "nodes" / "n1" / ANNOUNCEMENT).exists()
    assert not (sync.root("n1") / "cluster.json").exists()
    (sync.root("n2") / "later.json").rename(sync.root("n2") / "cluster.json")
    sync.copy("n2", "n1")
    assert one.create_cluster(cluster(1)) == cluster(2)


@pytest.mark.parametrize("announced", [False, True])
def test_what_a_failed_first_start_left_never_stops_the_next(sync: Sync, announced: bool) -> None:
    """The issue's folder: two first starts that failed left their empty subtrees (and their
    announcements, if they got that far) in both folders. Started again, as new processes,
    they settle on one record: an empty subtree is no cluster, an own announcement no
    obstacle."""
    for node in ("n1", "n2"):
        store = sync.open(node, first_start_wait_ms=60_000)
        if announced:
            with pytest.raises(StoreUnavailable, match=r"waits (60\.0|59\.9) s more"):
                store.create_cluster(cluster(1))
        store.close()
    sync.both_ways("n1", "n2")
    assert (sync.root("n1") / "nodes" / "n2").is_dir()
    assert (sync.root("n2") / "nodes" / "n1").is_dir()
    stores = {node: sync.open(node, first_start_wait_ms=200) for node in ("n1", "n2")}
    with SyncPump(sync, "n1", "n2"):
        settle(stores, {"n1": cluster(1), "n2": cluster(2)})
    assert [store.read_cluster() for store in stores.values()] == [cluster(1)] * 2
    assert [store.sync_files() for store in stores.values()] == [[], []]


def test_a_planted_announcement_only_delays_the_first_start(sync: Sync) -> None:
    """An announcement written without the secret under an id that sorts first: the node
    waits for that node, naming the file to remove, and creates nothing; removed, the
    first start goes on."""
    one = sync.open("n1", first_start_wait_ms=0)
    planted = sync.root("n1") / "nodes" / "a0" / ANNOUNCEMENT
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"anything")
    for _ in range(2):
        with pytest.raises(StoreUnavailable, match=r"node a0 creates it.*remove nodes/a0/first"):
            one.create_cluster(cluster(1))
    assert one.read_cluster() is None
    planted.unlink()
    assert one.create_cluster(cluster(1)) == cluster(1)


def test_two_cluster_records_leave_a_conflict_copy_that_stops_every_node(sync: Sync) -> None:
    """Two first starts on unsynced folders: the conflict copy is named, nothing starts."""
    one, two = sync.open("n1"), sync.open("n2")
    one.create_cluster(cluster(1))
    two.create_cluster(cluster(2))
    sync.copy("n1", "n2")
    with pytest.raises(StoreError, match=r"cluster\.sync-conflict-20260101-n1\.json"):
        two.read_cluster()
    with pytest.raises(StoreError, match="sync-conflict copy of the cluster record"):
        two.create_cluster(cluster(3))
    assert "cluster.sync-conflict-20260101-n1.json" in two.sync_files()


def test_rotation_is_refused_with_the_reason(sync: Sync) -> None:
    """Replacing the cluster record and every re-seal rewrite shared records: refused."""
    store = sync.open("n1")
    store.create_cluster(cluster(1))
    info = CheckpointInfo(epoch=1, seq=1, size=1, written=0.0)
    refused: list[Callable[[], object]] = [
        lambda: store.replace_cluster(cluster(1), cluster(2)),
        lambda: store.reseal_checkpoint(AGENT, info, b"a", b"b"),
        lambda: store.reseal_submission(AGENT, 1, b"a", b"b"),
        lambda: store.reseal_effect(AGENT, 1, 0, "intent", b"a", b"b"),
        lambda: store.reseal_reply(AGENT, 1, b"a", b"b"),
    ]
    for call in refused:
        with pytest.raises(StoreError, match="refused on a syncdir store: key rotation rewrites"):
            call()
    assert store.read_cluster() == cluster(1)
    assert store.report().refuses == {
        Refusal.KEY_ROTATION,
        Refusal.FORGET_OTHER_NODE,
        Refusal.FORGET_AGENT,
    }


# -- what the sync tool leaves, and what a hostile writer plants -------------------------------


def test_sync_tool_files_are_never_nodes_or_claims_and_are_reported(sync: Sync) -> None:
    """Conflict copies, sync temp files and markers are passed over and listed by sync_files."""
    one, two = sync.open("n1"), sync.open("n2")
    take(one, "n1", 1)
    sync.copy("n1", "n2")
    root = sync.root("n2")
    claim = f"claim.{99:020d}"
    planted = {
        ".stversions": "dir",
        "nodes/n1/published/a/.stfolder": "dir",  # (at the root: test_a_syncthing_folder_...)
        "nodes/n9.sync-conflict-20260101-120000-ABCDEFG": "dir",
        "nodes/~syncthing~n8.tmp": "dir",
        "nodes/n1/kv/agents/a/lease.sync-conflict-20260101-120000-ABCDEFG": "claim",
        "nodes/n1/kv/agents/a/lease (conflicted copy 2026-01-01)": "claim",
        "nodes/n1/kv/agents/a/.syncthing.lease.tmp": "claim",
        f"nodes/n1/published/a/{claim}.sync-conflict-20260101-120000-ABCDEFG.json": "claim",
        f"nodes/n1/published/a/{claim} (conflicted copy 2026-01-01).json": "claim",
        f"nodes/n1/published/a/.syncthing.{claim}.json.tmp": "claim",
    }
    for rel, kind in planted.items():
        path = root / rel
        if kind == "dir":
            path.mkdir()
            (path / "kv").mkdir()  # as a subtree would hold
        else:
            path.write_bytes(replace(lease("n9", 99), version=99).to_json())
    seen = two.read_lease(AGENT)
    assert seen is not None and (seen.holder, seen.epoch) == ("n1", 1)
    assert sorted(two.subtrees()) == ["n1", "n2"]
    assert set(two.sync_files()) == set(planted)
    assert claim_path(root, "n1").is_file()


def test_a_syncthing_folder_marker_at_the_root_is_passed_over(sync: Sync) -> None:
    """Syncthing's .stfolder at the root of the synced folder keeps no node from opening."""
    sync.root("n1").mkdir()
    (sync.root("n1") / ".stfolder").mkdir()
    one = sync.open("n1")
    assert one.sync_files() == [".stfolder"]


def test_a_plain_file_store_in_a_syncdir_folder_is_refused(sync: Sync) -> None:
    """A file:// store in or under a syncdir folder would take claims for the lease: refused,
    naming the URL to use instead."""
    sync.open("n1")
    for inside in (sync.root("n1"), sync.root("n1") / "nodes" / "n1"):
        with pytest.raises(StoreUnsafe, match="open it as syncdir://"):
            FileStore(inside)


def test_retention_in_a_subtree_spares_the_checkpoints_of_another_epoch(sync: Sync) -> None:
    """What an earlier term of this node left may be a branch kept aside: only the newest
    checkpoints of the epoch being published are pruned."""
    one = sync.open("n1")
    first = take(one, "n1", 1)
    for seq in range(1, 9):
        one.put_checkpoint(AGENT, fence_of(first), seq, b"first term")
    # Another node's term 2 (synced in), then this node leads again at 3 from seq 2.
    second = one.cas_lease(AGENT, one.read_lease(AGENT).version, replace(first, epoch=3))
    for seq in range(3, 12):
        one.put_checkpoint(AGENT, fence_of(second), seq, b"third term")
    kept = {(info.epoch, info.seq) for info in one.list_chains(AGENT)["n1"]}
    assert {(1, seq) for seq in range(4, 9)} <= kept  # epoch 1's newest five, all still there
    assert {(3, seq) for seq in range(3, 12)} & kept == {(3, seq) for seq in range(7, 12)}


@pytest.mark.parametrize("what", ["garbage", "huge", "devzero", "fifo", "directory", "deep"])
def test_a_hostile_claim_is_skipped_and_reported(
    sync: Sync, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim that is junk, huge, a link, a FIFO or a directory is left out, quickly; one
    that is read (junk, huge) is reported. (The file backend reads no value from a link, a
    FIFO or a directory: tests/stores/backend/test_file_backend.py.)"""
    one = sync.open("n1")
    held = take(one, "n1", 1)
    claim = claim_path(sync.root("n1"), "n6")
    claim.parent.mkdir(parents=True)
    if what == "garbage":
        claim.write_bytes(b"\x00{not json")
    elif what == "huge":
        with open(claim, "wb") as f:
            f.truncate(1 << 30)  # sparse: a GiB that must not be read
    elif what == "devzero":
        claim.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(claim)
    elif what == "directory":
        claim.mkdir()
    else:
        claim.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    seen = one.read_lease(AGENT)
    renewed = renew(one, held)
    assert time.monotonic() - started < 5
    assert seen is not None and seen.holder == "n1"
    assert renewed.renewals == 1
    reported = any("claim on a of node n6 skipped" in p for p in one.problems())
    assert reported == (what in ("garbage", "huge", "deep"))
    one.put_checkpoint(AGENT, fence_of(renewed), 1, b"sealed-1")


def _plant_claim(claim: Path, what: str) -> None:
    """Junk of kind what in place of the claim file claim."""
    claim.unlink(missing_ok=True)
    if what == "ttl-1e400":
        claim.write_bytes(
            b'{"holder":"n1","region":"eu","session":"s1","epoch":1,"ttl_ms":1'
            + b"0" * 400 + b',"renewals":1,"version":1}'
        )  # fmt: skip
    elif what == "huge":
        with open(claim, "wb") as f:
            f.truncate(1 << 30)  # sparse: a GiB that must not be read
    elif what == "devzero":
        claim.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(claim)
    else:
        claim.mkdir()  # an empty directory: a rename cannot replace it as it stands


@pytest.mark.parametrize("what", ["ttl-1e400", "huge", "devzero", "fifo", "directory"])
def test_junk_in_the_own_claim_is_replaced_by_the_next_write_of_it(sync: Sync, what: str) -> None:
    """Junk in this node's own claim file does not stop it for good: its next renewal writes
    its claim in place of the junk, and the fenced writes of that term go on."""
    one = sync.open("n1")
    held = take(one, "n1", 1)
    claim = claim_path(sync.root("n1"), "n1")
    assert one.read_lease(AGENT) == held
    _plant_claim(claim, what)
    assert one.read_lease(AGENT) == held  # skipped: the claim as last read
    renewed = renew(one, held)
    assert sync.open("n1").read_lease(AGENT) == renewed  # read from the claim file
    one.put_checkpoint(AGENT, fence_of(renewed), 1, b"sealed-1")
    later = sync.open("n1")  # a process that never read the claim before the junk
    _plant_claim(claim, what)
    taken = take(later, "n1", 2, session="s2")
    assert later.read_lease(AGENT) == taken
    with pytest.raises(Fenced):
        later.put_checkpoint(AGENT, fence_of(renewed), 2, b"stale write")
    later.put_checkpoint(AGENT, fence_of(taken), 2, b"sealed-2")


def test_junk_under_nodes_is_no_node(sync: Sync) -> None:
    """A name that is no node id, a symlink, or a file under nodes/ is skipped and reported."""
    one = sync.open("n1")
    take(one, "n1", 1)
    other = sync.base / "elsewhere"
    other.mkdir()
    nodes = sync.root("n1") / "nodes"
    (nodes / "-bad").mkdir()
    (nodes / "linked").symlink_to(other)
    (nodes / "afile").write_bytes(b"x")
    assert sorted(one.subtrees()) == ["n1"]
    problems = one.problems()
    assert any("-bad is not named by a node id" in p for p in problems)
    assert any("linked is not a directory" in p for p in problems)
    assert one.read_lease(AGENT) is not None
    assert list(other.iterdir()) == []


def test_a_peers_symlinked_agent_directory_is_not_followed(sync: Sync) -> None:
    """nodes/n6/kv/agents/a and nodes/n6/published/a as symlinks to a directory with a
    winning claim are not read; the published one is reported."""
    one = sync.open("n1")
    take(one, "n1", 1)
    decoy = sync.base / "decoy"
    decoy.mkdir()
    winning = replace(lease("n6", 50), version=1).to_json()
    (decoy / "lease").write_bytes(winning)
    (decoy / f"claim.{1:020d}.json").write_bytes(winning)
    agents = claim_path(sync.root("n1"), "n6").parent.parent
    agents.mkdir(parents=True)
    (agents / AGENT).symlink_to(decoy)
    published(sync.root("n1"), "n6").parent.mkdir(parents=True)
    published(sync.root("n1"), "n6").symlink_to(decoy)
    seen = one.read_lease(AGENT)
    assert seen is not None and seen.holder == "n1"
    assert one.problems()


# -- the watch -----------------------------------------------------------------------------


class _SyncedWriter:
    """Writes n2's claim on n2's machine, then syncs it to n1's: what next_wake drives."""

    def __init__(self, sync: Sync, store: SyncDirStore) -> None:
        self.sync, self.store = sync, store

    def step(self) -> None:
        take(self.store, "n2", 1 + self.store.claims(AGENT).get("n2", lease("n2", 0)).epoch)
        self.sync.copy("n2", "n1")


async def _wake(watcher: AsyncIterator[None], writer: _SyncedWriter) -> None:
    """Wait (bounded) for watcher to yield while writer keeps changing n2's claim."""
    loop = asyncio.get_running_loop()
    woke = asyncio.ensure_future(anext(watcher))
    deadline = loop.time() + WAIT_S
    try:
        while not woke.done():
            assert loop.time() < deadline, f"the watch did not yield within {WAIT_S} s"
            await asyncio.to_thread(writer.step)
            await asyncio.wait({woke}, timeout=0.25)
        woke.result()
    finally:
        woke.cancel()
        await asyncio.gather(woke, return_exceptions=True)


@pytest.mark.parametrize("lease_only", [False, True])
def test_the_watch_wakes_when_another_nodes_claim_changes(sync: Sync, lease_only: bool) -> None:
    """A watch on n1's folder wakes for n2's claim, also when n2's subtree arrives later."""
    one, two = sync.open("n1"), sync.open("n2")
    take(one, "n1", 1)
    writer = _SyncedWriter(sync, two)

    async def main() -> None:
        watcher = one.watch(AGENT, lease_only=lease_only)
        try:
            await _wake(watcher, writer)  # n2's subtree arrives
            await _wake(watcher, writer)  # and its claim changes
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_the_watch_of_a_subtree_that_arrives_with_a_claim_wakes_without_further_changes(
    sync: Sync,
) -> None:
    """A node whose subtree the sync brings with its claim already in it is a change."""
    one, two = sync.open("n1"), sync.open("n2")
    take(two, "n2", 1)

    async def main() -> None:
        watcher = one.watch(AGENT, lease_only=True, terms_only=True)
        try:
            woke = asyncio.ensure_future(anext(watcher))
            await asyncio.sleep(0.3)  # the watch is set up before the subtree arrives
            await asyncio.to_thread(sync.copy, "n2", "n1")
            await asyncio.wait_for(woke, WAIT_S)
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_published_claim_wakes_a_lease_watch_of_its_directory(tmp_path: Path) -> None:
    """Publishing a claim alone (no lease record written) wakes an inotify lease watch of the
    agent's published folder: on one folder shared by two nodes (a host running both), a
    standby woken only by the lease record would read the claim before it is published and
    take a released lease a tick late (found by tests/system/test_systemd_syncdir.py). A
    claim linked into place makes no event the watch asks for; renamed, it does."""
    agent_dir = published(tmp_path, "n1")
    publisher = ClaimPublisher(tmp_path, "n1", keep_s=3600)
    publisher.publish(AGENT, replace(lease("n1", 1), version=1))  # makes the directory

    async def main() -> None:
        watch = open_lease_watch(agent_dir, is_claim_name)
        assert watch is not None, "no inotify here"
        try:
            await asyncio.to_thread(publisher.publish, AGENT, replace(lease("n1", 1), version=2))
            await asyncio.wait_for(watch.woken.wait(), WAIT_S)
            assert watch.changed
        finally:
            watch.close()

    asyncio.run(main())


# -- the store contract's basics with one node ------------------------------------------------


def test_one_node_is_a_store(sync: Sync) -> None:
    """With one node the store behaves as the protocol says (the contract suite, in short)."""
    store: Store = sync.open("n1")
    assert isinstance(store, Store)
    held = store.cas_lease(AGENT, None, lease("n1", 1))
    with pytest.raises(LeaseConflict):
        store.cas_lease(AGENT, None, lease("n1", 1))
    store.put_checkpoint(AGENT, fence_of(held), 1, b"sealed-1")
    store.put_effect(AGENT, fence_of(held), 2, 0, "intent", b"intent")
    assert store.read_effects(AGENT, 2) == {(0, "intent"): b"intent"}
    assert store.admit(AGENT, "r1", 1, b"req") == (1, False)
    assert store.read_inbox(AGENT) == [(1, b"req")]
    restore = store.read_for_restore(AGENT)
    assert restore.newest == b"sealed-1" and restore.infos[0].seq == 1
    store.put_acceptance(AGENT, b"accepted")
    assert store.read_acceptance(AGENT) == b"accepted"
    store.check()
    with pytest.raises(StoreError, match="gone"):
        store.read_checkpoint(AGENT, CheckpointInfo(epoch=1, seq=9, size=1, written=0.0))


# -- term records ---------------------------------------------------------------------


def test_a_term_record_is_written_once_and_read_by_every_node_from_its_place(
    sync: Sync,
) -> None:
    """put_term_start writes the own subtree once (the same bytes again are a no-op);
    every node reads each record as (epoch, node) of the subtree and file it is in."""
    one, two = sync.open("n1"), sync.open("n2")
    assert one.chains is one
    one.put_term_start(AGENT, 3, b"record-3")
    one.put_term_start(AGENT, 3, b"record-3")  # a retry whose answer was lost
    with pytest.raises(StoreError, match="never rewritten"):
        one.put_term_start(AGENT, 3, b"other")
    with pytest.raises(StoreError, match="over the limit"):
        one.put_term_start(AGENT, 4, b"x" * (MAX_TERM_RECORD_BYTES + 1))
    with pytest.raises(StoreError, match="outside"):
        one.put_term_start(AGENT, 0, b"x")
    two.put_term_start(AGENT, 5, b"record-5")
    assert two.read_term_starts(AGENT) == {(5, "n2"): b"record-5"}
    sync.both_ways("n1", "n2")
    both = {(3, "n1"): b"record-3", (5, "n2"): b"record-5"}
    assert one.read_term_starts(AGENT) == both
    assert two.read_term_starts(AGENT) == both
    sync.assert_only_copies_of_others("n2")
    reader = SyncDirStore(sync.root("n1"), "monitor", sync_delay_ms=DELAY_MS, create=False)
    assert reader.read_term_starts(AGENT) == both
    with pytest.raises(StoreError, match="opened to read"):
        reader.put_term_start(AGENT, 6, b"record-6")


@pytest.mark.parametrize("what", ["huge", "devzero", "fifo", "directory", "digits", "zero"])
def test_a_hostile_term_record_is_skipped_and_reported(sync: Sync, what: str) -> None:
    """A term record that is huge, a link, a FIFO, a directory or named with numbers we
    never write is left out and reported; the others are read."""
    one = sync.open("n1")
    one.put_term_start(AGENT, 2, b"record-2")
    terms = published(sync.root("n1"), "n6") / "terms"
    terms.mkdir(parents=True)
    (terms / "0000000001.rec").write_bytes(b"good")
    bad = terms / "0000000007.rec"
    if what == "huge":
        with open(bad, "wb") as f:
            f.truncate(1 << 30)
    elif what == "devzero":
        bad.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(bad)
    elif what == "directory":
        bad.mkdir()
    elif what == "digits":
        (terms / "07.rec").write_bytes(b"short name")
    else:
        (terms / "0000000000.rec").write_bytes(b"epoch zero")
    (terms / "0000000009.rec.sync-conflict-20260101-n6").write_bytes(b"a sync copy")
    started = time.monotonic()
    found = one.read_term_starts(AGENT)
    assert time.monotonic() - started < 5
    assert found == {(2, "n1"): b"record-2", (1, "n6"): b"good"}
    assert any("term record" in problem for problem in one.problems())


def test_a_read_of_term_records_keeps_to_its_bound(sync: Sync) -> None:
    """More term records than a read takes, the newest a byte over the bound of one: the
    newest as many as the bound are looked at, the one over is left out, the rest read.

    Held before the records were read through ``BoundedRead`` (the newest MAX_TERMS_READ,
    each capped): this guards a regression."""
    one = sync.open("n1")
    terms = published(sync.root("n1"), "n6") / "terms"
    terms.mkdir(parents=True)
    newest = TERM_RECORDS_READ.count + 3
    for epoch in range(1, newest):
        (terms / f"{epoch:010d}.rec").write_bytes(b"r%d" % epoch)
    (terms / f"{newest - 1:010d}.rec").write_bytes(b"f" * TERM_RECORDS_READ.entry_bytes)
    (terms / f"{newest:010d}.rec").write_bytes(b"o" * (TERM_RECORDS_READ.entry_bytes + 1))
    found = one.read_term_starts(AGENT)
    assert sorted(epoch for epoch, _node in found) == list(range(4, newest))
    assert found[(newest - 1, "n6")] == b"f" * TERM_RECORDS_READ.entry_bytes
    assert sum(len(data) for data in found.values()) <= TERM_RECORDS_READ.total_bytes


def test_a_chain_choice_is_written_once_apart_from_term_records_and_read_by_every_node(
    sync: Sync,
) -> None:
    """put_chain_choice writes the own subtree once per winning term, beside (never as) a
    term record of the same epoch; every node reads each from its place; junk is skipped."""
    one, two = sync.open("n1"), sync.open("n2")
    one.put_term_start(AGENT, 3, b"record-3")
    one.put_chain_choice(AGENT, 3, b"choice-3")
    one.put_chain_choice(AGENT, 3, b"choice-3")
    with pytest.raises(StoreError, match="never rewritten"):
        one.put_chain_choice(AGENT, 3, b"another choice")
    sync.both_ways("n1", "n2")
    assert two.read_chain_choices(AGENT) == {(3, "n1"): b"choice-3"}
    assert two.read_term_starts(AGENT) == {(3, "n1"): b"record-3"}
    choices = published(sync.root("n2"), "n6") / "choices"
    choices.mkdir(parents=True)
    (choices / "0000000004.rec").symlink_to("/dev/zero")
    (choices / "4.rec").write_bytes(b"short name")
    assert two.read_chain_choices(AGENT) == {(3, "n1"): b"choice-3"}
    assert any("chain choice" in problem for problem in two.problems())
    reader = SyncDirStore(sync.root("n1"), "monitor", sync_delay_ms=DELAY_MS, create=False)
    with pytest.raises(StoreError, match="opened to read"):
        reader.put_chain_choice(AGENT, 6, b"choice")


def test_a_folder_whose_marker_has_not_synced_yet_opens(sync: Sync) -> None:
    """The sync tool brought the cluster record and a node's subtree before the marker: the
    folder is a syncdir store still syncing, not a file store (found by Syncthing)."""
    one = sync.open("n1")
    one.create_cluster(cluster(1))
    take(one, "n1", 1)
    sync.copy("n1", "n2")
    (sync.root("n2") / MARKER).unlink()
    assert (sync.root("n2") / "cluster.json").is_file()
    reading = SyncDirStore(sync.root("n2"), "reader", sync_delay_ms=100, create=False)
    assert reading.read_lease(AGENT) is not None
    assert not (sync.root("n2") / MARKER).exists()  # a reader writes nothing
    sync.open("n2")
    assert (sync.root("n2") / MARKER).read_bytes() == (sync.root("n1") / MARKER).read_bytes()


def test_hb_accept_loss_refuses_a_syncdir_store_with_a_reason(sync: Sync) -> None:
    """A loss there is a chain kept aside, not a store gone back: accept-loss, which writes one
    lease record and trusts one list of checkpoints, says so rather than misjudge it."""
    from hamsterbunker.core.errors import HamsterbunkerError
    from hamsterbunker.lease.acceptance import plan_loss

    one = sync.open("n1")
    with pytest.raises(HamsterbunkerError, match="does not work on a syncdir store"):
        plan_loss(one, None, AGENT, None)  # type: ignore[arg-type]  # refused before it is used


def test_a_claim_that_goes_missing_for_a_moment_is_kept_as_last_read(sync: Sync) -> None:
    """Under Syncthing a standby once read no claim at all and took a live leader's lease as
    free: a claim once seen stays as last read until a new reading replaces it."""
    one = sync.open("n1")
    one.create_cluster(cluster(1))
    held = take(one, "n1", 1)
    sync.copy("n1", "n2")
    two = sync.open("n2")
    seen = two.read_lease(AGENT)
    assert seen is not None and seen.holder == "n1"
    claim = claim_path(sync.root("n2"), "n1")
    claims = list(published(sync.root("n2"), "n1").glob("claim.*.json"))
    assert claims
    for path in [claim, *claims]:
        path.unlink()  # gone for a moment (or removed by someone without the secret)
    assert two.read_lease(AGENT) == seen  # the same record, the same version: no change
    claim.write_bytes(b"{torn")
    claims[0].write_bytes(b"{torn")
    assert two.read_lease(AGENT) == seen
    renew(one, held)
    sync.copy("n1", "n2")
    renewed = two.read_lease(AGENT)
    assert renewed is not None and renewed.version > seen.version


# -- published claims: a new file per claim, for the sync tool ----------------------------


def claim_files(sync: Sync, folder: str, node: str) -> list[str]:
    return sorted(path.name for path in published(sync.root(folder), node).glob("claim.*.json"))


def test_each_claim_is_published_once_and_others_read_the_newest_not_the_lease_record(
    sync: Sync,
) -> None:
    """Every claim written is also created as claim.VERSION.json, never rewritten; another
    node reads the newest of those, even when the lease record its sync brought is older (a
    file rewritten every tick is what Syncthing brings last)."""
    one = sync.open("n1")
    one.create_cluster(cluster(1))
    held = take(one, "n1", 1)
    renewed = renew(one, renew(one, held))
    own = one.claims(AGENT)["n1"]
    assert claim_files(sync, "n1", "n1") == [f"claim.{v:020d}.json" for v in (1, 2, 3)]
    sync.held_back.add("kv/agents/a/lease")  # the claims sync, the lease record lags behind
    sync.copy("n1", "n2")
    two = sync.open("n2")
    assert two.claims(AGENT)["n1"] == own == replace(renewed, version=3)
    stale = claim_path(sync.root("n2"), "n1")
    assert not stale.exists()
    sync.held_back.clear()
    sync.copy("n1", "n2")
    stale.write_bytes(replace(held, version=1).to_json())  # an older lease record: not read
    assert two.read_lease(AGENT) == one.read_lease(AGENT)


def test_a_node_that_published_no_claim_is_read_from_its_lease_record(sync: Sync) -> None:
    """A subtree with a lease record and no published claim (a crash cut the publish off)
    is read from its lease record."""
    one = sync.open("n1")
    take(one, "n1", 1)
    for path in published(sync.root("n1"), "n1").glob("claim.*.json"):
        path.unlink()
    sync.copy("n1", "n2")
    assert sync.open("n2").claims(AGENT)["n1"].holder == "n1"


def test_published_claims_are_removed_once_synced_and_never_above_the_one_written(
    tmp_path: Path,
) -> None:
    """The publisher keeps the newest two and its own younger than keep_s; an earlier
    process's are removed at its first publish; claims above the version written (a
    lease record that went back) are removed at once."""
    root = tmp_path / "folder"
    root.mkdir()
    agent_dir = published(root, "n1")

    def names() -> list[int]:
        return sorted(int(path.name[6:26]) for path in agent_dir.glob("claim.*.json"))

    slow = ClaimPublisher(root, "n1", keep_s=3600)
    for version in range(1, 6):
        slow.publish(AGENT, replace(lease("n1", 1), version=version))
    assert names() == [1, 2, 3, 4, 5]  # all still young: kept to sync
    slow.publish(AGENT, replace(lease("n1", 1), version=5))  # the same again: a no-op
    with pytest.raises(StoreError, match="went back"):
        slow.publish(AGENT, replace(lease("n1", 2), version=5))
    quick = ClaimPublisher(root, "n1", keep_s=0)
    quick.publish(AGENT, replace(lease("n1", 1), version=6))
    assert names() == [5, 6]  # an earlier process's: gone but the newest two
    quick.publish(AGENT, replace(lease("n1", 1), version=7))
    assert names() == [6, 7]
    quick.publish(AGENT, replace(lease("n1", 1), version=2))  # the lease record went back
    assert names() == [2]


@pytest.mark.parametrize("what", ["garbage", "devzero", "fifo", "directory", "version", "copy"])
def test_a_hostile_published_claim_is_skipped_and_the_next_older_read(
    sync: Sync, what: str
) -> None:
    """A newest published claim that is junk, a link, a FIFO, a directory, holds another
    version than its name, or is a sync tool's copy is passed over, quickly, and reported;
    the next older one is read."""
    one = sync.open("n1")
    one.create_cluster(cluster(1))
    renew(one, take(one, "n1", 1))
    sync.copy("n1", "n2")
    two = sync.open("n2")
    expected = two.claims(AGENT)["n1"]
    agent_dir = published(sync.root("n2"), "n1")
    bad = agent_dir / f"claim.{99:020d}.json"
    if what == "garbage":
        bad.write_bytes(b"\x00{not json")
    elif what == "devzero":
        bad.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(bad)
    elif what == "directory":
        bad.mkdir()
    elif what == "version":
        bad.write_bytes(replace(lease("n6", 50), version=7).to_json())
    else:
        bad = agent_dir / f"claim.{99:020d}.sync-conflict-20260101-n6.json"
        bad.write_bytes(replace(lease("n6", 50), version=99).to_json())
    started = time.monotonic()
    fresh = SyncDirStore(sync.root("n2"), "n2", sync_delay_ms=DELAY_MS)  # nothing seen before
    assert fresh.claims(AGENT)["n1"] == expected
    assert time.monotonic() - started < 5
    if what != "copy":
        assert any("claim" in problem for problem in fresh.problems())


def test_a_claim_whose_publish_a_crash_cut_off_is_published_at_the_next_start(
    sync: Sync,
) -> None:
    """A node wrote its claim (its lease record) and died before publishing it: the next process
    of that node publishes it at its first reading, so the other machines see the claim
    the node itself goes by."""
    one = sync.open("n1")
    renew(one, take(one, "n1", 1))
    newest = one.claims(AGENT)["n1"]
    agent_dir = published(sync.root("n1"), "n1")
    (agent_dir / f"claim.{newest.version:020d}.json").unlink()  # the publish never happened
    sync.copy("n1", "n2")
    stale = SyncDirStore(sync.root("n2"), "n2", sync_delay_ms=DELAY_MS).claims(AGENT)["n1"]
    assert stale.version == newest.version - 1
    again = sync.open("n1")  # the node's next process
    assert again.claims(AGENT)["n1"] == newest
    sync.copy("n1", "n2")
    assert SyncDirStore(sync.root("n2"), "n2", sync_delay_ms=DELAY_MS).claims(AGENT)["n1"] == newest


def test_a_read_of_the_inbox_stops_at_its_byte_total(sync: Sync) -> None:
    """A node's own inbox, filled past the byte total of a read, is read within
    read_bounds.INBOX_READ, and the next read goes on from the last number taken."""
    store = sync.open("n1")
    size = INBOX_READ.entry_bytes
    fitting = INBOX_READ.total_bytes // size
    plant_submissions(store, AGENT, [(n, b"s" * size) for n in range(1, fitting + 2)])
    assert [n for n, _blob in store.read_inbox(AGENT)] == list(range(1, fitting + 1))
    assert [n for n, _blob in store.read_inbox(AGENT, after=fitting)] == [fitting + 1]
