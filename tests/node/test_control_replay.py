"""An older operator's request put back in the lease record: never obeyed, never passed on.

A store writer without the secret can copy an older genuine control request
(a pause since resumed) back into the lease record, or empty the field. The
running leader ignores it and writes the newest request it saw back at its
next renewal; a node restarted with the same state directory remembers the
newest request (``hamsterbunker.lease.memory``), so it neither obeys the older one
nor carries it on. The keeper tests run on a fake clock; the node tests run
real ``Runtime`` nodes in this process on every backend that keeps the lease
record whole (a syncdir store takes no operator's request: ``hb pause``
refuses it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper, Outcome
from hamsterbunker.lease.control import ControlView, open_control, set_paused
from hamsterbunker.lease.memory import MemoryFile
from hamsterbunker.ops.status import snapshot
from hamsterbunker.records import LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import Store, open_store
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder, SyncAgent
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=600)

Opener = Callable[[], Store]


def write_control(store: Store, text: str) -> LeaseRecord:
    """Put text into the lease record's control field, as a writer without the secret can."""
    for _ in range(50):
        lease = store.read_lease(AGENT)
        assert lease is not None
        with contextlib.suppress(Exception):
            return store.cas_lease(AGENT, lease.version, replace(lease, control=text))
    raise AssertionError("could not write the lease record")


# -- the keeper, on a fake clock -------------------------------------------------------


def paused_then_resumed(store: Store, sealer: Sealer) -> tuple[str, str]:
    """The signed texts of a pause and of the resume after it, as hb pause/resume wrote them."""
    paused = set_paused(store, sealer, AGENT, True).control
    resumed = set_paused(store, sealer, AGENT, False).control
    return paused, resumed


def carrying_keeper(store: Store, sealer: Sealer) -> tuple[LeaseKeeper, ControlView]:
    keeper = LeaseKeeper(store, AGENT, "node-a", "r1", clock=FakeClock())
    view = ControlView(sealer, AGENT)
    keeper.carry_control_by(view.carried)
    return keeper, view


@pytest.mark.parametrize("put_back", ["older pause", "emptied"])
def test_the_leaders_next_renewal_writes_the_newest_request_back(put_back: str) -> None:
    """A leader that adopted a record with an older request (or none) put in it writes the
    newest request it saw into its next renewal."""
    store, sealer = MemoryStore(), Sealer(SECRET, new_cluster_record(SECRET))
    paused, resumed = paused_then_resumed(store, sealer)
    keeper, view = carrying_keeper(store, sealer)
    assert keeper.tick().outcome is Outcome.ACQUIRED
    assert view.current is not None and not view.current.paused
    write_control(store, paused if put_back == "older pause" else "")
    assert keeper.changed_under_us() is not None  # adopted: still our term
    renewed = keeper.tick()
    assert renewed.outcome is Outcome.RENEWED
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.control == resumed
    assert not view.paused


def test_a_keeper_that_remembers_the_resume_takes_the_lease_without_the_older_pause() -> None:
    """A restarted node seeded with the newest request it remembers ignores an older one put
    back into the released lease record and writes the newest one into its acquisition."""
    store, sealer = MemoryStore(), Sealer(SECRET, new_cluster_record(SECRET))
    paused, resumed = paused_then_resumed(store, sealer)
    write_control(store, paused)
    keeper, view = carrying_keeper(store, sealer)
    view.remember(resumed)
    acquired = keeper.tick()
    assert acquired.outcome is Outcome.ACQUIRED and acquired.record is not None
    assert acquired.record.control == resumed
    assert view.read(acquired.record) is not None and not view.paused
    assert any("older" in problem for problem in view.drain_problems())


def test_a_newer_request_in_the_record_is_carried_as_it_is() -> None:
    """Carrying the newest request never undoes a newer one an operator wrote since."""
    store, sealer = MemoryStore(), Sealer(SECRET, new_cluster_record(SECRET))
    _, resumed = paused_then_resumed(store, sealer)
    keeper, view = carrying_keeper(store, sealer)
    view.remember(resumed)
    assert keeper.tick().outcome is Outcome.ACQUIRED
    paused_again = set_paused(store, sealer, AGENT, True).control
    keeper.changed_under_us()
    keeper.tick()
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.control == paused_again
    assert view.paused


def test_a_remembered_request_that_no_longer_authenticates_is_reported_and_not_obeyed() -> None:
    """A memory whose request no key of the cluster opens (its key retired while the node was
    down) starts the node from the lease record, and says why."""
    store, sealer = MemoryStore(), Sealer(SECRET, new_cluster_record(SECRET))
    other = Sealer(SECRET, new_cluster_record(SECRET))  # another salt: another key
    _, resumed_elsewhere = paused_then_resumed(MemoryStore(), other)
    paused = set_paused(store, sealer, AGENT, True).control
    _, view = carrying_keeper(store, sealer)
    view.remember(resumed_elsewhere)
    assert any("remembered" in problem for problem in view.drain_problems())
    assert view.carried(paused) == paused and view.paused


