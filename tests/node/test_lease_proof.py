"""The lease record's proof: epochs and reach are learned only from records that authenticate.

A lease record's epoch and reach outlive it (a node remembers them and refuses
to resume behind that reach or to take an epoch below that epoch), so one
written without the secret must teach a node nothing: else one write of a
reach of 10^9 or an epoch of 9,999,999,999 stops every node for good. The
keeper-level tests use an injected clock; the last ones run real node
runtimes on every backend (file, Redis, etcd) with the lease record written
raw, as such a writer would.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.limits import MAX_EPOCH, MAX_LEASE_TTL_MS
from hamsterbunker.core.reach import Reach
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.lease.proof import LeaseProof
from hamsterbunker.records import LeaseRecord
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import open_store
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.testing import MemoryStore
from tests.node.test_hostile_store import AGENT, TTL_MS, Nodes, nodes
from tests.node.test_syncdir_lineage import WAIT_S
from tests.node.test_syncdir_lineage import Nodes as SyncNodes
from tests.support import wait_until
from tests.support.agents import SECRET, AsyncAgent
from tests.support.raw_store import RawStore, backend_store, file_key

__all__ = ["backend_store", "nodes"]  # the fixtures, used by name

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=1000)


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(SECRET, new_cluster_record(SECRET))


def keeper(store: MemoryStore, node: str, clock: FakeClock, sealer: Sealer | None) -> LeaseKeeper:
    made = LeaseKeeper(store, AGENT, node, "eu", timing=TIMING, clock=clock)
    made.proof = None if sealer is None else LeaseProof(sealer, AGENT)
    return made


def forged(record: LeaseRecord, **changes: object) -> LeaseRecord:
    """record as a writer without the secret would leave it: changed, its proof kept."""
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def test_every_record_a_keeper_writes_carries_a_proof_that_opens(sealer: Sealer) -> None:
    """Acquired, renewed and released records each carry a proof for their own fields."""
    store, clock = MemoryStore(), FakeClock()
    proof = LeaseProof(sealer, AGENT)
    node = keeper(store, "node-a", clock, sealer)
    assert node.tick().outcome is Outcome.ACQUIRED
    assert proof.problem(store.read_lease(AGENT)) is None
    clock.advance(0.1)
    assert node.tick().outcome is Outcome.RENEWED
    assert proof.problem(store.read_lease(AGENT)) is None
    assert node.release()
    assert proof.problem(store.read_lease(AGENT)) is None
    other = LeaseProof(Sealer("another secret", new_cluster_record("another secret")), AGENT)
    assert other.problem(store.read_lease(AGENT)) is not None


def test_a_reach_learned_from_a_proven_record_and_not_from_a_forged_one(sealer: Sealer) -> None:
    """A standby learns the reach a genuine record names; a forged reach teaches it nothing."""
    store, clock = MemoryStore(), FakeClock()
    leader = keeper(store, "node-a", clock, sealer)
    standby = keeper(store, "node-b", clock, sealer)
    leader.learn_published(Reach(seq=5, epoch=1))
    assert leader.tick().outcome is Outcome.ACQUIRED
    standby.tick()
    assert standby.reach().seq == 5
    held = store.read_lease(AGENT)
    store.cas_lease(AGENT, held.version, forged(held, seq=10**9, seq_epoch=9))
    standby.tick()
    assert standby.reach().seq == 5
    assert any("holder 'node-a'" in found for found in standby.drain_unproven())


def test_a_forged_epoch_at_the_limit_leaves_an_epoch_to_take(sealer: Sealer) -> None:
    """A record at the highest epoch, written without the secret, is taken over above the
    epochs known (not refused with 'no epoch is left'), once it stood still for a TTL."""
    store, clock = MemoryStore(), FakeClock()
    first = keeper(store, "node-a", clock, sealer)
    standby = keeper(store, "node-b", clock, sealer)
    assert first.tick().outcome is Outcome.ACQUIRED
    assert standby.tick().outcome is Outcome.STANDBY  # it saw epoch 1
    held = store.read_lease(AGENT)
    store.cas_lease(AGENT, held.version, forged(held, holder=None, epoch=MAX_EPOCH))
    assert standby.tick().outcome is Outcome.STANDBY  # released, but unproven: wait a TTL
    clock.advance(TIMING.lease_ttl_s)
    taken = standby.tick()
    assert taken.outcome is Outcome.ACQUIRED, taken
    assert taken.record is not None and taken.record.epoch == 2
    assert standby.highest_epoch == 2


def test_a_forged_ttl_holds_a_standby_back_only_its_own_ttl(sealer: Sealer) -> None:
    """A live-looking record with a 10-minute TTL, without a proof, is taken over one TTL
    (the node's own) after it last changed; a genuine one is waited for its whole TTL."""
    store, clock = MemoryStore(), FakeClock()
    writer = keeper(store, "node-a", clock, sealer)
    assert writer.tick().outcome is Outcome.ACQUIRED
    held = store.read_lease(AGENT)
    store.cas_lease(AGENT, held.version, forged(held, holder="ghost", ttl_ms=MAX_LEASE_TTL_MS))
    standby = keeper(store, "node-b", clock, sealer)
    assert standby.tick().outcome is Outcome.STANDBY
    assert standby.seconds_until_expiry() == pytest.approx(TIMING.lease_ttl_s)
    clock.advance(TIMING.lease_ttl_s)
    assert standby.tick().outcome is Outcome.ACQUIRED


def test_a_forged_hand_over_to_a_nodes_session_is_not_led(sealer: Sealer) -> None:
    """A record naming this node's holder and session (heartbeats show the session) at a new
    epoch, without a proof, is not led as a switchover: the node waits a TTL and acquires."""
    store, clock = MemoryStore(), FakeClock()
    leader = keeper(store, "node-a", clock, sealer)
    target = keeper(store, "node-b", clock, sealer)
    assert leader.tick().outcome is Outcome.ACQUIRED
    target.tick()
    held = store.read_lease(AGENT)
    store.cas_lease(
        AGENT, held.version, forged(held, holder="node-b", session=target.session, epoch=7)
    )
    assert target.tick().outcome is Outcome.STANDBY
    clock.advance(TIMING.lease_ttl_s)
    taken = target.tick()
    assert taken.outcome is Outcome.ACQUIRED and taken.record is not None
    assert taken.record.epoch == 8  # above the forged 7: epochs are plentiful


def test_without_a_proof_set_every_record_is_trusted_as_before() -> None:
    """A keeper given no proof (benchmarks, store-level tests) learns from every record."""
    store, clock = MemoryStore(), FakeClock()
    first = keeper(store, "node-a", clock, None)
    assert first.tick().outcome is Outcome.ACQUIRED
    held = store.read_lease(AGENT)
    store.cas_lease(AGENT, held.version, forged(held, seq=42))
    other = keeper(store, "node-b", clock, None)
    other.tick()
    assert other.reach().seq == 42


# -- real node runtimes, the record written raw on every backend ---------------------------------


def rewrite_lease(nodes: Nodes, raw: RawStore, **changes: object) -> None:
    store = open_store(nodes.url)
    try:
        lease = store.read_lease(AGENT)
    finally:
        store.close()
    assert lease is not None
    doc = json.loads(lease.to_json())
    doc.update(changes)
    raw.put_lease(AGENT, json.dumps(doc).encode())


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"seq": 10**9}, id="reach"),
        pytest.param({"epoch": MAX_EPOCH}, id="last-epoch"),
        pytest.param({"holder": "ghost", "ttl_ms": MAX_LEASE_TTL_MS}, id="ten-minute-ttl"),
    ],
)
def test_one_forged_lease_record_does_not_stop_the_agent(
    nodes: Nodes, backend_store: RawStore, changes: dict[str, object]
) -> None:
    """After one write of a lease record naming a reach of 10^9, the last epoch, or a live
    holder with a 10-minute TTL, a node reports it (lease.unproven) and resumes from the
    newest checkpoint within a few TTLs, instead of refusing or waiting 10 minutes."""
    nodes.publish_and_stop(2)
    rewrite_lease(nodes, backend_store, **changes)
    node = nodes.start("node-b", AsyncAgent(AGENT))
    unproven = nodes.events.wait("lease.unproven", "node-b")
    assert "proof" in unproven.detail["reason"] or "authenticate" in unproven.detail["reason"]
    resumed = nodes.events.wait("agent.resumed", "node-b", timeout=20 * TTL_MS / 1000)
    assert resumed.seq == 2
    nodes.events.wait("checkpoint.published", "node-b", where=lambda e: e.seq == 3)
    assert not node.stopped.is_set()
    assert nodes.events.of("store.regressed", "node-b") == []  # nothing went back


