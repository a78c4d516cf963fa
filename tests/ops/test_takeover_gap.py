"""The takeover gap (``hamsterbunker.lease.gap``): the time with no leader able to step, written
once by the taker into the lease record's history, and shown as that same number by
``hb history`` and by hb-tui's timeline.

Keepers run on a FileStore; true time is a number the test moves, from which each node reads
its own monotonic clock (each booted at another time) and its own wall clock (skewed where a
test says so). Nothing sleeps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hamsterbunker_tui.model import ClusterModel
from hamsterbunker_tui.panels import timeline_line

from hamsterbunker import FileStore
from hamsterbunker.cli.history import history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.lease.control import set_paused
from hamsterbunker.lease.gap import format_gap
from hamsterbunker.records import Event
from hamsterbunker.sealing import Sealer, new_cluster_record

AGENT = "agent-1"
T0 = 1_700_000_000.0  # true time 0 on a wall clock that is right
TICK = 0.5  # every time below is a sum of quarters: exact in binary
TIMING = LeaseTiming(tick_ms=500, lease_ttl_ms=2000)


class World:
    """True time, which every node's clocks follow."""

    def __init__(self, store: FileStore) -> None:
        self.store = store
        self.t = 0.0

    def node(self, name: str, *, boot: float = 1000.0, skew: float = 0.0) -> LeaseKeeper:
        """A keeper whose monotonic clock reads boot at true time 0, its wall clock skew off."""
        return LeaseKeeper(
            self.store, AGENT, name, f"region-{name}", timing=TIMING,
            clock=_Monotonic(self, boot), wall=lambda: T0 + self.t + skew,
        )  # fmt: skip

    def run(self, until: float, *keepers: LeaseKeeper) -> None:
        """Tick keepers in turn, one every TICK each, until true time until."""
        while self.t + TICK <= until + 1e-9:
            self.t += TICK
            for keeper in keepers:
                keeper.tick()


class _Monotonic:
    def __init__(self, world: World, boot: float) -> None:
        self._world, self._boot = world, boot

    def monotonic(self) -> float:
        return self._boot + self._world.t


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(FileStore(tmp_path / "store"))


def stored_gap(world: World, epoch: int) -> int:
    lease = world.store.read_lease(AGENT)
    assert lease is not None
    return next(t.gap_ms for t in lease.history if t.epoch == epoch)


def shown(
    world: World, epoch: int, capsys: pytest.CaptureFixture[str], more: tuple[Event, ...] = ()
) -> tuple[str, str]:
    """The gap of epoch as ``hb history`` prints it, and hb-tui's timeline line of it (the
    monitor read more events beside the takeovers')."""
    args = argparse.Namespace(store=world.store.root.as_uri(), agent_id=AGENT, json=False)
    assert history(args) == 0
    row = next(
        line for line in capsys.readouterr().out.splitlines()[1:] if line.split()[0] == str(epoch)
    )
    lease = world.store.read_lease(AGENT)
    assert lease is not None
    # What the monitor reads: each taker's lease.acquired event, as the node writes it, and
    # the lease record.
    events = [
        Event(t.to, n, "lease.acquired", t.time, epoch=t.epoch,
              detail={"via": t.via, "gap_ms": t.gap_ms})
        for n, t in enumerate(lease.history, start=1)
    ]  # fmt: skip
    events.extend(more)
    monitor = ClusterModel(AGENT)
    monitor.update(events, [], lease, [], now=5.0, wall=T0 + world.t)
    line = next(t for t in monitor.timeline() if t.epoch == epoch)
    return row, timeline_line(line).plain


def assert_shown_alike(
    world: World, epoch: int, capsys: pytest.CaptureFixture[str], more: tuple[Event, ...] = ()
) -> None:
    gap = format_gap(stored_gap(world, epoch))
    row, line = shown(world, epoch, capsys, more)
    assert row.endswith(f"  {gap}"), row
    assert line.endswith(f"gap {gap}"), line


