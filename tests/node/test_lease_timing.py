"""Lease timing (DESIGN.md invariant 2): judged only on each node's own monotonic clock.

Every keeper gets its own FakeClock, so no test depends on two nodes' clocks
agreeing; nothing sleeps. The store is a real FileStore in tmp_path.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import replace

import pytest

from hamsterbunker import FileStore
from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.errors import (
    ConfigError,
    Fenced,
    LeaseConflict,
    StoreError,
    StoreUnavailable,
)
from hamsterbunker.core.limits import MAX_EPOCH, MAX_LEASE_TTL_MS
from hamsterbunker.core.reach import Reach
from hamsterbunker.core.timing import LeaseTiming, check_sync_delay
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.records import LeaseRecord
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.raw_store import RawRecords, file_key

AGENT = "agent-1"
TTL = 2.0  # seconds: the default lease_ttl_ms of 2000
DEADLINE = 1.2  # seconds: the default renew_deadline_ms, 0.6 x TTL
RULE = "lease_ttl > renew_deadline > tick > 0"


class FlakyStore:
    """Delegates to a real store; cas_lease can be slowed (on a fake clock) or made to fail."""

    def __init__(
        self, inner: FileStore, clock: FakeClock | None = None, delay: float = 0.0
    ) -> None:
        self.inner = inner
        self.clock = clock
        self.delay = delay  # seconds the fake clock moves while cas_lease is "in flight"
        self.failing = False
        self.cas_calls = 0

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        self.cas_calls += 1
        if self.clock is not None and self.delay:
            self.clock.advance(self.delay)
        if self.failing:
            raise StoreUnavailable("injected: the store did not answer")
        return self.inner.cas_lease(agent, expected_version, new)

    def __getattr__(self, name: str):  # everything else goes straight to the real store
        return getattr(self.inner, name)

    take_lease = Store.take_lease  # an acquisition is a cas_lease above, counted and failing


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


def advance_to(clock: FakeClock, target: float) -> None:
    """Move clock to exactly target (target - now is exact for nearby floats, so no drift)."""
    now = clock.monotonic()
    assert target >= now, "a monotonic clock never goes back"
    clock.advance(target - now)
    assert clock.monotonic() == target


def make_keeper(store, node: str, clock: FakeClock, **timing) -> LeaseKeeper:
    return LeaseKeeper(
        store, AGENT, node, f"region-{node}", clock=clock, timing=LeaseTiming(**timing)
    )


def leader_and_standby(store):
    """A leader holding epoch 1, and a standby on its own clock that has seen it once."""
    leader_clock, standby_clock = FakeClock(start=50_000.0), FakeClock(start=1000.0)
    leader = make_keeper(store, "node-a", leader_clock)
    standby = make_keeper(store, "node-b", standby_clock)
    first = leader.tick()
    assert first.outcome is Outcome.ACQUIRED and first.record.epoch == 1
    seen = standby.tick()
    assert seen.outcome is Outcome.STANDBY
    assert seen.record == first.record
    return leader, leader_clock, standby, standby_clock


# -- configuration ----------------------------------------------------------


@pytest.mark.parametrize(
    ("tick_ms", "renew_deadline_ms", "lease_ttl_ms"),
    [
        pytest.param(400, 2000, 2000, id="ttl-equals-deadline"),
        pytest.param(400, 2500, 2000, id="ttl-below-deadline"),
        pytest.param(1200, 1200, 2000, id="deadline-equals-tick"),
        pytest.param(1500, 1200, 2000, id="deadline-below-tick"),
        pytest.param(0, 1200, 2000, id="tick-zero"),
        pytest.param(-400, 1200, 2000, id="tick-negative"),
    ],
)
def test_lease_timing_refuses_unsafe_orderings(tick_ms, renew_deadline_ms, lease_ttl_ms):
    """LeaseTiming raises ConfigError naming the rule lease_ttl > renew_deadline > tick > 0."""
    with pytest.raises(ConfigError, match=re.escape(RULE)) as caught:
        LeaseTiming(tick_ms=tick_ms, renew_deadline_ms=renew_deadline_ms, lease_ttl_ms=lease_ttl_ms)
    message = str(caught.value)
    assert f"lease_ttl={lease_ttl_ms} ms" in message
    assert f"renew_deadline={renew_deadline_ms} ms" in message
    assert f"tick={tick_ms} ms" in message


def test_lease_timing_refuses_a_ttl_no_lease_record_may_hold():
    """A TTL above MAX_LEASE_TTL_MS is refused before anything starts: nodes would read every
    lease record written with it as damaged, and stall."""
    LeaseTiming(tick_ms=400, renew_deadline_ms=1200, lease_ttl_ms=MAX_LEASE_TTL_MS)
    with pytest.raises(
        ConfigError, match=f"above the most a lease record may hold, {MAX_LEASE_TTL_MS}"
    ):
        LeaseTiming(tick_ms=400, renew_deadline_ms=1200, lease_ttl_ms=MAX_LEASE_TTL_MS + 1)


@pytest.mark.parametrize(
    "timing",
    [
        pytest.param({"lease_ttl_ms": 2000, "renew_deadline_ms": 2000}, id="ttl-equals-deadline"),
        pytest.param({"lease_ttl_ms": 2000, "renew_deadline_ms": 400}, id="deadline-equals-tick"),
        pytest.param({"tick_ms": 0}, id="tick-zero"),
        pytest.param({"lease_ttl_ms": 500}, id="default-deadline-below-default-tick"),
    ],
)
def test_lease_keeper_refuses_unsafe_timing(store, timing):
    """LeaseKeeper validates its timing when built and refuses an unsafe one with ConfigError."""
    with pytest.raises(ConfigError, match=re.escape(RULE)):
        make_keeper(store, "node-a", FakeClock(), **timing)


def test_default_timing_is_accepted_with_deadline_at_six_tenths_of_ttl(store):
    """The defaults (tick 400 ms, TTL 2000 ms) are valid and give renew_deadline = 0.6 x TTL."""
    assert LeaseTiming(tick_ms=400, renew_deadline_ms=1200, lease_ttl_ms=2000) == LeaseTiming()
    keeper = make_keeper(store, "node-a", FakeClock())
    assert keeper.timing.lease_ttl_ms == 2000
    assert keeper.timing.renew_deadline_ms == 1200
    assert (
        make_keeper(store, "node-b", FakeClock(), lease_ttl_ms=10_000).timing.renew_deadline_ms
        == 6000
    )
    explicit = make_keeper(store, "node-c", FakeClock(), renew_deadline_ms=1500)
    assert explicit.timing.renew_deadline_ms == 1500


def test_explicit_zero_renew_deadline_is_refused(store):
    """An explicit renew_deadline_ms=0 is refused with ConfigError, not replaced by the default."""
    with pytest.raises(ConfigError, match=re.escape(RULE)):
        make_keeper(store, "node-a", FakeClock(), renew_deadline_ms=0)


# -- acquiring ----------------------------------------------------------------


def test_first_node_on_empty_store_acquires_epoch_one_at_first_tick(store):
    """The first keeper on an empty store acquires epoch 1 on its first tick, reason "empty"."""
    keeper = make_keeper(store, "node-a", FakeClock())
    assert not keeper.may_step()
    result = keeper.tick()
    assert result.outcome is Outcome.ACQUIRED
    assert result.reason == "empty"
    assert result.record.epoch == 1
    assert result.record.holder == "node-a"
    assert result.record.session == keeper.session
    assert store.read_lease(AGENT) == result.record
    assert keeper.may_step()
    assert keeper.fence().epoch == 1


# -- the standby's expiry judgement -------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [
        pytest.param(TTL - 0.001, Outcome.STANDBY, id="ttl-minus-1ms"),
        pytest.param(TTL, Outcome.ACQUIRED, id="exactly-ttl"),
    ],
)
def test_standby_takes_over_exactly_at_full_ttl_of_its_own_clock(store, elapsed, expected):
    """A standby takes an unchanged lease at a full TTL since it first saw it, not 1 ms earlier."""
    _leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    standby_clock.advance(elapsed)
    result = standby.tick()
    assert result.outcome is expected
    if expected is Outcome.ACQUIRED:
        assert result.reason == "expired"
        assert result.record.epoch == 2
        assert result.record.holder == "node-b"
    else:
        assert result.record.epoch == 1
        assert not standby.may_step()
        assert store.read_lease(AGENT).holder == "node-a"


def test_standby_times_from_first_observation_not_from_its_own_start(store):
    """A standby's TTL starts when it first sees the record, even if its clock ran long before."""
    leader = make_keeper(store, "node-a", FakeClock())
    assert leader.tick().outcome is Outcome.ACQUIRED
    standby_clock = FakeClock(start=1000.0)
    standby = make_keeper(store, "node-b", standby_clock)
    standby_clock.advance(3600.0)  # the standby's process has existed an hour before it looks
    seen_at = standby_clock.monotonic()
    assert standby.tick().outcome is Outcome.STANDBY
    for offset in (0.4, 0.8, 1.2, 1.6, TTL - 0.001):  # its regular ticks, then just below TTL
        advance_to(standby_clock, seen_at + offset)
        assert standby.tick().outcome is Outcome.STANDBY
    advance_to(standby_clock, seen_at + TTL)
    result = standby.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "expired", 2)


