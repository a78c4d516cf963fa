"""A lease record that does not parse is judged as a lease whose holder went silent.

Each keeper gets its own FakeClock and nothing sleeps (as in test_lease_timing).
The stores are a real FileStore in tmp_path and a MemoryStore, written past the
contract as someone without the secret would (``plant``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.errors import Fenced, UnreadableLease
from hamsterbunker.core.reach import Reach
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.records import LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores.interface import Store
from hamsterbunker.testing import MemoryStore
from tests.support.agents import SECRET, AsyncAgent, Recorder
from tests.support.raw_store import RawRecords

AGENT = "agent-1"
TTL = 2.0  # seconds: the default lease_ttl_ms
# A lease record with a TTL of 10**400: within every size bound, outside every number bound.
TTL_1E400 = (
    b'{"holder":"x","region":"r","session":"s","epoch":1,"ttl_ms":1' + b"0" * 400
    + b',"renewals":1,"version":1}'
)  # fmt: skip


class Planted:
    """A store, and how to write its lease record as someone without the secret would."""

    def __init__(self, store: Store, plant: Callable[[bytes], None]) -> None:
        self.store, self.plant = store, plant


def _file(tmp_path: Path) -> Planted:
    store = FileStore(tmp_path / "store")

    def plant(data: bytes) -> None:
        RawRecords(store).put_lease(AGENT, data)  # past the contract, as a raw store write

    return Planted(store, plant)


def _memory(tmp_path: Path) -> Planted:
    store = MemoryStore()

    def plant(data: bytes) -> None:
        RawRecords(store).put_lease(AGENT, data)  # past the contract, as a raw store write

    return Planted(store, plant)


@pytest.fixture(params=[_file, _memory], ids=["file", "memory"])
def planted(request: pytest.FixtureRequest, tmp_path: Path) -> Planted:
    made: Planted = request.param(tmp_path)
    return made


def keeper(store: Store, node: str, clock: FakeClock, **timing: int) -> LeaseKeeper:
    return LeaseKeeper(
        store, AGENT, node, f"region-{node}", clock=clock, timing=LeaseTiming(**timing)
    )


def leader_then_junk(planted: Planted, junk: bytes = TTL_1E400) -> tuple[LeaseKeeper, FakeClock]:
    """node-a takes epoch 1, node-b (returned, on its own clock) sees it, then junk replaces
    the record and node-b reads it once: its wait starts at the returned clock's now."""
    leader = keeper(planted.store, "node-a", FakeClock(start=50_000.0))
    assert leader.tick().outcome is Outcome.ACQUIRED
    clock = FakeClock(start=1000.0)
    standby = keeper(planted.store, "node-b", clock)
    assert standby.tick().outcome is Outcome.STANDBY
    planted.plant(junk)
    first = standby.tick()
    assert first.outcome is Outcome.STANDBY and first.record is None
    return standby, clock


@pytest.mark.parametrize(
    "junk",
    [TTL_1E400, b"\x00not json at all", b"[" * 60_000],
    ids=["ttl-1e400", "not-json", "deep-nesting"],
)
def test_an_unreadable_record_is_replaced_exactly_a_full_ttl_after_it_was_first_seen(
    planted: Planted, junk: bytes
) -> None:
    """A standby stands by while an unreadable lease record stands unchanged for just under a
    TTL on its own clock, and at a full TTL replaces it with a record of its own under the next
    epoch, saying what it replaced."""
    standby, clock = leader_then_junk(planted, junk)
    clock.advance(TTL - 0.001)
    waiting = standby.tick()
    assert waiting.outcome is Outcome.STANDBY and not standby.may_step()
    assert "lease record" in waiting.store_error
    with pytest.raises(UnreadableLease):
        planted.store.read_lease(AGENT)
    clock.advance(0.001)
    taken = standby.tick()
    assert (taken.outcome, taken.reason) == (Outcome.ACQUIRED, "expired")
    assert taken.replaced and taken.replaced in waiting.store_error
    assert (taken.record.holder, taken.record.epoch) == ("node-b", 2)
    assert planted.store.read_lease(AGENT) == taken.record
    assert standby.may_step()


