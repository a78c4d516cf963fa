"""A switchover judges liveness at once from fresh records, else by the watch
(``hamsterbunker.lease.control.request_switchover``).

No nodes: the lease record and the heartbeats are written by hand into a memory store,
the wall clock is injected, and the watch's sleep is counted (a fast path never sleeps).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hamsterbunker.lease.control import ControlRefused, open_control, request_switchover
from hamsterbunker.records import Heartbeat, LeaseRecord
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.testing import MemoryStore
from tests.support.agents import AGENT, SECRET

NOW = 1_800_000_000.0  # the asking machine's wall clock, injected
TTL_MS = 2000
EPOCH = 3
SESSION = "0a1b2c3d"


@pytest.fixture(scope="module")
def sealer() -> Sealer:
    return Sealer(SECRET, new_cluster_record(SECRET))


def beat(node: str, age_s: float, **changes: Any) -> Heartbeat:
    """A heartbeat written age_s before NOW: a leads, b and c stand by at its epoch."""
    leads = node == "a"
    made = Heartbeat(
        node=node, region="r1", host="h", pid=1, role="active" if leads else "standby",
        epoch=EPOCH, seq=7, leader="a", time=NOW - age_s, beats=10,
        lease_session=SESSION if leads else "ffff" + node.encode().hex(),
    )  # fmt: skip
    return replace(made, **changes)


class Watched:
    """The watch's clock and sleep: time passes only in sleep, and nothing changes meanwhile."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


def cluster(
    *beats: Heartbeat, written_age_s: float = 0.1, holder: str = "a"
) -> tuple[MemoryStore, dict[str, int]]:
    """A store with a's lease (written written_age_s before NOW) and beats; the count of
    its lease and heartbeat reads."""
    store = MemoryStore()
    lease = LeaseRecord(
        holder=holder, region="r1", session=SESSION, epoch=EPOCH, ttl_ms=TTL_MS,
        written=NOW - written_age_s,
    )  # fmt: skip
    store.cas_lease(AGENT, None, lease)
    for made in beats or (beat("a", 0.1), beat("b", 0.6), beat("c", 0.3)):
        store.put_heartbeat(AGENT, made)
    reads = {"read_lease": 0, "list_heartbeats": 0}
    for name in reads:
        read = getattr(store, name)

        def counted(*args: Any, _read: Any = read, _name: str = name) -> Any:
            reads[_name] += 1
            return _read(*args)

        setattr(store, name, counted)
    return store, reads


def asked(store: MemoryStore, sealer: Sealer) -> tuple[str | None, int]:
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.control
    control = open_control(sealer, lease.control, AGENT)
    return control.switchover_to, control.switchover_epoch


def switch(store: MemoryStore, sealer: Sealer, watched: Watched, to: str | None) -> str:
    return request_switchover(
        store, sealer, AGENT, to, clock=watched.clock, sleep=watched.sleep, wall=lambda: NOW
    )


def test_fresh_records_get_the_request_written_at_once(sealer: Sealer) -> None:
    """Fresh heartbeats of this term and a lease written within its TTL: one read of each,
    no watch, the request written for the named standby and the lease's epoch."""
    store, reads = cluster()
    watched = Watched()
    assert switch(store, sealer, watched, "b") == "b"
    assert watched.sleeps == 0
    assert reads == {"read_lease": 2, "list_heartbeats": 1}  # the second: the write's own
    assert asked(store, sealer) == ("b", EPOCH)


def test_without_a_target_the_freshest_standby_is_asked_at_once(sealer: Sealer) -> None:
    store, _ = cluster()
    watched = Watched()
    assert switch(store, sealer, watched, None) == "c"  # beat 0.3 s ago; b 0.6 s ago
    assert watched.sleeps == 0
    assert asked(store, sealer) == ("c", EPOCH)


def test_a_node_two_clocks_apart_by_a_little_is_live_at_once(sealer: Sealer) -> None:
    """A target dated a little ahead of this machine's clock (within MAX_AHEAD_S)."""
    store, _ = cluster(beat("a", 0.1), beat("b", -0.3))
    watched = Watched()
    assert switch(store, sealer, watched, "b") == "b"
    assert watched.sleeps == 0


@pytest.mark.parametrize(
    ("beats", "written_age_s"),
    [
        ((beat("a", 0.1), beat("b", TTL_MS / 1000 + 0.1)), 0.1),  # b's beat older than a TTL
        ((beat("a", 0.1), beat("b", -5.0)), 0.1),  # b's clock far ahead of ours
        ((beat("a", 0.1), beat("b", 0.1)), TTL_MS / 1000 + 0.1),  # the lease not renewed
        ((beat("a", 0.1), beat("b", 0.1)), -5.0),  # the lease dated far ahead
        ((beat("a", 3.0), beat("b", 0.1)), 0.1),  # a's beat older than a TTL
        ((beat("a", 0.1, lease_session="0a0a"), beat("b", 0.1)), 0.1),  # a's of another term
        ((beat("a", 0.1), beat("b", 0.1, epoch=EPOCH - 2)), 0.1),  # b missed two terms
        ((beat("a", 0.1), beat("b", 0.1, role="stopping")), 0.1),
        ((beat("a", 0.1), beat("b", 0.1, time=0.0)), 0.1),
    ],
    ids=[
        "target-stale", "target-ahead", "lease-stale", "lease-ahead", "leader-stale",
        "leader-other-session", "target-older-epoch", "target-stopping",
        "target-undated",
    ],
)  # fmt: skip
def test_records_that_do_not_tell_leave_it_to_the_watch(
    sealer: Sealer, beats: tuple[Heartbeat, ...], written_age_s: float
) -> None:
    """Nothing changes while watched here: the watch runs its whole TTL and refuses as it
    always did, and nothing is written."""
    store, _ = cluster(*beats, written_age_s=written_age_s)
    watched = Watched()
    with pytest.raises(ControlRefused, match="did not renew its lease while watched"):
        switch(store, sealer, watched, "b")
    assert watched.now >= TTL_MS / 1000
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.control == ""


def test_the_watch_still_asks_a_target_it_sees_live(sealer: Sealer) -> None:
    """A target dated far ahead is not judged by its age: the watch sees the leader renew
    and the target beat, and then the request is written."""
    store, _ = cluster(beat("a", 0.1), beat("b", -5.0))
    watched = Watched()
    sleep = watched.sleep

    def renewing(seconds: float) -> None:
        sleep(seconds)
        if watched.sleeps == 2:
            lease = store.read_lease(AGENT)
            assert lease is not None
            store.cas_lease(AGENT, lease.version, replace(lease, renewals=lease.renewals + 1))
            store.put_heartbeat(AGENT, beat("b", -5.0, beats=11))

    watched.sleep = renewing  # type: ignore[method-assign]
    assert switch(store, sealer, watched, "b") == "b"
    assert watched.sleeps == 2
    assert asked(store, sealer) == ("b", EPOCH)


def test_the_leader_named_as_target_is_refused_at_once(sealer: Sealer) -> None:
    store, _ = cluster()
    watched = Watched()
    with pytest.raises(ControlRefused, match="a leads agent 'a' already"):
        switch(store, sealer, watched, "a")
    assert watched.sleeps == 0
