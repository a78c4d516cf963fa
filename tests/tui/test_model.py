"""The monitor's model alone, no app: nodes, ages, lease, timeline, progress, memory, kill target.

Every update is given the monitor's clocks (``now`` monotonic, ``wall``), so ages
are exact and nothing sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hamsterbunker_tui.killing import KillTarget, kill_target
from hamsterbunker_tui.model import (
    MAX_EVENTS,
    MAX_TAKEOVERS,
    ClusterModel,
    LeaseView,
    ProgressView,
    format_age,
)

from hamsterbunker.records import CheckpointInfo, Event, Heartbeat, LeaseRecord, Takeover

HERE = "monitor-host"
T0 = 1_700_000_000.0  # a wall-clock time of the writers
TTL_MS = 2000


# -- helpers -----------------------------------------------------------------


def beat(
    node: str,
    beats: int = 1,
    *,
    time: float | None = None,
    role: str = "standby",
    host: str = HERE,
    pid: int = 4242,
    region: str = "eu",
    epoch: int = 1,
    seq: int = 0,
) -> Heartbeat:
    return Heartbeat(
        node=node, region=region, host=host, pid=pid, role=role, epoch=epoch, seq=seq,
        leader=None, time=T0 + beats if time is None else time, beats=beats,
    )  # fmt: skip


def lease(
    holder: str | None = "a",
    epoch: int = 1,
    renewals: int = 0,
    version: int = 1,
    ttl_ms: int = TTL_MS,
) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, region="eu", session="s", epoch=epoch, ttl_ms=ttl_ms,
        renewals=renewals, version=version,
    )  # fmt: skip


class Events:
    """Events with each node's n counting up, as the nodes write them."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}

    def __call__(
        self, node: str, kind: str, time: float, epoch: int = 1, **detail: object
    ) -> Event:
        n = self._n[node] = self._n.get(node, 0) + 1
        return Event(node=node, n=n, type=kind, time=time, epoch=epoch, detail=dict(detail))


def model() -> ClusterModel:
    return ClusterModel("agent", hostname=HERE)


def update(
    m: ClusterModel,
    *,
    now: float,
    wall: float | None = None,
    events: list[Event] | None = None,
    beats: list[Heartbeat] | None = None,
    lease_record: LeaseRecord | None = None,
    checkpoints: list[CheckpointInfo] | None = None,
) -> None:
    """One poll; by default the monitor's wall clock agrees with the writers' (T0 + now)."""
    m.update(
        events or [],
        beats or [],
        lease_record,
        checkpoints or [],
        now=now,
        wall=T0 + now if wall is None else wall,
    )


def row(m: ClusterModel, node: str) -> tuple[str, str, float]:
    view = next(v for v in m.nodes() if v.node == node)
    return view.role, view.health, round(view.age_s, 6)


# -- the nodes table ----------------------------------------------------------------


def test_nodes_rows_carry_each_heartbeat_sorted_by_node() -> None:
    m = model()
    beats = [
        beat("c", 3, role="starting", region="us", host="h3", pid=3, epoch=2, seq=7),
        beat("a", 1, role="active", region="eu", host="h1", pid=1, epoch=2, seq=9),
        beat("b", 2, role="standby", region="ap", host="h2", pid=2, epoch=1, seq=5),
    ]
    update(m, now=100.0, wall=T0 + 3, beats=beats)
    views = m.nodes()
    assert [v.node for v in views] == ["a", "b", "c"]
    a, b, c = views
    assert (a.role, a.region, a.host, a.pid, a.epoch, a.seq) == ("active", "eu", "h1", 1, 2, 9)
    assert (b.role, b.region, b.host, b.pid, b.epoch, b.seq) == ("standby", "ap", "h2", 2, 1, 5)
    assert (c.role, c.region, c.host, c.pid, c.epoch, c.seq) == ("starting", "us", "h3", 3, 2, 7)
    # First sight: aged by the writers' own times (wall T0 + 3 against T0 + beats).
    assert [v.age_s for v in views] == [2.0, 1.0, 0.0]