def test_a_change_of_the_unreadable_record_within_the_ttl_restarts_the_wait(
    planted: Planted,
) -> None:
    """Junk that changes to other junk within the TTL restarts the wait: the standby replaces
    it only a full TTL after the last change it saw."""
    standby, clock = leader_then_junk(planted)
    clock.advance(0.9 * TTL)
    planted.plant(b"other junk, longer than the first")
    changed_at = clock.monotonic()
    assert standby.tick().outcome is Outcome.STANDBY
    clock.advance(0.9 * TTL)  # 1.8 TTL since the first junk, 0.9 TTL since the change
    assert standby.tick().outcome is Outcome.STANDBY
    assert standby.seconds_until_expiry() == pytest.approx(0.1 * TTL)
    clock.advance(changed_at + TTL - clock.monotonic())
    assert standby.tick().outcome is Outcome.ACQUIRED


def test_a_readable_record_in_between_restarts_the_wait(planted: Planted) -> None:
    """A readable record written between two unreadable ones ends the first wait: the second
    junk is timed from when it was first seen."""
    standby, clock = leader_then_junk(planted)
    clock.advance(0.9 * TTL)
    planted.store.replace_unreadable_lease(AGENT, _found(planted.store), _record("node-c", 5))
    assert standby.tick().record.holder == "node-c"
    planted.plant(TTL_1E400)
    junk_again = clock.monotonic()
    assert standby.tick().outcome is Outcome.STANDBY
    clock.advance(junk_again + TTL - 0.001 - clock.monotonic())
    assert standby.tick().outcome is Outcome.STANDBY
    clock.advance(0.001)
    taken = standby.tick()
    assert (taken.outcome, taken.record.epoch) == (Outcome.ACQUIRED, 6)


def test_the_replacement_takes_an_epoch_above_every_epoch_the_node_knows(
    planted: Planted,
) -> None:
    """The replacing record's epoch is above the records seen, the node's memory and the
    authenticated checkpoints; afterwards a write under the old holder's fence is Fenced."""
    leader = keeper(planted.store, "node-a", FakeClock())
    assert leader.tick().outcome is Outcome.ACQUIRED
    old_fence = leader.fence()
    planted.store.put_checkpoint(AGENT, old_fence, 1, b"sealed-1")
    for remembered, learned, expected in ((7, 0, 8), (3, 9, 10)):
        planted.plant(b"junk, of a length of its own: %d" % expected)
        clock = FakeClock()
        standby = keeper(planted.store, f"node-{expected}", clock)
        standby.remember(remembered, Reach(1, 1))
        standby.learn_epoch(learned)
        assert standby.tick().outcome is Outcome.STANDBY
        clock.advance(TTL)
        taken = standby.tick()
        assert (taken.outcome, taken.record.epoch) == (Outcome.ACQUIRED, expected)
    with pytest.raises(Fenced):
        planted.store.put_checkpoint(AGENT, old_fence, 2, b"stale write")


def test_a_leader_whose_record_turns_unreadable_stops_and_replaces_it_a_ttl_later(
    planted: Planted,
) -> None:
    """A leader whose renewal finds junk loses the lease at once (it may no longer step), and
    alone on the store replaces the junk a TTL later under a new epoch: no wedge."""
    clock = FakeClock()
    leader = keeper(planted.store, "node-a", clock)
    assert leader.tick().outcome is Outcome.ACQUIRED
    planted.plant(TTL_1E400)
    clock.advance(0.4)
    lost = leader.tick()
    assert lost.outcome is Outcome.LOST and "cannot be read" in lost.reason
    assert not leader.may_step()
    assert leader.seconds_until_expiry() == pytest.approx(TTL)
    clock.advance(TTL - 0.001)
    assert leader.tick().outcome is Outcome.STANDBY
    clock.advance(0.001)
    taken = leader.tick()
    assert (taken.outcome, taken.record.epoch) == (Outcome.ACQUIRED, 2)


