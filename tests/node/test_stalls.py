"""A node that cannot make progress says so and lets go; nothing waits on the store for ever.

* a term that cannot publish, or cannot restore, for a full TTL gives the lease
  up (``lease.given_up``) so that another node can try;
* ``stop()`` returns within its timeout whatever the store or a sync step does;
* the lease is judged on a clock that counts suspend (CLOCK_BOOTTIME), and a
  step finished after a jump of that clock is not published before a renewal;
* a sync step can see that it may no longer be published
  (``current_step().lost``, ``current_step().check()``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hamsterbunker.agent.step import current_step
from hamsterbunker.core import clock as clock_module
from hamsterbunker.core.blob import Blob
from hamsterbunker.core.clock import FakeClock, MonotonicClock
from hamsterbunker.core.errors import StepLost, StoreUnavailable
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.records import CheckpointInfo, LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import SECRET, AsyncAgent, CountingAgent, Recorder

AGENT = "a"
TICK_MS, TTL_MS = 100, 600


class SteerableStore:
    """A MemoryStore whose calls can be made to fail or to hang, per operation."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner
        self.failing: set[str] = set()  # operations that raise StoreUnavailable
        self.hanging: set[str] = set()  # operations that block until `unhang` is set
        self.unhang = threading.Event()
        self.hung = threading.Event()  # set once a call is hanging

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def steered(*args: Any, **kwargs: Any) -> Any:
            if name in self.hanging:
                self.hung.set()
                self.unhang.wait(60)
            if name in self.failing:
                raise StoreUnavailable(f"injected: {name} fails")
            return method(*args, **kwargs)

        return steered

    # Named so that the Store protocol's attribute checks see them.
    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: Blob) -> CheckpointInfo:
        return self.__getattr__("put_checkpoint")(agent, fence, seq, blob)  # type: ignore[no-any-return]

    def cas_lease(self, agent: str, expected: int | None, new: LeaseRecord) -> LeaseRecord:
        return self.__getattr__("cas_lease")(agent, expected, new)  # type: ignore[no-any-return]

    # Made of the steered calls, so that a takeover's and a restore's are steered too.
    take_lease = Store.take_lease
    put_checkpoint_and_release = Store.put_checkpoint_and_release
    read_for_restore = Store.read_for_restore


class Cluster:
    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.events = Recorder()
        self.made: list[tuple[Runtime, CountingAgent, SteerableStore]] = []

    def start(
        self, node_id: str, agent: CountingAgent, **kwargs: Any
    ) -> tuple[Runtime, SteerableStore]:
        store = SteerableStore(self.memory)
        node = Runtime(
            node_id=node_id,
            region="r1",
            store=store,  # type: ignore[arg-type]
            agent=agent,  # type: ignore[arg-type]
            secret=SECRET,
            timing=LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS),
            on_event=self.events,
            **{"stop_grace_ms": 0, **kwargs},  # parked steps: no grace to wait out
        )
        self.made.append((node, agent, store))
        node.start()
        return node, store

    def close(self) -> None:
        for node, agent, store in self.made:
            agent.release.set()
            store.unhang.set()
            store.failing.clear()
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        yield made
    finally:
        made.close()


# -- case 6: a term that cannot make progress gives the lease up ------------------------------------


def test_a_leader_that_cannot_publish_for_a_ttl_gives_the_lease_up(cluster: Cluster) -> None:
    """A leader whose every publish fails for a full TTL (the store refuses it, the same error
    each time) releases the lease with a lease.given_up event naming the error; the standby takes
    over at once and publishes from the last checkpoint."""
    leader, leader_store = cluster.start("node-a", AsyncAgent(AGENT))
    cluster.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == 2)
    cluster.start("node-b", AsyncAgent(AGENT))
    cluster.events.wait("node.standby", "node-b")
    leader_store.failing.add("put_checkpoint")
    given_up = cluster.events.wait("lease.given_up", "node-a")
    assert "could not publish for a full TTL" in given_up.detail["reason"]
    assert "put_checkpoint fails" in given_up.detail["reason"]
    failed = cluster.events.of("checkpoint.failed", "node-a")
    assert failed and given_up.time - failed[0].time >= TTL_MS / 1000 * 0.9
    resumed = cluster.events.wait("agent.resumed", "node-b")
    assert resumed.detail["from_seq"] >= 2
    cluster.events.wait("checkpoint.published", "node-b")
    assert not leader.stopped.is_set()  # a standby now, not dead


def test_a_leader_that_cannot_restore_for_a_ttl_gives_the_lease_up(cluster: Cluster) -> None:
    """A new leader that cannot read the checkpoints for a full TTL gives the lease up instead
    of holding it while the agent stands still; the other node then restores."""
    first, _ = cluster.start("node-a", AsyncAgent(AGENT))
    cluster.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == 2)
    first.stop()
    broken_agent = AsyncAgent(AGENT)
    _, broken = cluster.start("node-b", broken_agent)
    broken.failing.add("read_checkpoint")
    cluster.events.wait("lease.acquired", "node-b")
    cluster.start("node-c", AsyncAgent(AGENT))
    given_up = cluster.events.wait("lease.given_up", "node-b")
    assert "could not restore for a full TTL" in given_up.detail["reason"]
    cluster.events.wait("agent.resumed", "node-c")
    assert broken_agent.entered == []