def test_health_is_fresh_then_late_past_half_the_ttl_then_dead_and_offline_past_it() -> None:
    m = model()
    b = beat("a")
    update(m, now=100.0, wall=b.time, beats=[b])
    assert row(m, "a") == ("standby", "fresh", 0.0)
    update(m, now=101.0, beats=[b])  # TTL/2 = 1 s: still fresh at exactly half
    assert row(m, "a") == ("standby", "fresh", 1.0)
    update(m, now=101.5, beats=[b])
    assert row(m, "a") == ("standby", "late", 1.5)
    update(m, now=102.0, beats=[b])
    assert row(m, "a") == ("standby", "late", 2.0)
    update(m, now=102.01, beats=[b])  # silent past the TTL
    assert row(m, "a")[:2] == ("offline", "dead")
    update(m, now=103.0, beats=[beat("a", 2)])  # and back when it beats again
    assert row(m, "a") == ("standby", "fresh", 0.0)


def test_health_follows_the_ttl_of_the_lease_record() -> None:
    m = model()
    b = beat("a")
    update(m, now=0.0, wall=b.time, beats=[b], lease_record=lease(ttl_ms=10_000))
    update(m, now=4.9, beats=[b], lease_record=lease(ttl_ms=10_000))
    assert row(m, "a")[:2] == ("standby", "fresh")
    update(m, now=9.9, beats=[b], lease_record=lease(ttl_ms=10_000))
    assert row(m, "a")[:2] == ("standby", "late")
    update(m, now=10.1, beats=[b], lease_record=lease(ttl_ms=10_000))
    assert row(m, "a")[:2] == ("offline", "dead")


def test_a_killed_leader_whose_heartbeat_is_still_fresh_is_superseded_not_active() -> None:
    """a led epoch 1 and was killed; b took the lease at epoch 2. a's last heartbeat is
    fresh for a while yet, but it cannot be active: one active row, b's."""
    m = model()
    beats = [beat("a", 5, role="active", epoch=1), beat("b", 5, role="active", epoch=2)]
    update(m, now=10.0, wall=T0 + 5, beats=beats, lease_record=lease("b", epoch=2))
    assert row(m, "a")[:2] == ("superseded", "fresh")
    assert row(m, "b")[:2] == ("active", "fresh")


def test_a_node_is_offline_after_node_offline_and_back_when_it_beats_again() -> None:
    m, ev = model(), Events()
    update(m, now=10.0, wall=T0 + 5, beats=[beat("a", 5, role="active"), beat("b", 5)])
    assert row(m, "a") == ("active", "fresh", 0.0)
    update(m, now=10.2, beats=[beat("a", 5, role="active"), beat("b", 5)],
           events=[ev("a", "node.offline", T0 + 10.1)])  # fmt: skip
    assert row(m, "a")[:2] == ("offline", "fresh")  # it said so: no need to wait for the TTL
    assert row(m, "b")[0] == "standby"
    update(m, now=10.6, beats=[beat("a", 5, role="active"), beat("b", 6)])
    assert row(m, "a")[0] == "offline"  # its old beat, unchanged, does not bring it back
    update(m, now=11.0, beats=[beat("a", 6, role="standby"), beat("b", 6)])
    assert row(m, "a") == ("standby", "fresh", 0.0)


def test_a_node_whose_heartbeat_vanished_stays_listed_as_offline_until_it_beats_again() -> None:
    m = model()
    update(m, now=10.0, wall=T0 + 5, beats=[beat("a", 5, role="active"), beat("b", 5)])
    assert row(m, "a") == ("active", "fresh", 0.0)
    update(m, now=10.4, beats=[beat("b", 6)])  # a's heartbeat removed (a graceful stop)
    assert [v.node for v in m.nodes()] == ["a", "b"]
    assert row(m, "a")[0] == "offline"
    assert row(m, "b")[0] == "standby"
    update(m, now=30.0, beats=[beat("b", 7)])
    assert [v.node for v in m.nodes()] == ["a", "b"]
    assert row(m, "a")[:2] == ("offline", "dead")
    update(m, now=31.0, beats=[beat("a", 1, role="starting"), beat("b", 8)])  # restarted
    assert row(m, "a") == ("starting", "fresh", 0.0)