def test_the_wait_is_the_longer_ttl_of_the_last_readable_record(planted: Planted) -> None:
    """An unreadable record that replaced a holder's with a TTL longer than ours stands for
    that holder's TTL before it is replaced (it stops stepping within it)."""
    leader = keeper(planted.store, "node-a", FakeClock(), lease_ttl_ms=6000)
    assert leader.tick().outcome is Outcome.ACQUIRED
    clock = FakeClock()
    standby = keeper(planted.store, "node-b", clock)
    assert standby.tick().outcome is Outcome.STANDBY
    planted.plant(b"junk")
    assert standby.tick().outcome is Outcome.STANDBY
    clock.advance(6.0 - 0.001)
    assert standby.tick().outcome is Outcome.STANDBY
    clock.advance(0.001)
    assert standby.tick().outcome is Outcome.ACQUIRED


def test_a_replacement_lost_to_another_node_leaves_the_standby_standing_by(
    planted: Planted,
) -> None:
    """Two standbys that both waited a TTL race to replace the junk: one takes the lease, the
    other's compare-and-set against the junk it found fails and it stands by."""
    first, first_clock = leader_then_junk(planted)
    first_clock.advance(TTL)

    class Racing:
        """The store, with node-b's replacement landing just before node-c's."""

        def __getattr__(self, name: str) -> object:
            return getattr(planted.store, name)

        def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> object:
            assert first.tick().outcome is Outcome.ACQUIRED
            return planted.store.replace_unreadable_lease(agent, found, new)

    second_clock = FakeClock()
    second = keeper(Racing(), "node-c", second_clock)  # type: ignore[arg-type]
    assert second.tick().outcome is Outcome.STANDBY
    second_clock.advance(TTL)
    lost = second.tick()
    assert (lost.outcome, lost.reason) == (
        Outcome.STANDBY,
        "the unreadable lease record changed before it was replaced",
    )
    assert not second.may_step()
    assert planted.store.read_lease(AGENT).holder == "node-b"
    assert second.tick().record.holder == "node-b"


def _found(store: Store) -> str:
    with pytest.raises(UnreadableLease) as caught:
        store.read_lease(AGENT)
    return caught.value.found


def _record(holder: str, epoch: int) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, region="r", session="0123", epoch=epoch, ttl_ms=2000, version=10**6
    )


# -- end to end: a runtime on the memory store --------------------------------------------


def test_junk_over_a_live_leaders_record_stops_it_and_a_ttl_later_it_steps_on_above_it() -> None:
    """A single junk write (TTL 10**400) over the record of a leader that is stepping: it loses
    the lease at its next renewal, and once the junk stood a TTL it replaces it
    (lease.replaced_unreadable) under the next epoch and publishes again; nothing went back."""
    store, events = MemoryStore(), Recorder()
    node = Runtime(
        node_id="node-a",
        region="r",
        store=store,
        agent=AsyncAgent(AGENT),  # type: ignore[arg-type]
        secret=SECRET,
        timing=LeaseTiming(tick_ms=100, lease_ttl_ms=600),
        on_event=events,
        stop_grace_ms=0,
    )
    node.start()
    try:
        events.wait("checkpoint.published", "node-a", where=lambda e: e.seq >= 2)
        RawRecords(store).put_lease(AGENT, TTL_1E400)
        lost = events.wait("lease.lost", "node-a")
        assert "cannot be read" in lost.detail["reason"]
        replaced = events.wait("lease.replaced_unreadable", "node-a", timeout=30)
        assert "lease record is not valid JSON" in replaced.detail["found"], replaced
        taken = store.read_lease(AGENT)
        assert taken is not None and taken.epoch == 2
        events.wait("checkpoint.published", "node-a", where=lambda e: e.epoch == 2)
        assert events.of("store.regressed") == []
    finally:
        node.stop()