@pytest.mark.parametrize("operation", ["put_checkpoint", "cas_lease", "remove_heartbeat"])
def test_stop_returns_within_its_timeout_when_the_store_hangs(
    cluster: Cluster, operation: str
) -> None:
    """With the store hanging in a checkpoint write, a lease renewal or the shutdown's own
    calls, stop(timeout) still returns within its timeout (no TimeoutError)."""
    node, store = cluster.start("node-a", AsyncAgent(AGENT))
    cluster.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == 2)
    store.hanging.add(operation)
    if operation != "remove_heartbeat":  # (that one is called only by the stop)
        assert store.hung.wait(10), f"the node did not call {operation}"
    started = time.monotonic()
    node.stop(timeout=3)
    assert node.stopped.is_set()
    assert time.monotonic() - started < 3.5


def test_stop_returns_within_its_timeout_while_a_sync_step_never_ends(cluster: Cluster) -> None:
    """A sync step that never returns is abandoned at stop: stop(timeout) returns in time."""

    class Stuck(CountingAgent):
        def step(self, state: dict[str, Any]) -> dict[str, Any]:
            self._enter(state)
            self.release.wait(60)
            return state

    agent = Stuck(AGENT)
    node, _ = cluster.start("node-a", agent)
    wait_until(lambda: agent.entered, "the step to start")
    started = time.monotonic()
    node.stop(timeout=3)
    assert time.monotonic() - started < 3.5
    cluster.events.wait("lease.released", "node-a")


# -- case 8: suspend ------------------------------------------------------------------------------


def test_the_default_lease_clock_counts_suspend(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Linux the lease clock is CLOCK_BOOTTIME, which goes on during suspend, not
    CLOCK_MONOTONIC, which stops."""
    asked: list[int] = []
    real = time.clock_gettime

    def recording(clock_id: int) -> float:
        asked.append(clock_id)
        return real(clock_id)

    monkeypatch.setattr(time, "clock_gettime", recording)
    MonotonicClock().monotonic()
    assert clock_module.SUSPEND_AWARE
    assert asked == [time.CLOCK_BOOTTIME]


def test_a_step_finished_after_a_suspend_is_not_published_before_a_renewal(
    cluster: Cluster,
) -> None:
    """The machine suspends while a step runs (the injected lease clock jumps ten TTLs, while
    asyncio's clock does not): the step, finished right after, is not published, since a
    standby may have taken over meanwhile; once a renewal succeeds, stepping goes on."""
    lease_clock = FakeClock()
    agent = AsyncAgent(AGENT, park_from=3)
    _, store = cluster.start("node-a", agent, clock=lease_clock)
    wait_until(lambda: 3 in agent.entered_seqs(), "step 3 to start")
    store.hanging.add("cas_lease")  # nothing runs during a suspend: no renewal either
    lease_clock.advance(10 * TTL_MS / 1000)
    agent.release.set()
    yielded = cluster.events.wait("agent.yielded", "node-a")
    assert yielded.detail["step_seq"] == 3
    assert [e.seq for e in cluster.events.of("agent.step", "node-a")] == [1, 2]
    store.hanging.discard("cas_lease")
    store.unhang.set()
    cluster.events.wait("agent.step", "node-a", where=lambda e: e.seq == 3)


# -- case 10: a sync step is told it may no longer be published -----------------------------------


@pytest.mark.parametrize("how", ["lost", "check"])
def test_a_sync_step_sees_its_renew_deadline_pass_and_stops(cluster: Cluster, how: str) -> None:
    """A long sync step that looks at current_step().lost (or calls check()) between pieces of
    work stops soon after renewals stop succeeding, instead of running on into the next
    leader's term; its result is not published."""
    stopped_at: list[float] = []

    class Careful(CountingAgent):
        def step(self, state: dict[str, Any]) -> dict[str, Any]:
            context = self._enter(state)
            if context.seq < 3:
                return self._finish(context, state)
            deadline = time.monotonic() + 30
            try:
                while time.monotonic() < deadline:
                    if how == "check":
                        current_step().check()  # type: ignore[union-attr]
                    elif current_step().lost:  # type: ignore[union-attr]
                        break
                    time.sleep(0.01)
            except StepLost:
                pass
            stopped_at.append(time.monotonic())
            return self._finish(context, state)

    agent = Careful(AGENT)
    _, store = cluster.start("node-a", agent)
    wait_until(lambda: 3 in agent.entered_seqs(), "the long step to start")
    store.failing.add("cas_lease")
    failed_at = time.monotonic()
    wait_until(lambda: stopped_at, "the step to stop by itself", timeout=10)
    assert stopped_at[0] - failed_at < TTL_MS / 1000 * 2
    assert 3 not in [e.seq for e in cluster.events.of("agent.step", "node-a")]