def test_a_dead_node_whose_heartbeat_is_dropped_leaves_the_view_with_its_events() -> None:
    """hb forget drops a dead node's heartbeat (it refuses a live one): the monitor drops
    the node and its events, and tells the event log once."""
    m, ev = model(), Events()
    update(m, now=10.0, wall=T0 + 5, beats=[beat("a", 5, role="active"), beat("b", 5)],
           events=[ev("a", "agent.step", T0 + 4), ev("b", "node.standby", T0 + 4.5)])  # fmt: skip
    update(m, now=13.0, beats=[beat("a", 5, role="active"), beat("b", 9)])  # a: dead (TTL 2 s)
    assert row(m, "a")[:2] == ("offline", "dead")
    update(m, now=13.5, beats=[beat("b", 10)])  # forgotten
    assert [v.node for v in m.nodes()] == ["b"]
    assert [e.node for e in m.events] == ["b"]
    assert m.drain_forgotten() == ["a"]
    assert m.drain_forgotten() == []
    update(m, now=14.0, beats=[beat("b", 11)])
    assert [v.node for v in m.nodes()] == ["b"]


def test_a_node_offline_older_than_the_current_heartbeat_does_not_mark_it_offline() -> None:
    m, ev = model(), Events()
    # The monitor's first poll reads the whole history: a stopped at T0 + 5, restarted,
    # and has beaten since (its heartbeat is from T0 + 60).
    update(m, now=100.0, wall=T0 + 60.1, events=[ev("a", "node.offline", T0 + 5)],
           beats=[beat("a", 3, time=T0 + 60, role="active")])  # fmt: skip
    assert row(m, "a")[:2] == ("active", "fresh")


# -- ages on the monitor's clock ---------------------------------------------------


def test_first_sight_is_aged_by_wall_time_clamped_at_zero() -> None:
    m = model()
    update(m, now=50.0, wall=T0 + 1.5, beats=[beat("a", time=T0), beat("b", time=T0 + 10)])
    assert row(m, "a") == ("standby", "late", 1.5)
    assert row(m, "b") == ("standby", "fresh", 0.0)  # written "in the future": clamped
    update(m, now=50.25, wall=T0 + 1.75, beats=[beat("a", time=T0), beat("b", time=T0 + 10)])
    assert row(m, "a")[2] == 1.75
    assert row(m, "b")[2] == 0.25


@pytest.mark.parametrize("offset", [3600.0, -3600.0])
def test_a_wall_clock_an_hour_off_does_not_matter_once_a_change_is_seen(offset: float) -> None:
    m = model()
    checkpoint = CheckpointInfo(epoch=1, seq=1, size=10, written=T0)
    update(m, now=500.0, wall=T0 + offset, beats=[beat("a", 1, time=T0)],
           checkpoints=[checkpoint])  # fmt: skip
    first = row(m, "a")
    assert first[2] == max(0.0, offset)  # the first look can only trust the writer's time
    # From the first change on, only this monitor's monotonic clock counts.
    update(m, now=500.4, wall=T0 + offset + 0.4, beats=[beat("a", 2, time=T0 + 0.4)],
           checkpoints=[CheckpointInfo(epoch=1, seq=2, size=10, written=T0 + 0.4)])  # fmt: skip
    assert row(m, "a") == ("standby", "fresh", 0.0)
    update(m, now=501.1, wall=T0 - offset, beats=[beat("a", 2, time=T0 + 0.4)],
           checkpoints=[CheckpointInfo(epoch=1, seq=2, size=10, written=T0 + 0.4)])  # fmt: skip
    assert row(m, "a") == ("standby", "fresh", 0.7)
    update(m, now=501.9, wall=T0 + offset * 2, beats=[beat("a", 2, time=T0 + 0.4)],
           checkpoints=[CheckpointInfo(epoch=1, seq=2, size=10, written=T0 + 0.4)])  # fmt: skip
    assert row(m, "a") == ("standby", "late", 1.5)
    progress = m.progress()
    assert progress is not None
    assert round(progress.age_s, 6) == 1.5