def test_a_forged_claim_on_a_synced_folder_never_wins(tmp_path: Path) -> None:
    """On a syncdir folder, a claim planted in a subtree of its own at the last epoch (it
    would win the claim order for good) is left out and reported: the leader goes on."""
    nodes = SyncNodes(tmp_path)
    try:
        leader = nodes.start("A")
        wait_until(lambda: nodes.published("A", 2), "A publishing", WAIT_S)
        subtrees = nodes.sync.root("A") / "nodes"
        own = LeaseRecord.from_json(file_key(subtrees / "A", AgentKeys(AGENT).lease).read_bytes())
        planted = file_key(subtrees / "evil", AgentKeys(AGENT).lease)
        planted.parent.mkdir(parents=True)
        planted.write_bytes(forged(own, holder="evil", epoch=MAX_EPOCH).to_json())
        past = leader.seq
        wait_until(lambda: nodes.published("A", past + 3), "A publishing on", WAIT_S)
        problems = nodes.store("A")
        problems.check_claims_with(AGENT, LeaseProof(nodes.sealer(), AGENT).problem)
        assert problems.read_lease(AGENT).holder == "A"
        assert any("of node evil left out" in found for found in problems.problems())
        assert nodes.events.of("lease.lost", "A") == []
    finally:
        nodes.close()