def test_leader_renewal_resets_standby_timer(store):
    """Each renewal changes the record, so a standby never takes over while renewals keep coming."""
    leader, leader_clock, standby, standby_clock = leader_and_standby(store)
    standby_clock.advance(0.9 * TTL)
    assert standby.tick().outcome is Outcome.STANDBY
    leader_clock.advance(0.4)
    renewed = leader.tick()
    assert renewed.outcome is Outcome.RENEWED
    changed_at = standby_clock.monotonic()
    seen = standby.tick()  # sees the changed record: its timer restarts now
    assert seen.outcome is Outcome.STANDBY and seen.record == renewed.record
    standby_clock.advance(0.9 * TTL)  # 1.8 TTL since first observation, 0.9 TTL since the change
    result = standby.tick()
    assert result.outcome is Outcome.STANDBY
    assert store.read_lease(AGENT).holder == "node-a"
    assert leader.may_step()
    advance_to(standby_clock, changed_at + TTL - 0.001)
    assert standby.tick().outcome is Outcome.STANDBY
    advance_to(standby_clock, changed_at + TTL)  # a full TTL without change
    assert standby.tick().outcome is Outcome.ACQUIRED


def test_standby_that_missed_renewals_still_restarts_on_change(store):
    """A standby that only looks again after 1.8 TTL but sees a changed record keeps waiting."""
    leader, leader_clock, standby, standby_clock = leader_and_standby(store)
    for _ in range(4):
        leader_clock.advance(0.4)
        assert leader.tick().outcome is Outcome.RENEWED
    standby_clock.advance(1.8 * TTL)
    assert standby.tick().outcome is Outcome.STANDBY
    assert store.read_lease(AGENT).epoch == 1