# -- the lease ---------------------------------------------------------------------


def test_lease_expiry_counts_down_from_the_ttl_since_the_record_last_changed() -> None:
    m = model()
    assert m.lease_view() is None  # no lease yet
    update(m, now=10.0, lease_record=lease("a", epoch=3, renewals=1, version=4))
    assert m.lease_view() == LeaseView("a", "eu", 3, 2.0, 0.0)
    update(m, now=10.5, lease_record=lease("a", epoch=3, renewals=1, version=4))
    view = m.lease_view()
    assert view is not None and view.expires_in_s == pytest.approx(1.5)
    update(m, now=11.2, lease_record=lease("a", epoch=3, renewals=1, version=4))
    view = m.lease_view()
    assert view is not None and view.expires_in_s == pytest.approx(0.8)
    update(m, now=11.3, lease_record=lease("a", epoch=3, renewals=2, version=5))  # renewed
    assert m.lease_view() == LeaseView("a", "eu", 3, 2.0, 0.0)
    update(m, now=11.9, lease_record=lease("a", epoch=3, renewals=2, version=5))
    view = m.lease_view()
    assert view is not None and view.expires_in_s == pytest.approx(1.4)
    # Released: no holder, no expiry.
    update(m, now=12.0, lease_record=lease(None, epoch=3, renewals=2, version=6))
    assert m.lease_view() == LeaseView(None, "eu", 3, None)
    # Taken by another node, with its own TTL.
    update(m, now=13.0, lease_record=lease("b", epoch=4, version=7, ttl_ms=5000))
    assert m.lease_view() == LeaseView("b", "eu", 4, 5.0, 0.0, 5.0)


def test_lease_expiry_ignores_the_wall_clock() -> None:
    m = model()
    update(m, now=10.0, wall=T0 + 3600, lease_record=lease("a"))
    assert m.lease_view() == LeaseView("a", "eu", 1, 2.0, 0.0)
    update(m, now=11.0, wall=T0 - 3600, lease_record=lease("a"))
    view = m.lease_view()
    assert view is not None and view.expires_in_s == pytest.approx(1.0)


def test_a_lease_first_seen_is_aged_by_its_holders_heartbeat_not_by_the_monitors_start() -> None:
    """A monitor started long after the holder died says the lease expired long ago."""
    m = model()
    wall = T0 + 100.0  # the holder's last heartbeat (and renewal) was 35 s ago
    update(m, now=10.0, wall=wall, lease_record=lease("a", epoch=3),
           beats=[beat("a", time=wall - 35.0, role="active", epoch=3)])  # fmt: skip
    view = m.lease_view()
    assert view is not None and view.renewed_s == pytest.approx(35.0)
    assert view.expires_in_s == pytest.approx(2.0 - 35.0)
    # Then on the monitor's own clock: two seconds later it is 37 s.
    update(m, now=12.0, wall=wall + 2.0, lease_record=lease("a", epoch=3),
           beats=[beat("a", time=wall - 35.0, role="active", epoch=3)])  # fmt: skip
    view = m.lease_view()
    assert view is not None and view.renewed_s == pytest.approx(37.0)


