"""A standby's hot copy (``hamsterbunker.node.hot_copy``): the newest checkpoint, fetched
as the leader's lease record names it, stands in for the read a takeover's restore would
make of it: only when the store lists that very checkpoint as the newest, and only if it
opens; else the restore reads as without it.

Node-a leads on a store whose renewals can be made to fail (a leader gone silent);
node-b stands by on one that counts its checkpoint reads. The state is bigger than what
the take's commit reads along (``TAKEN_CHECKPOINT_BYTES``), so without a hot copy the
restore reads the newest checkpoint after the take.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.records import CheckpointInfo, LeaseRecord
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.base import Fence, RestoreRead
from hamsterbunker.stores.layer.restore import TAKEN_CHECKPOINT_BYTES
from tests.node.test_runtime import FaultyStore, Harness
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, AsyncAgent

BIG = {"pad": "x" * (TAKEN_CHECKPOINT_BYTES + 100_000)}


class StandbyStore(FaultyStore):
    """Node-b's store: takes the lease as the record layer does (reading along in the same
    commit), counts the hot copy's fetches and the checkpoint reads after the take; can
    spoil what the hot copy fetches (bit rot on the way)."""

    def __init__(self, inner: FileStore, *, spoil_fetches: bool = False) -> None:
        super().__init__(inner)
        self.fetched: list[int] = []
        self.taken = threading.Event()
        self.read_after_taking = 0
        self.spoil_fetches = spoil_fetches

    def read_checkpoint_from(
        self, agent: str, seq: int, epoch: int
    ) -> tuple[CheckpointInfo, bytes] | None:
        found = self._inner.read_checkpoint_from(agent, seq, epoch)
        if found is not None:
            self.fetched.append(found[0].seq)
            if self.spoil_fetches:
                info, blob = found
                found = info, blob[:-1] + bytes([blob[-1] ^ 1])
        return found

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        self.read_after_taking += self.taken.is_set()
        return super().read_checkpoint(agent, info)

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        taken = self._inner.take_lease(agent, expected_version, new)
        self.taken.set()
        return taken


@pytest.fixture
def hb(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def _standby_beside_a_leader_at_3(
    hb: Harness, standby: StandbyStore, **node_b: object
) -> tuple[FaultyStore, AsyncAgent]:
    """Node-a publishes 1..3 with BIG in its state and parks in step 4; node-b stands by.
    Returns node-a's store and node-b's agent."""
    leader_store = FaultyStore(hb.store())
    hb.node("node-a", AsyncAgent(park_from=4, extra=BIG), store=leader_store)
    wait_until(lambda: hb.checkpoints()[:1] == [(3, 1)], "node-a to publish 3", 30)
    agent_b = AsyncAgent(park_from=5)
    hb.node("node-b", agent_b, store=standby, **node_b)
    hb.events.wait("node.standby", "node-b")
    return leader_store, agent_b


def _silence(leader_store: FaultyStore) -> None:
    """Node-a's renewals fail from now on: node-b takes the lease once it expires."""
    leader_store.fail_cas.set()


def test_a_takeover_restores_from_the_hot_copy_with_no_read_of_the_checkpoint(
    hb: Harness,
) -> None:
    standby = StandbyStore(hb.store())
    leader_store, agent_b = _standby_beside_a_leader_at_3(hb, standby)
    wait_until(lambda: 3 in standby.fetched, "node-b to fetch checkpoint 3", 30)
    _silence(leader_store)
    resumed = hb.events.wait("agent.resumed", "node-b", timeout=30)
    assert resumed.detail["from_seq"] == 3
    wait_until(lambda: agent_b.entered, "node-b's first step")
    assert agent_b.entered[0][1]["n"] == 3
    assert standby.taken.is_set() and standby.read_after_taking == 0


def test_without_a_hot_standby_the_standby_fetches_nothing_and_the_restore_reads(
    hb: Harness,
) -> None:
    standby = StandbyStore(hb.store())
    leader_store, _agent_b = _standby_beside_a_leader_at_3(hb, standby, hot_standby=False)
    node_b = hb.nodes[-1]

    def named() -> int:  # the seq of the lease record node-b last saw
        observed = node_b.keeper.observed
        return 0 if observed is None else observed.seq

    wait_until(lambda: named() >= 3, "node-b to see the lease name checkpoint 3", 30)
    _silence(leader_store)
    resumed = hb.events.wait("agent.resumed", "node-b", timeout=30)
    assert resumed.detail["from_seq"] == 3
    assert standby.fetched == [] and standby.read_after_taking == 1


def test_a_hot_copy_that_does_not_open_is_read_again_from_the_store(hb: Harness) -> None:
    standby = StandbyStore(hb.store(), spoil_fetches=True)
    leader_store, _agent_b = _standby_beside_a_leader_at_3(hb, standby)
    wait_until(lambda: 3 in standby.fetched, "node-b to fetch checkpoint 3", 30)
    _silence(leader_store)
    resumed = hb.events.wait("agent.resumed", "node-b", timeout=30)
    assert resumed.detail["from_seq"] == 3
    assert standby.read_after_taking == 1
    assert hb.events.of("checkpoint.rejected", "node-b") == []  # the stored one is sound


def test_a_hot_copy_older_than_the_newest_listed_is_not_used(hb: Harness) -> None:
    """Node-a publishes 4 after node-b fetched 3 (a leader killed before its next renewal
    names it): node-b resumes from 4, read from the store."""
    standby = StandbyStore(hb.store())
    leader_store, agent_b = _standby_beside_a_leader_at_3(hb, standby)
    wait_until(lambda: 3 in standby.fetched, "node-b to fetch checkpoint 3", 30)
    _silence(leader_store)
    store = hb.store()
    held, cluster = store.read_lease(AGENT), store.read_cluster()
    assert held is not None and held.holder == "node-a" and cluster is not None
    state = {"n": 4, "effects": [1, 2, 3, 4], **BIG}
    blob = Sealer(SECRET, cluster).seal(AGENT, held.epoch, 4, state)
    store.put_checkpoint(AGENT, Fence("node-a", held.session, held.epoch), 4, blob)
    resumed = hb.events.wait("agent.resumed", "node-b", timeout=30)
    assert resumed.detail["from_seq"] == 4
    assert standby.read_after_taking == 1
    wait_until(lambda: agent_b.entered, "node-b's first step")
    assert agent_b.entered[0][1]["n"] == 4