class ReadCounting:
    """A store whose read_lease calls are counted."""

    def __init__(self, inner: FileStore) -> None:
        self.inner, self.reads = inner, 0

    def read_lease(self, agent: str) -> LeaseRecord | None:
        self.reads += 1
        return self.inner.read_lease(agent)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_standby_takes_a_lease_that_stood_still_without_reading_it_first(store):
    """At a full TTL the standby's compare-and-set is on the version it saw: one round trip."""
    _leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    standby.store = counting = ReadCounting(store)
    standby_clock.advance(TTL)
    result = standby.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "expired", 2)
    assert counting.reads == 0


def test_a_standby_whose_unread_take_finds_a_change_reads_it_and_waits_a_ttl_from_now(store):
    """The record changed unseen (no watch told): the compare-and-set fails, the standby reads
    the change at once and times a new TTL from it, rather than trying the old version again."""
    leader, leader_clock, standby, standby_clock = leader_and_standby(store)
    leader_clock.advance(0.4)
    renewed = leader.tick()
    assert renewed.outcome is Outcome.RENEWED
    standby.store = counting = ReadCounting(store)
    standby_clock.advance(TTL)
    result = standby.tick()
    assert result.outcome is Outcome.STANDBY and result.record == renewed.record
    assert counting.reads == 1 and standby.observed == renewed.record
    seen_at = standby_clock.monotonic()
    advance_to(standby_clock, seen_at + TTL - 0.001)
    assert standby.tick().outcome is Outcome.STANDBY
    assert counting.reads == 2  # not expired as seen: read
    advance_to(standby_clock, seen_at + TTL)
    assert standby.tick().outcome is Outcome.ACQUIRED
    assert counting.reads == 2


def test_standby_ignores_wall_clock_jumps(store, monkeypatch):
    """Jumping the wall clock (time.time) an hour forward or back changes no lease outcome."""
    real_time = time.time
    leader, _leader_clock, standby, standby_clock = leader_and_standby(store)

    monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)
    standby_clock.advance(0.5)
    assert standby.tick().outcome is Outcome.STANDBY
    assert leader.may_step()
    assert leader.tick().outcome is Outcome.RENEWED
    changed_at = standby_clock.monotonic()
    assert standby.tick().outcome is Outcome.STANDBY  # sees the renewal: timer restarts here

    monkeypatch.setattr(time, "time", lambda: real_time() - 3600.0)
    advance_to(standby_clock, changed_at + TTL - 0.001)
    assert standby.tick().outcome is Outcome.STANDBY
    advance_to(standby_clock, changed_at + TTL)
    result = standby.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "expired", 2)