def test_a_lease_first_seen_without_a_heartbeat_is_aged_by_its_acquisition_event() -> None:
    m = model()
    acquired = Event("b", 1, "lease.acquired", T0 + 4.0, epoch=2, detail={"via": "expired"})
    update(m, now=10.0, wall=T0 + 10.0, lease_record=lease("b", epoch=2), events=[acquired])
    view = m.lease_view()
    assert view is not None and view.renewed_s == pytest.approx(6.0)
    # A heartbeat of an older epoch (the node before it won) says nothing of this lease.
    m2 = model()
    update(m2, now=10.0, wall=T0 + 10.0, lease_record=lease("b", epoch=2),
           beats=[beat("b", time=T0, role="standby", epoch=1)])  # fmt: skip
    view = m2.lease_view()
    assert view is not None and view.renewed_s == pytest.approx(0.0)


# -- the takeover timeline ----------------------------------------------------------


def test_timeline_has_each_epoch_in_order_with_previous_holder_via_and_the_written_gap() -> None:
    """Each line's gap is the one its taker wrote into its lease.acquired event: publishes,
    resumes and the time between the events do not move it."""
    m, ev = model(), Events()
    history = [
        ev("a", "lease.acquired", T0 + 0.0, epoch=1, via="empty", gap_ms=0),
        ev("a", "agent.started", T0 + 0.01, epoch=1),
        ev("a", "checkpoint.published", T0 + 3.0, epoch=1),
        ev("b", "lease.acquired", T0 + 5.1, epoch=2, via="expired", gap_ms=2004),
        ev("b", "agent.resumed", T0 + 9.9, epoch=2),  # a slow restore: no part of the gap
        ev("c", "lease.acquired", T0 + 20.0, epoch=3, via="released", gap_ms=12),
    ]
    update(m, now=1.0, events=history)
    lines = m.timeline()
    assert [(t.epoch, t.node, t.previous, t.via, t.gap_ms) for t in lines] == [
        (1, "a", None, "empty", 0),
        (2, "b", "a", "expired", 2004),
        (3, "c", "b", "released", 12),
    ]
    assert lines[1].time == T0 + 5.1


def test_the_timeline_shows_the_lease_records_gap_and_none_where_none_was_written() -> None:
    """An event without a gap (or with junk for one) shows none, until the lease record's
    history, the one hb history prints, names that epoch's."""
    m, ev = model(), Events()
    update(m, now=1.0, events=[
        ev("a", "lease.acquired", T0 + 0.0, epoch=1, via="empty"),
        ev("b", "lease.acquired", T0 + 5.0, epoch=2, via="expired", gap_ms="2004"),
        ev("a", "lease.acquired", T0 + 9.0, epoch=3, via="expired", gap_ms=-5),
    ])  # fmt: skip
    assert [t.gap_ms for t in m.timeline()] == [None, None, None]
    taken = Takeover(epoch=2, to="b", via="expired", gap_ms=2004, time=T0 + 5.0, from_="a")
    update(m, now=2.0, lease_record=replace(lease("b", epoch=2), history=(taken,)))
    assert [t.gap_ms for t in m.timeline()] == [None, 2004, None]


def test_the_previous_holder_is_right_when_takeovers_arrive_out_of_order() -> None:
    m, ev = model(), Events()
    update(m, now=1.0, events=[ev("a", "lease.acquired", T0 + 0.0, epoch=1, via="free")])
    update(m, now=2.0, events=[ev("c", "lease.acquired", T0 + 9.0, epoch=3, via="expired")])
    update(m, now=3.0, events=[ev("b", "lease.acquired", T0 + 5.0, epoch=2, via="expired")])
    assert [(t.epoch, t.node, t.previous) for t in m.timeline()] == [
        (1, "a", None),
        (2, "b", "a"),
        (3, "c", "b"),
    ]


# -- progress, the event log ---------------------------------------------------------


