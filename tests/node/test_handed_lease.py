"""A lease handed over on a switchover: the leader writes the target's next term, and
the target leads it without a write of its own (LeaseKeeper.hand_over).

The target's lease may count only from a moment known to precede the hand-over:
the send time of a read that still found the record before it. Each keeper has
its own FakeClock, so nothing depends on two nodes' clocks agreeing.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hamsterbunker import FileStore
from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.errors import CorruptRecord, StoreUnavailable
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.records import Heartbeat, LeaseRecord
from hamsterbunker.stores.interface import Store

AGENT = "agent-1"
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=2000)  # renew deadline 1.2 s


class CountingStore:
    """Delegates to a real store, counting the lease reads and writes made through it."""

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner
        self.reads = self.writes = 0
        self.failing = False

    def read_lease(self, agent: str) -> LeaseRecord | None:
        self.reads += 1
        return self.inner.read_lease(agent)

    def cas_lease(self, agent: str, expected: int | None, new: LeaseRecord) -> LeaseRecord:
        self.writes += 1
        if self.failing:
            raise StoreUnavailable("injected: the store did not answer")
        return self.inner.cas_lease(agent, expected, new)

    def __getattr__(self, name: str):  # everything else goes straight to the real store
        return getattr(self.inner, name)

    take_lease = Store.take_lease  # an acquisition is a counted cas_lease


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


def keeper(store, node: str, clock: FakeClock, timing: LeaseTiming = TIMING) -> LeaseKeeper:
    return LeaseKeeper(store, AGENT, node, f"region-{node}", clock=clock, timing=timing)


def leading(store) -> LeaseKeeper:
    leader = keeper(store, "node-a", FakeClock(start=50_000.0))
    assert leader.tick().outcome is Outcome.ACQUIRED
    return leader


def test_a_handed_lease_counts_from_the_read_that_found_the_record_before_it(store):
    leader = leading(store)
    counted = CountingStore(store)
    clock = FakeClock(start=1000.0)
    target = keeper(counted, "node-b", clock)
    assert target.tick().outcome is Outcome.STANDBY  # reads the leader's record at 1000.0
    clock.advance(0.3)
    assert leader.hand_over("node-b", target.session, "region-b")
    assert leader.held is None

    result = target.tick()

    assert result.outcome is Outcome.ACQUIRED and result.reason == "switchover"
    assert counted.writes == 0  # led without a write of its own
    assert target.may_step()
    assert target.seconds_since_renewal() == pytest.approx(0.3)  # from the read before
    assert target.unconfirmed  # the loop renews at once
    assert target.fence().epoch == 2
    lease = store.read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.session) == ("node-b", target.session)
    taken = lease.history[-1]
    assert (taken.epoch, taken.from_, taken.to, taken.via) == (2, "node-a", "node-b", "switchover")
    assert target.tick().outcome is Outcome.RENEWED and not target.unconfirmed


def test_a_handed_lease_with_no_read_before_it_is_renewed_before_any_step(store):
    leader = leading(store)
    counted = CountingStore(store)
    target = keeper(counted, "node-b", FakeClock(start=1000.0))
    assert leader.hand_over("node-b", target.session, "region-b")  # before the target ever read

    result = target.tick()

    assert result.outcome is Outcome.ACQUIRED
    assert counted.writes == 1  # its own renewal: the lease counts from that
    assert target.may_step() and target.seconds_since_renewal() == 0.0
    assert not target.unconfirmed


def test_a_read_too_long_before_the_hand_over_is_not_stepped_on(store):
    leader = leading(store)
    counted = CountingStore(store)
    clock = FakeClock(start=1000.0)
    target = keeper(counted, "node-b", clock)
    target.tick()
    clock.advance(TIMING.renew_deadline_s * 0.6)  # under half the renew deadline left
    assert leader.hand_over("node-b", target.session, "region-b")

    assert target.tick().outcome is Outcome.ACQUIRED
    assert counted.writes == 1
    assert target.seconds_since_renewal() == 0.0


def test_a_handed_lease_under_another_ttl_is_renewed_with_the_targets_own(store):
    leader = leading(store)  # TTL 2000 ms
    counted = CountingStore(store)
    target = keeper(counted, "node-b", FakeClock(start=1000.0), LeaseTiming(lease_ttl_ms=4000))
    target.tick()
    assert leader.hand_over("node-b", target.session, "region-b")

    assert target.tick().outcome is Outcome.ACQUIRED
    assert counted.writes == 1
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.ttl_ms == 4000  # what the other standbys wait for


def test_a_handed_lease_that_cannot_be_renewed_leaves_the_target_standing_by(store):
    leader = leading(store)
    counted = CountingStore(store)
    target = keeper(counted, "node-b", FakeClock(start=1000.0))
    assert leader.hand_over("node-b", target.session, "region-b")
    counted.failing = True

    result = target.tick()

    assert result.outcome is Outcome.STANDBY and "could not renew" in result.reason
    assert target.held is None and not target.may_step()


def test_a_lease_handed_to_an_earlier_session_of_the_node_is_not_taken(store):
    """A restarted target: the record names a session not ours, so it is another's lease
    (it expires a TTL later, as any)."""
    leader = leading(store)
    clock = FakeClock(start=1000.0)
    target = keeper(store, "node-b", clock)
    target.tick()
    assert leader.hand_over("node-b", "0123456789abcdef", "region-b")

    assert target.tick().outcome is Outcome.STANDBY
    clock.advance(TIMING.lease_ttl_s)
    result = target.tick()
    assert result.outcome is Outcome.ACQUIRED and result.reason == "expired"
    assert target.fence().epoch == 3


def test_its_own_lost_term_is_not_taken_back_as_handed(store):
    """A leader that lost its lease (no renewal for a TTL) sees its own record still
    there: that term is over, not handed to it; it is taken again only as expired."""
    counted = CountingStore(store)
    clock = FakeClock(start=1000.0)
    node = keeper(counted, "node-a", clock)
    assert node.tick().outcome is Outcome.ACQUIRED
    counted.failing = True
    clock.advance(TIMING.lease_ttl_s)
    assert node.tick().outcome is Outcome.LOST
    counted.failing = False

    assert node.tick().outcome is Outcome.STANDBY
    clock.advance(TIMING.lease_ttl_s)
    result = node.tick()
    assert result.outcome is Outcome.ACQUIRED and result.reason == "expired"
    assert node.fence().epoch == 2


def test_a_heard_record_with_a_new_request_is_read_not_taken(store):
    """The watch's record spares a read, except when it carries a new operator request: the
    target of a switchover then has a read from before the hand-over to count from."""
    leader = leading(store)
    counted = CountingStore(store)
    target = keeper(counted, "node-b", FakeClock(start=1000.0))
    target.tick()
    renewed = leader.tick().record
    assert renewed is not None
    target.tick(renewed)
    assert counted.reads == 1  # the renewal heard: no read

    asked = store.cas_lease(AGENT, renewed.version, replace(renewed, control="asked"))
    target.tick(asked)
    assert counted.reads == 2


@pytest.mark.parametrize("session", ["x" * 33, "not hex!", 7])
def test_a_heartbeat_naming_no_usable_lease_session_is_refused(session: object) -> None:
    """Store contents: a session that is not one is not written into anyone's lease."""
    beat = Heartbeat("b", "r", "h", 1, "standby", 1, 1, "a", 0.0, lease_session="0123abcd")
    assert Heartbeat.from_json(beat.to_json()).lease_session == "0123abcd"
    doc = json.loads(beat.to_json())
    doc["lease_session"] = session
    with pytest.raises(CorruptRecord, match="lease_session"):
        Heartbeat.from_json(json.dumps(doc).encode())