@pytest.mark.parametrize(
    ("leader_ttl_ms", "standby_ttl_ms"),
    [
        pytest.param(10_000, 2000, id="record-ttl-longer"),
        pytest.param(2000, 10_000, id="own-ttl-longer"),
    ],
)
def test_standby_waits_the_longer_of_its_own_and_the_records_ttl(
    store, leader_ttl_ms, standby_ttl_ms
):
    """A standby waits max(its own TTL, the record's ttl_ms) before judging a lease expired."""
    leader = make_keeper(store, "node-a", FakeClock(), lease_ttl_ms=leader_ttl_ms)
    acquired = leader.tick()
    assert acquired.record.ttl_ms == leader_ttl_ms
    standby_clock = FakeClock(start=1000.0)
    standby = make_keeper(store, "node-b", standby_clock, lease_ttl_ms=standby_ttl_ms)
    seen_at = standby_clock.monotonic()
    assert standby.tick().outcome is Outcome.STANDBY
    for offset in (2.0, 5.0, 9.999):  # past the shorter TTL, up to just below the longer
        advance_to(standby_clock, seen_at + offset)
        assert standby.tick().outcome is Outcome.STANDBY
    advance_to(standby_clock, seen_at + 10.0)
    result = standby.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "expired", 2)
    assert result.record.ttl_ms == standby_ttl_ms


def test_standby_losing_the_acquisition_race_stays_standby_and_waits_again(store):
    """Of two standbys judging a lease expired, one wins by CAS; the other waits a new full TTL."""
    leader = make_keeper(store, "node-a", FakeClock())
    assert leader.tick().outcome is Outcome.ACQUIRED
    clock_b, clock_c = FakeClock(), FakeClock()
    b, c = make_keeper(store, "node-b", clock_b), make_keeper(store, "node-c", clock_c)
    assert b.tick().outcome is Outcome.STANDBY
    assert c.tick().outcome is Outcome.STANDBY
    clock_b.advance(TTL)
    clock_c.advance(TTL)
    won = b.tick()
    assert won.outcome is Outcome.ACQUIRED and won.record.epoch == 2
    # c's own judgement says "expired" for the record it saw, but b's write changed it first.
    lost_race = c.tick()
    assert lost_race.outcome is Outcome.STANDBY
    assert not c.may_step()
    assert store.read_lease(AGENT) == won.record
    clock_c.advance(TTL - 0.001)
    assert c.tick().outcome is Outcome.STANDBY
    assert store.read_lease(AGENT).holder == "node-b"


# -- the leader's renew deadline ----------------------------------------------------


def test_leader_stops_stepping_at_renew_deadline_when_renewals_fail(store):
    """While renewals fail the leader may step until renew_deadline, then not; LOST after a TTL."""
    # Start at 0.5 s so that "sent + 1.2 - sent" is exactly the deadline in floating point.
    clock = FakeClock(start=0.5)
    flaky = FlakyStore(store)
    leader = make_keeper(flaky, "node-a", clock)
    sent = clock.monotonic()
    assert leader.tick().outcome is Outcome.ACQUIRED  # sent (and answered) at `sent`
    fence = leader.fence()
    flaky.failing = True
    for offset in (0.4, 0.8):
        advance_to(clock, sent + offset)
        result = leader.tick()
        assert result.outcome is Outcome.RENEW_FAILED
        assert "injected" in result.reason
        assert leader.may_step()
    advance_to(clock, sent + DEADLINE - 0.001)  # just before the deadline
    assert leader.may_step()
    assert leader.seconds_until_deadline() == pytest.approx(0.001, abs=1e-6)
    advance_to(clock, sent + DEADLINE)  # at the deadline
    assert clock.monotonic() - sent == leader.timing.renew_deadline_s  # exactly, not just past
    assert not leader.may_step()
    assert leader.seconds_until_deadline() == 0.0
    calls = flaky.cas_calls
    assert leader.tick().outcome is Outcome.RENEW_FAILED  # still trying, no longer stepping
    assert flaky.cas_calls == calls + 1
    assert not leader.may_step()
    advance_to(clock, sent + TTL - 0.001)
    assert leader.tick().outcome is Outcome.RENEW_FAILED
    advance_to(clock, sent + TTL)  # a standby may have taken over by now
    lost = leader.tick()
    assert lost.outcome is Outcome.LOST
    assert lost.record.epoch == fence.epoch
    assert "full TTL" in lost.reason
    assert not leader.may_step()
    with pytest.raises(LeaseConflict):
        leader.fence()


def test_renewal_succeeding_past_the_deadline_keeps_the_lease_and_epoch(store):
    """A renewal that succeeds after the deadline (a short pause) keeps the epoch and allows
    stepping again, since the compare-and-set proves nobody took over.
    """
    clock = FakeClock()
    flaky = FlakyStore(store)
    leader = make_keeper(flaky, "node-a", clock)
    assert leader.tick().outcome is Outcome.ACQUIRED
    epoch = leader.fence().epoch
    clock.advance(DEADLINE + 0.3)  # paused past the deadline, not past the TTL
    assert not leader.may_step()
    result = leader.tick()
    assert result.outcome is Outcome.RENEWED
    assert leader.may_step()
    assert leader.fence().epoch == epoch
    assert store.read_lease(AGENT).epoch == epoch