def test_progress_shows_the_newest_checkpoint_aged_since_it_changed() -> None:
    m = model()
    update(m, now=5.0)
    assert m.progress() is None
    newest = CheckpointInfo(epoch=2, seq=41, size=1234, written=T0 + 4.0)
    older = CheckpointInfo(epoch=2, seq=40, size=1200, written=T0 + 3.0)
    update(m, now=5.0, checkpoints=[newest, older])  # newest first, as stores list them
    assert m.progress() == ProgressView(41, 2, 1.0, 1234)
    update(m, now=6.5, checkpoints=[newest, older])
    assert m.progress() == ProgressView(41, 2, 2.5, 1234)
    update(m, now=7.0, checkpoints=[CheckpointInfo(3, 42, 99, T0 + 6.9), newest])
    assert m.progress() == ProgressView(42, 3, 0.0, 99)


def test_events_are_kept_in_time_order_and_counted() -> None:
    m, ev = model(), Events()
    late, early = ev("b", "node.standby", T0 + 2.0), ev("a", "node.online", T0 + 1.0)
    update(m, now=1.0, events=[late, early])
    assert list(m.events) == [early, late]
    assert m.events_seen == 2


def test_memory_stays_bounded_over_100k_events() -> None:
    m = model()
    nodes = [f"node-{i:02d}" for i in range(50)]
    n: dict[str, int] = {}
    epoch, batch, fed = 1, [], 0
    for i in range(100_000):
        node = nodes[i % 50]
        n[node] = n.get(node, 0) + 1
        if i % 20 == 0:  # a takeover every 20 events: 5,000 epochs
            epoch += 1
            kind = "lease.acquired"
        else:
            kind = ("agent.resumed", "checkpoint.published", "agent.step")[i % 3]
        batch.append(Event(node, n[node], kind, T0 + i / 1000, epoch=epoch, detail={"via": "x"}))
        if len(batch) == 1000:
            update(m, now=i / 1000, events=batch, beats=[beat(x, i) for x in nodes[:5]])
            fed += len(batch)
            batch = []
    assert fed == m.events_seen == 100_000
    assert m.events.maxlen == MAX_EVENTS == 2000
    assert len(m.events) == MAX_EVENTS
    assert m.events[-1].time == T0 + 99_999 / 1000  # the newest are kept
    assert len(m._takeovers) <= MAX_TAKEOVERS
    assert max(m._takeovers) == epoch  # the oldest are the ones dropped
    assert len(m.timeline()) <= MAX_TAKEOVERS
    assert len(m.heartbeats) == len(m._beat_seen) == 5


# -- the kill button ---------------------------------------------------------------


def _with_active(pid: int, host: str = HERE) -> ClusterModel:
    m = model()
    update(m, now=1.0, beats=[beat("a", role="active", host=host, pid=pid), beat("b")],
           lease_record=lease("a"))  # fmt: skip
    return m


def started(argv: list[str], timeout: float = 10.0) -> subprocess.Popen[bytes]:
    """Popen(argv), returned once /proc shows the child running argv.

    Right after Popen the child may still be in exec: its command line then
    reads empty, or as its parent's (pytest's). Polled, at most timeout seconds.
    """
    process = subprocess.Popen(argv)
    expected = b"".join(arg.encode() + b"\0" for arg in argv)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{process.pid}/cmdline").read_bytes() != expected:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait(timeout=30)
            raise AssertionError(f"{argv} did not start within {timeout} s")
        time.sleep(0.001)
    return process


def _node_like_process() -> subprocess.Popen[bytes]:
    """A live process whose command line names hamsterbunker, as a node's does."""
    code = "import sys, time; time.sleep(60)"
    return started([sys.executable, "-c", code, "hamsterbunker-test-node"])


def test_kill_target_is_the_active_node_on_this_host_with_a_live_process() -> None:
    process = _node_like_process()
    try:
        target = kill_target(_with_active(process.pid))
        assert (target.node, target.pid) == ("a", process.pid)
        assert str(process.pid) in target.reason
    finally:
        process.kill()
        process.wait(timeout=30)