def test_a_failover_gap_runs_from_the_dead_leaders_last_renewal(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """The leader renews until 1.5 s and dies; the standby, reading 0.25 s after each renewal,
    takes the lease a TTL after it saw the last one: 2.25 s after that renewal was made."""
    leader, standby = world.node("a"), world.node("b", boot=7.0)
    assert leader.tick().outcome is Outcome.ACQUIRED
    world.t = 0.25
    standby.tick()
    for renewal_at in (0.5, 1.0, 1.5):
        world.t = renewal_at
        assert leader.tick().outcome is Outcome.RENEWED
        world.t = renewal_at + 0.25
        assert standby.tick().outcome is Outcome.STANDBY
    world.run(3.75, standby)  # the leader is dead: no more ticks of it
    assert standby.held is not None and standby.held.history[-1].via == "expired"
    assert stored_gap(world, 2) == 2250
    assert_shown_alike(world, 2, capsys)


@pytest.mark.parametrize("reading", [True, False], ids=["holding-off", "not-reading"])
def test_a_released_lease_taken_later_counts_from_the_release(
    world: World, capsys: pytest.CaptureFixture[str], reading: bool
) -> None:
    """A leader stops gracefully at 1.25 s; the standby takes the lease 12.5 s later, whether
    it watched the released record all along (holding off) or could not read it meanwhile."""
    leader, standby = world.node("a"), world.node("b", boot=7.0)
    assert leader.tick().outcome is Outcome.ACQUIRED
    world.t = 0.25
    standby.tick()
    standby.hold_off(13.5)  # until 13.75 s
    world.t = 1.25
    assert leader.release()
    if reading:
        world.run(13.25, standby)
    world.t = 13.75
    assert standby.tick().outcome is Outcome.ACQUIRED
    assert standby.held is not None and standby.held.history[-1].via == "released"
    assert stored_gap(world, 2) == 12_500
    assert_shown_alike(world, 2, capsys)


def test_a_switchover_has_no_gap(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """The leader writes its successor's term in the write that ends its own: gap 0."""
    leader, target = world.node("a"), world.node("b", boot=7.0)
    assert leader.tick().outcome is Outcome.ACQUIRED
    world.run(3.0, leader, target)
    assert leader.hand_over("b", target.session, "region-b")
    world.t += 0.25
    assert target.tick().outcome is Outcome.ACQUIRED
    assert stored_gap(world, 2) == 0
    assert_shown_alike(world, 2, capsys)
    assert shown(world, 2, capsys)[0].endswith("switchover  0.000 s")


@pytest.mark.parametrize(
    ("skew", "gap_ms"),
    [(0.0, 12_500), (3.0, 15_500), (-20.0, 0)],
    ids=["clocks-agree", "3s-fast", "20s-slow"],
)
def test_a_released_lease_first_seen_by_a_node_started_later(
    world: World, capsys: pytest.CaptureFixture[str], skew: float, gap_ms: int
) -> None:
    """Every node stopped at 1.0 s; one started at 13.5 s never saw the release: it compares
    the release's wall-clock time with its own, off by the skew, never below 0."""
    leader = world.node("a")
    assert leader.tick().outcome is Outcome.ACQUIRED
    world.t = 1.0
    assert leader.release()
    world.t = 13.5
    late = world.node("c", boot=50.0, skew=skew)
    assert late.tick().outcome is Outcome.ACQUIRED
    assert stored_gap(world, 2) == gap_ms
    assert_shown_alike(world, 2, capsys)


def test_a_lease_whose_leader_died_before_any_standby_ran_counts_from_its_last_renewal(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every node killed at 1.5 s; one started at 30 s takes the lease a TTL later: 30.5 s
    after the last renewal, not the TTL it watched."""
    leader = world.node("a")
    assert leader.tick().outcome is Outcome.ACQUIRED
    world.run(1.5, leader)
    world.t = 30.0
    late = world.node("c", boot=50.0)
    assert late.tick().outcome is Outcome.STANDBY
    world.run(32.0, late)
    assert late.held is not None and late.held.history[-1].via == "expired"
    assert stored_gap(world, 2) == 30_500
    assert_shown_alike(world, 2, capsys)


@pytest.mark.parametrize(("skew", "gap_ms"), [(30.0, 2500), (-30.0, 2000)], ids=["fast", "slow"])
def test_a_skewed_wall_clock_moves_a_watched_gap_no_further_than_between_two_reads(
    world: World, skew: float, gap_ms: int
) -> None:
    """The standby saw the last renewal at its read 0.25 s after it, and the one before at its
    read 0.5 s earlier: however wrong its wall clock, the gap stays within those reads (the
    truth, 2.25 s, is between)."""
    leader, standby = world.node("a"), world.node("b", boot=7.0, skew=skew)
    assert leader.tick().outcome is Outcome.ACQUIRED
    world.t = 0.25
    standby.tick()
    for renewal_at in (0.5, 1.0, 1.5):
        world.t = renewal_at
        leader.tick()
        world.t = renewal_at + 0.25
        standby.tick()
    world.run(3.75, standby)
    assert stored_gap(world, 2) == gap_ms


def test_a_paused_leader_is_a_leader_its_pause_no_gap(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator pauses the agent: its leader publishes nothing for 10 s but renews, then
    dies. The gap runs from its last renewal, as hb history and hb-tui both say; the hours of
    a pause (or the last checkpoint before it) are no part of it."""
    leader, standby = world.node("a"), world.node("b", boot=7.0)
    assert leader.tick().outcome is Outcome.ACQUIRED
    secret = "correct-horse-battery-staple"
    set_paused(world.store, Sealer(secret, new_cluster_record(secret)), AGENT, True)
    world.run(10.0, leader, standby)
    paused = world.store.read_lease(AGENT)
    assert paused is not None and paused.control and paused.holder == "a"
    world.run(12.0, standby)  # the leader died after its renewal at 10.0 s
    assert standby.held is not None and standby.held.control == paused.control
    assert stored_gap(world, 2) == 2000
    # The monitor also read the last checkpoint, from before the pause, and the resume.
    around = (
        Event("a", 90, "checkpoint.published", T0 + 0.25, epoch=1),
        Event("b", 90, "agent.resumed", T0 + 12.25, epoch=2),
    )
    assert_shown_alike(world, 2, capsys, around)