def test_renewal_past_the_ttl_after_a_takeover_is_lost(store):
    """A leader paused past the TTL whose record was taken meanwhile is LOST at its next tick."""
    leader, leader_clock, standby, standby_clock = leader_and_standby(store)
    standby_clock.advance(TTL)
    assert standby.tick().outcome is Outcome.ACQUIRED
    leader_clock.advance(3 * TTL)  # the zombie wakes up
    result = leader.tick()
    assert result.outcome is Outcome.LOST
    assert "changed by another node" in result.reason


def test_successful_renewal_after_failures_restores_the_deadline(store):
    """A renewal succeeding after failures restarts the deadline from when it was sent."""
    clock = FakeClock()
    flaky = FlakyStore(store)
    leader = make_keeper(flaky, "node-a", clock)
    assert leader.tick().outcome is Outcome.ACQUIRED
    flaky.failing = True
    clock.advance(1.0)
    assert leader.tick().outcome is Outcome.RENEW_FAILED
    flaky.failing = False
    clock.advance(0.1)
    assert leader.tick().outcome is Outcome.RENEWED
    assert leader.seconds_until_deadline() == pytest.approx(DEADLINE)
    clock.advance(1.0)  # 2.1 s after acquiring, 1.0 s after the good renewal
    assert leader.may_step()


def test_a_tick_says_when_the_store_did_not_answer_even_when_the_lease_is_lost(tmp_path):
    """store_error is set by failed renewals and by the loss they end in after a full TTL
    (the runtime's store.error and store.recovered rest on it), never by a refused one."""
    clock = FakeClock()
    flaky = FlakyStore(FileStore(tmp_path / "flaky"))
    leader = make_keeper(flaky, "node-a", clock)
    assert leader.tick().store_error == ""
    flaky.failing = True
    clock.advance(1.0)
    failed = leader.tick()
    assert (failed.outcome, failed.store_error) == (Outcome.RENEW_FAILED, failed.reason)
    assert "did not answer" in failed.store_error
    clock.advance(TTL)
    lost = leader.tick()
    assert lost.outcome is Outcome.LOST and "did not answer" in lost.store_error
    zombie, zombie_clock, standby, standby_clock = leader_and_standby(FileStore(tmp_path / "s"))
    standby_clock.advance(TTL)
    assert standby.tick().outcome is Outcome.ACQUIRED
    zombie_clock.advance(3 * TTL)
    refused = zombie.tick()  # the store answered: no
    assert (refused.outcome, refused.store_error) == (Outcome.LOST, "")


def test_renew_deadline_counts_from_when_the_renewal_was_sent(store):
    """The deadline runs from sending the last successful renewal, not from its (slow) answer."""
    clock = FakeClock()
    slow = FlakyStore(store, clock=clock, delay=0.5)
    leader = make_keeper(slow, "node-a", clock)
    assert leader.tick().outcome is Outcome.ACQUIRED  # sent at t, answered at t + 0.5
    assert leader.seconds_until_deadline() == pytest.approx(DEADLINE - 0.5)
    clock.advance(0.4)
    sent = clock.monotonic()
    assert leader.tick().outcome is Outcome.RENEWED  # answered 0.5 s after it was sent
    assert clock.monotonic() - sent == pytest.approx(0.5)
    assert leader.seconds_until_deadline() == pytest.approx(DEADLINE - 0.5)
    advance_to(clock, sent + DEADLINE - 0.001)  # 0.699 s after the answer
    assert leader.may_step()
    advance_to(clock, sent + DEADLINE)  # 0.7 s after the answer: the deadline
    assert not leader.may_step()


# -- release, loss and fencing ----------------------------------------------------


def test_released_lease_is_taken_at_once_by_a_standby(store):
    """A released lease is taken on a standby's next tick (reason "released"), with no TTL wait."""
    leader, _leader_clock, standby, _standby_clock = leader_and_standby(store)
    assert leader.release() is True
    assert not leader.may_step()
    released = store.read_lease(AGENT)
    assert released.holder is None and released.epoch == 1
    result = standby.tick()  # the standby's clock has not moved at all
    assert result.outcome is Outcome.ACQUIRED
    assert result.reason == "released"
    assert result.record.epoch == 2
    assert result.record.holder == "node-b"


def test_released_lease_is_taken_by_a_standby_that_never_saw_it_held(store):
    """A fresh standby whose first look finds a released lease takes it immediately."""
    leader = make_keeper(store, "node-a", FakeClock())
    assert leader.tick().outcome is Outcome.ACQUIRED
    assert leader.release() is True
    fresh = make_keeper(store, "node-b", FakeClock())
    result = fresh.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "released", 2)