def test_kill_is_disabled_when_the_pid_now_belongs_to_another_program() -> None:
    """A reused pid (alive, but not a node) is never offered for killing."""
    # Not python: its path names the checkout, which may well be called hamsterbunker.
    process = started(["sleep", "60"])
    try:
        target = kill_target(_with_active(process.pid))
        assert (target.node, target.pid) == (None, None)
        assert str(process.pid) in target.reason
    finally:
        process.kill()
        process.wait(timeout=30)


def test_kill_is_disabled_for_a_reused_pid_caught_between_fork_and_exec() -> None:
    """A child forked by a node shows the node's command line until it execs: not a node.

    The child here never execs, so the moment a real one passes through is held still.
    """
    code = (
        "import os, sys, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "time.sleep(60)\n"
    )
    argv = [sys.executable, "-c", code, "hamsterbunker-test-node"]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert (
            Path(f"/proc/{child}/cmdline").read_bytes()
            == Path(f"/proc/{parent.pid}/cmdline").read_bytes()
        )
        target = kill_target(_with_active(child))
        assert (target.node, target.pid) == (None, None)
        assert target.reason == f"a's process {child} is not running here"
        assert kill_target(_with_active(parent.pid)).pid == parent.pid  # the node itself is
    finally:
        os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait(timeout=30)


def test_kill_is_disabled_for_an_active_node_on_another_host() -> None:
    target = kill_target(_with_active(os.getpid(), host="elsewhere-7"))
    assert (target.node, target.pid) == (None, None)
    assert "elsewhere-7" in target.reason


def test_kill_is_disabled_when_the_active_process_is_gone() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    assert process.wait(timeout=30) == 0
    target = kill_target(_with_active(process.pid))
    assert (target.node, target.pid) == (None, None)
    assert str(process.pid) in target.reason


def test_kill_is_disabled_without_an_active_node() -> None:
    assert kill_target(model()) == KillTarget(None, None, "no active node")
    m = _with_active(os.getpid())
    update(m, now=5.0, beats=[beat("a", role="active", pid=os.getpid()), beat("b", 9)],
           lease_record=lease("a"))  # fmt: skip
    assert row(m, "a")[0] == "offline"  # its heartbeat went silent past the TTL
    assert kill_target(m).node is None
    update(m, now=5.1, beats=[beat("b", 10)], lease_record=lease(None, version=2))
    assert kill_target(m) == KillTarget(None, None, "no active node")


def test_an_unreadable_lease_is_kept_as_the_reason_and_disables_the_kill() -> None:
    """The lease record did not parse: no holder is known, the nodes are still listed."""
    m = _with_active(os.getpid())
    beats = [beat("a", 2, role="active", pid=os.getpid()), beat("b", 2)]
    m.update([], beats, None, [], now=1.5, wall=T0 + 1.5, lease_error="lease record is odd")
    assert (m.lease, m.lease_error, m.lease_view()) == (None, "lease record is odd", None)
    assert [v.node for v in m.nodes()] == ["a", "b"]
    assert kill_target(m) == KillTarget(None, None, "the lease record is unreadable")
    update(m, now=1.6, beats=beats, lease_record=lease("a"))  # repaired
    assert m.lease_error is None and m.lease_view() is not None
    assert m.active_node() is not None


# -- format_age ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "—"),
        (-3.0, "0.0 s"),
        (0.0, "0.0 s"),
        (1.24, "1.2 s"),
        (9.94, "9.9 s"),
        (10.0, "10 s"),
        (45.2, "45 s"),
        (60.0, "1 m 00 s"),
        (185.0, "3 m 05 s"),
        (3599.0, "59 m 59 s"),
        (3600.0, "1 h 00 m"),
        (7800.0, "2 h 10 m"),
        (90000.0, "25 h 00 m"),
        (99 * 3600 + 59 * 60, "99 h 59 m"),
        (100 * 3600, "4 d"),
        (9999 * 86400 + 86399, "9999 d"),
        (10_000 * 86400, "> 9999 d"),
        (1e300, "> 9999 d"),
    ],
)
def test_format_age(seconds: float | None, shown: str) -> None:
    assert format_age(seconds) == shown