# -- real nodes, every backend ---------------------------------------------------------


@pytest.fixture(params=["file", "memory", "redis", "etcd"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a client on this test's store (the memory store: the one object)."""
    if request.param == "memory":
        shared = MemoryStore()
        return lambda: shared
    url = {
        "file": lambda: f"file://{tmp_path}/store",
        "redis": redis_url,
        "etcd": etcd_url,
    }[request.param]()
    return lambda: open_store(url)


class Nodes:
    """Runtime nodes of node id "a" on one store, started and stopped in turn."""

    def __init__(self, opener: Opener, state_dir: Path) -> None:
        self.opener, self.state_dir = opener, state_dir
        self.store = opener()
        self.events = Recorder()
        self.running: list[tuple[Runtime, SyncAgent]] = []

    def start(self) -> Runtime:
        agent = SyncAgent()
        node = Runtime(
            node_id="a", region="r1", store=self.opener(), agent=agent, on_event=self.events,
            secret=SECRET, timing=TIMING, state_dir=self.state_dir,
        )  # fmt: skip
        self.running.append((node, agent))
        node.start()
        return node

    def seq(self) -> int:
        return max((info.seq for info in self.store.list_checkpoints(AGENT)), default=0)

    def lease(self) -> LeaseRecord:
        """The lease record (an empty one, never written, before the first node wrote it)."""
        lease = self.store.read_lease(AGENT)
        return lease or LeaseRecord(holder=None, region="", session="", epoch=0, ttl_ms=600)

    def sealer(self) -> Sealer:
        cluster = self.store.read_cluster()
        assert cluster is not None
        return Sealer(SECRET, cluster)

    def remembered_control(self, node: Runtime) -> str:
        return MemoryFile(self.state_dir / ".memory", node.store.url, AGENT).load().control

    def close(self) -> None:
        for node, agent in self.running:
            agent.release.set()
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)
        self.store.close()


@pytest.fixture
def nodes(opener: Opener, tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(opener, tmp_path / "state")
    try:
        yield made
    finally:
        made.close()


def pause_and_resume(nodes: Nodes) -> tuple[str, str]:
    """Node a leads and steps, is paused, then resumed; the signed pause and resume."""
    wait_until(lambda: nodes.lease().holder == "a" and nodes.seq() >= 2, "a to lead and step")
    sealer = nodes.sealer()
    paused = set_paused(nodes.store, sealer, AGENT, True).control
    nodes.events.wait("agent.paused", node="a")
    resumed = set_paused(nodes.store, sealer, AGENT, False).control
    nodes.events.wait("agent.unpaused", node="a")
    return paused, resumed


def test_a_running_leader_writes_the_resume_back_over_the_older_pause_put_back(
    nodes: Nodes,
) -> None:
    """After pause and resume, the old pause copied back into the lease record is gone
    again after the leader's next renewal, and the leader steps on."""
    nodes.start()
    paused, resumed = pause_and_resume(nodes)
    replayed = write_control(nodes.store, paused)
    wait_until(
        lambda: (lease := nodes.lease()).version > replayed.version and lease.control == resumed,
        "a renewal to write the resume back",
    )
    seq = nodes.seq()
    wait_until(lambda: nodes.seq() >= seq + 3, "a to go on stepping")
    assert len(nodes.events.of("agent.paused", node="a")) == 1


def test_a_node_restarted_with_its_state_dir_ignores_an_older_pause_put_back(
    nodes: Nodes,
) -> None:
    """A node restarted with the same state directory, after the old pause was copied back
    into the lease record while it was down, steps, reports itself unpaused, and its
    renewals carry the resume, not the pause."""
    first = nodes.start()
    paused, resumed = pause_and_resume(nodes)
    # Kept at once, not only by the stop's last save: a crash now would keep it too.
    wait_until(lambda: nodes.remembered_control(first) == resumed, "the resume in memory")
    first.stop(timeout=20)
    write_control(nodes.store, paused)  # while no node runs: only a memory can tell
    seq = nodes.seq()
    second = nodes.start()
    wait_until(lambda: nodes.seq() >= seq + 3, "the restarted node to step")
    lease = nodes.lease()
    assert (lease.holder, lease.session) == ("a", second.keeper.session)
    assert lease.control == resumed
    assert not open_control(nodes.sealer(), lease.control, AGENT).paused
    assert not second.standing.paused  # what /health and the metrics show
    assert not snapshot(nodes.store, AGENT).paused  # what hb status shows
    assert len(nodes.events.of("agent.paused", node="a")) == 1  # the pause, before the restart
    ignored = nodes.events.of("control.ignored", node="a")
    assert any("older" in event.detail["reason"] for event in ignored)