def test_old_leader_is_lost_and_fenced_after_takeover(store):
    """After an expiry takeover the old leader's next tick is LOST and its old fence is refused."""
    leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    old_fence = leader.fence()
    assert old_fence.epoch == 1
    store.put_checkpoint(AGENT, old_fence, 1, b"sealed-1")  # the fence was good while it held
    standby_clock.advance(TTL)
    taken = standby.tick()
    assert (taken.outcome, taken.record.epoch) == (Outcome.ACQUIRED, 2)

    lost = leader.tick()
    assert lost.outcome is Outcome.LOST
    assert lost.record.epoch == 1
    assert not leader.may_step()
    with pytest.raises(LeaseConflict):
        leader.fence()
    with pytest.raises(Fenced):
        store.put_checkpoint(AGENT, old_fence, 2, b"stale-write")
    assert [info.seq for info in store.list_checkpoints(AGENT)] == [1]
    new_fence = standby.fence()
    assert new_fence.epoch == 2
    assert store.put_checkpoint(AGENT, new_fence, 2, b"sealed-2").epoch == 2


def test_epochs_strictly_increase_across_repeated_takeovers(store):
    """Ten expiry takeovers rotating over three keepers give epochs 1..11, each one higher."""
    clocks = [FakeClock(start=1000.0 * (i + 1)) for i in range(3)]
    keepers = [make_keeper(store, f"node-{i}", clocks[i]) for i in range(3)]
    first = keepers[0].tick()
    assert first.outcome is Outcome.ACQUIRED
    epochs, holders = [first.record.epoch], [first.record.holder]
    leader = 0
    for _ in range(10):
        nxt = (leader + 1) % 3
        assert keepers[nxt].tick().outcome is Outcome.STANDBY  # observe the current record
        clocks[nxt].advance(TTL)
        taken = keepers[nxt].tick()
        assert (taken.outcome, taken.reason) == (Outcome.ACQUIRED, "expired")
        assert keepers[leader].tick().outcome is Outcome.LOST
        epochs.append(taken.record.epoch)
        holders.append(taken.record.holder)
        leader = nxt
    assert epochs == list(range(1, 12))
    assert all(a < b for a, b in itertools.pairwise(epochs))
    assert holders == [f"node-{i % 3}" for i in range(11)]
    assert store.read_lease(AGENT).epoch == 11


def test_lost_keeper_waits_full_ttl_before_retaking_its_own_stale_record(store):
    """After LOST (a TTL without renewal) a keeper waits a full TTL before retaking its record."""
    clock = FakeClock()
    flaky = FlakyStore(store)
    keeper = make_keeper(flaky, "node-a", clock)
    sent = clock.monotonic()
    assert keeper.tick().outcome is Outcome.ACQUIRED  # the last successful renewal
    flaky.failing = True
    advance_to(clock, sent + 0.4)
    assert keeper.tick().outcome is Outcome.RENEW_FAILED
    advance_to(clock, sent + TTL)
    assert keeper.tick().outcome is Outcome.LOST
    lost_at = clock.monotonic()
    flaky.failing = False  # the store answers again; the stale record is still ours
    stale = store.read_lease(AGENT)
    assert stale.holder == "node-a" and stale.session == keeper.session

    assert keeper.tick().outcome is Outcome.STANDBY
    for offset in (0.5, 0.8, 1.0, 1.5):
        advance_to(clock, lost_at + offset)
        assert keeper.tick().outcome is Outcome.STANDBY
        assert not keeper.may_step()
    advance_to(clock, lost_at + TTL - 0.001)
    assert keeper.tick().outcome is Outcome.STANDBY
    assert store.read_lease(AGENT) == stale
    advance_to(clock, lost_at + TTL)
    result = keeper.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "expired", 2)


def test_keeper_that_lost_to_a_takeover_waits_full_ttl_on_the_new_record(store):
    """An old leader LOST to a takeover is a plain standby: a full TTL on the new record."""
    leader, leader_clock, standby, standby_clock = leader_and_standby(store)
    standby_clock.advance(TTL)
    assert standby.tick().outcome is Outcome.ACQUIRED
    lost_at = leader_clock.monotonic()
    assert leader.tick().outcome is Outcome.LOST
    advance_to(leader_clock, lost_at + TTL - 0.001)
    assert leader.tick().outcome is Outcome.STANDBY
    assert store.read_lease(AGENT).holder == "node-b"
    advance_to(leader_clock, lost_at + TTL)
    result = leader.tick()
    assert (result.outcome, result.reason, result.record.epoch) == (Outcome.ACQUIRED, "expired", 3)


def test_a_lost_lease_record_never_brings_an_epoch_back(store):
    """With the lease record gone, the next acquisition takes an epoch above every one seen, or
    learned from an authenticated checkpoint (the runtime finds those when it restores: see
    test_runtime), never one of those again.
    """
    leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    store.put_checkpoint(AGENT, leader.fence(), 1, b"sealed state of epoch 1")
    standby_clock.advance(TTL)
    assert standby.tick().outcome is Outcome.ACQUIRED  # epoch 2
    store.put_checkpoint(AGENT, standby.fence(), 2, b"sealed state of epoch 2")
    file_key(store.root, AgentKeys(AGENT).lease).unlink()  # the record is lost

    fresh = make_keeper(store, "node-c", FakeClock())  # has seen nothing
    fresh.learn_epoch(2)  # what its restore would find
    result = fresh.tick()
    assert (result.outcome, result.record.epoch) == (Outcome.ACQUIRED, 3)
    old_leader = make_keeper(store, "node-a", FakeClock())
    old_leader.remember(7, Reach())  # remembers a higher epoch than the store shows
    file_key(store.root, AgentKeys(AGENT).lease).unlink()
    assert old_leader.tick().record.epoch == 8


def _roll_back_lease(store, to: LeaseRecord) -> None:
    """Put an old lease record back in place, as a store restored from a snapshot would."""
    RawRecords(store).put_lease(AGENT, to.to_json())


def test_a_lease_record_rolled_back_never_brings_an_epoch_back(store):
    """A standby that saw epoch 2 acquires epoch 3 over a record rolled back to epoch 1,
    and reports the regression once.
    """
    _leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    old_record = store.read_lease(AGENT)
    standby_clock.advance(TTL)
    assert standby.tick().record.epoch == 2
    standby.release()
    assert standby.drain_regressions() == []
    _roll_back_lease(store, old_record)  # epoch 1, held by node-a
    assert standby.tick().outcome is Outcome.STANDBY  # it waits a TTL like any standby
    standby.tick()
    assert standby.drain_regressions() == ["the lease record went back from epoch 2 to 1"]
    standby_clock.advance(TTL)
    result = standby.tick()
    assert (result.outcome, result.record.epoch) == (Outcome.ACQUIRED, 3)


def test_the_leaders_accepted_seq_travels_in_the_lease_record_to_every_standby(store):
    """Renewals carry the newest seq the leader saw accepted, so a standby that never read
    a checkpoint knows how far the store must reach (and a record it writes says so too)."""
    leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    leader.learn_published(Reach(41, 1))
    leader.tick()
    standby.tick()
    written = store.read_lease(AGENT)
    assert (written.seq, written.seq_epoch, standby.reach()) == (41, 1, Reach(41, 1))
    standby_clock.advance(TTL)
    result = standby.tick()
    assert result.outcome is Outcome.ACQUIRED
    assert (result.record.epoch, result.record.seq, result.record.seq_epoch) == (2, 41, 1)


def test_a_lease_record_rolled_back_within_its_term_is_reported_once_and_adopted(store):
    """The store going back to an older renewal of the same term (a Redis that lost its last
    second) is reported by the standby and by the leader, which keeps its lease and epoch."""
    leader, _leader_clock, standby, _standby_clock = leader_and_standby(store)
    early = store.read_lease(AGENT)
    leader.learn_published(Reach(5, 1))
    for _ in range(3):
        leader.tick()
        standby.tick()
    _roll_back_lease(store, early)
    standby.tick()
    standby.tick()
    went_back = f"the lease record of epoch 1 went back from renewal {early.renewals + 3} (seq 5)"
    assert [r.startswith(went_back) for r in standby.drain_regressions()] == [True]
    result = leader.tick()
    assert (result.outcome, result.record.epoch) == (Outcome.RENEWED, 1)
    assert [r.startswith(went_back) for r in leader.drain_regressions()] == [True]
    assert leader.tick().outcome is Outcome.RENEWED
    assert store.read_lease(AGENT).seq == 5
    assert leader.drain_regressions() == []


def test_renewals_of_a_term_the_store_brought_back_do_not_keep_it_alive(store):
    """The store lost a takeover: the old leader's epoch-1 record is back and the old
    leader renews it. A standby that saw epoch 2 takes over a TTL after it first saw the
    regressed record, however often it is renewed."""
    leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    old_record = store.read_lease(AGENT)
    standby_clock.advance(TTL)
    assert standby.tick().record.epoch == 2
    _roll_back_lease(store, old_record)  # the store lost epoch 2
    assert standby.tick().outcome is Outcome.LOST
    for _ in range(4):
        assert leader.tick().outcome is Outcome.RENEWED  # its version matches again
        standby_clock.advance(TTL / 4 - 0.01)
        assert standby.tick().outcome is Outcome.STANDBY
    standby_clock.advance(0.05)
    result = standby.tick()
    assert (result.outcome, result.record.epoch) == (Outcome.ACQUIRED, 3)
    assert leader.tick().outcome is Outcome.LOST


def test_checkpoint_names_do_not_move_the_next_epoch_but_authenticated_epochs_do(store):
    """A fresh node over a record behind the stored checkpoints takes the next epoch above what
    it was told is authenticated (learn_epoch), never above a checkpoint's unauthenticated name:
    one junk name at the highest epoch would otherwise push every later term past the limit."""
    _leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    old_record = store.read_lease(AGENT)
    standby_clock.advance(TTL)
    assert standby.tick().record.epoch == 2
    store.put_checkpoint(AGENT, standby.fence(), 1, b"junk, or sealed state of epoch 2")
    standby.release()
    _roll_back_lease(store, replace(old_record, holder=None))  # epoch 1, released
    fresh = make_keeper(store, "node-c", FakeClock())  # has seen nothing
    assert fresh.tick().record.epoch == 2  # the name alone counts for nothing
    fresh.release()
    fresh.learn_epoch(2)  # the runtime opened that checkpoint: epoch 2 was used
    assert fresh.tick().record.epoch == 3


def test_no_epoch_is_taken_past_the_limit(store):
    """A lease record at the highest epoch (written by someone else) makes acquiring a
    StoreError that says so, not an epoch that no checkpoint name can hold."""
    store.cas_lease(
        AGENT,
        None,
        LeaseRecord(holder=None, region="r", session="s", epoch=MAX_EPOCH, ttl_ms=2000),
    )
    keeper = make_keeper(store, "node-a", FakeClock())
    with pytest.raises(StoreError, match="no epoch is left"):
        keeper.tick()


def test_a_keeper_holding_off_takes_no_free_lease_until_the_time_is_up(store):
    """After giving the lease up (hold_off), a keeper leaves a released lease to others for
    that long, then takes it again."""
    clock = FakeClock()
    keeper = make_keeper(store, "node-a", clock)
    assert keeper.tick().outcome is Outcome.ACQUIRED
    keeper.release()
    keeper.hold_off(2 * TTL)
    assert keeper.tick().outcome is Outcome.STANDBY
    clock.advance(2 * TTL)
    assert keeper.tick().outcome is Outcome.ACQUIRED


def test_a_standby_knows_when_the_observed_lease_will_count_as_expired(store):
    """seconds_until_expiry counts a full TTL down from the last change the standby saw,
    so the runtime can wake then instead of at its next tick; nothing to wait for otherwise."""
    leader, _leader_clock, standby, standby_clock = leader_and_standby(store)
    assert leader.seconds_until_expiry() is None  # its own lease
    assert standby.seconds_until_expiry() == pytest.approx(TTL)
    standby_clock.advance(TTL * 0.75)
    assert standby.seconds_until_expiry() == pytest.approx(TTL * 0.25)
    leader.tick()  # a renewal: the record changes
    standby.tick()
    assert standby.seconds_until_expiry() == pytest.approx(TTL)
    leader.release()
    standby_clock.advance(0.01)
    assert standby.tick().outcome is Outcome.ACQUIRED  # released: taken at once
    assert standby.seconds_until_expiry() is None


@pytest.mark.parametrize(
    ("tick_ms", "ttl_ms", "delay_ms", "ok"),
    [
        (1000, 8000, 3000, True),  # 2 × (1000 + 3000) = 8000: just enough
        (1000, 7999, 3000, False),
        (400, 2000, 600, True),
        (400, 2000, 601, False),
        (1000, 600_000, 300_000, False),  # needs 602,000 ms: more than a lease may hold
    ],
)
def test_a_synced_folder_needs_a_ttl_of_twice_tick_plus_sync_delay(
    tick_ms: int, ttl_ms: int, delay_ms: int, ok: bool
) -> None:
    timing = LeaseTiming(tick_ms=tick_ms, lease_ttl_ms=ttl_ms)
    if ok:
        assert check_sync_delay(timing, delay_ms) == delay_ms
    else:
        with pytest.raises(ConfigError, match=r"lease_ttl ≥ 2 × \(tick \+ sync delay\) = \d+ ms"):
            check_sync_delay(timing, delay_ms)


@pytest.mark.parametrize("delay", [0, -5, True, 1.5, "3000"])
def test_a_sync_delay_that_is_not_a_positive_whole_number_of_ms_is_refused(delay: object) -> None:
    with pytest.raises(ConfigError, match="sync_delay_ms must be"):
        check_sync_delay(LeaseTiming(), delay)  # type: ignore[arg-type]
