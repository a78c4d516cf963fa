"""The node runtime, in-process (DESIGN.md invariants 1, 3, 5, 6 and 7).

Every node is a real ``Runtime`` running its asyncio loop in a background
thread (``start()``), each with its *own* ``FileStore`` object on one shared
directory, as separate machines would see one store. Timing is short
(tick 100 ms, TTL 600 ms, renew deadline 360 ms) and every wait is bounded:
tests wait on conditions (events seen, files present), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import FileStore
from hamsterbunker.agent.step import current_step
from hamsterbunker.core.blob import Blob
from hamsterbunker.core.errors import (
    ConfigError,
    LeaseConflict,
    NoUsableCheckpoint,
    SecretTooShort,
    StoreRegressed,
    StoreUnavailable,
    WrongSecret,
)
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.records import CheckpointInfo, ClusterRecord, Event, LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.base import Fence, RestoreRead
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, AsyncAgent, CountingAgent, Recorder, SyncAgent
from tests.support.raw_store import RawRecords, file_key, file_keys

TICK_MS = 100
TTL_MS = 600
TTL_S = TTL_MS / 1000


# -- helpers -----------------------------------------------------------------


class FaultyStore:
    """Delegates to a FileStore; cas_lease fails and put_checkpoint blocks once armed."""

    def __init__(self, inner: FileStore) -> None:
        self._inner = inner
        self.fail_cas = threading.Event()
        # cas_lease waits while this is clear, as a node paused mid-renewal would
        self.cas_open = threading.Event()
        self.cas_open.set()
        self.cas_waiting = threading.Event()
        self.block_put = threading.Event()
        self.put_entered = threading.Event()
        self.put_release = threading.Event()
        self.fail_put_once: set[int] = set()  # seqs whose first put_checkpoint fails
        self.fail_reads: dict[int, int] = {}  # seq: how many of its reads fail
        # seqs whose first put_checkpoint is applied, then answered with an error
        # (a network store whose reply was lost)
        self.land_then_fail_once: set[int] = set()
        self.events_down = threading.Event()  # append_event fails while set

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    # Made of the calls above, so that their faults reach a takeover and a restore too.
    take_lease = Store.take_lease
    put_checkpoint_and_release = Store.put_checkpoint_and_release
    read_for_restore = Store.read_for_restore

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        if self.fail_cas.is_set():
            raise StoreUnavailable("injected: the store does not answer")
        if not self.cas_open.is_set():
            self.cas_waiting.set()
            self.cas_open.wait(30)
        return self._inner.cas_lease(agent, expected_version, new)

    def append_event(self, agent: str, event: Event) -> None:
        if self.events_down.is_set():
            raise StoreUnavailable("injected: the store does not answer")
        self._inner.append_event(agent, event)

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        if self.fail_reads.get(info.seq, 0) > 0:
            self.fail_reads[info.seq] -= 1
            raise StoreUnavailable("injected: the checkpoint read failed")
        return self._inner.read_checkpoint(agent, info)

    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: Blob) -> CheckpointInfo:
        if seq in self.fail_put_once:
            self.fail_put_once.discard(seq)
            raise StoreUnavailable("injected: the checkpoint write failed")
        if self.block_put.is_set():
            self.put_entered.set()
            self.put_release.wait(30)
        info = self._inner.put_checkpoint(agent, fence, seq, blob)
        if seq in self.land_then_fail_once:
            self.land_then_fail_once.discard(seq)
            raise StoreUnavailable("injected: the write was applied but its answer was lost")
        return info


class Harness:
    """Makes nodes on one store directory; stops every node (and unblocks every agent) at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.store_dir = tmp_path / "store"
        self.events = Recorder()
        self.nodes: list[Runtime] = []
        self._unblock: list[threading.Event] = []

    def store(self) -> FileStore:
        return FileStore(self.store_dir)

    def node(
        self,
        node_id: str,
        agent: CountingAgent,
        *,
        store: Any = None,
        start: bool = True,
        **kwargs: Any,
    ) -> Runtime:
        kwargs.setdefault("timing", LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS))
        kwargs.setdefault("secret", SECRET)
        # Most tests here stop nodes whose step is parked for good: no grace to wait out.
        # The tests of the stop grace set their own.
        kwargs.setdefault("stop_grace_ms", 0)
        if isinstance(store, FaultyStore):
            self._unblock += [store.put_release, store.cas_open]
        self._unblock.append(agent.release)
        node = Runtime(
            node_id=node_id,
            region="r1",
            store=store if store is not None else self.store(),
            agent=agent,  # type: ignore[arg-type]  # a subclass defines step()
            on_event=self.events,
            **kwargs,
        )
        self.nodes.append(node)
        if start:
            node.start()
        return node

    def checkpoints(self, agent: str = AGENT) -> list[tuple[int, int]]:
        """(seq, epoch) of every retained checkpoint, newest first."""
        return [(i.seq, i.epoch) for i in self.store().list_checkpoints(agent)]

    def key_path(self, key: str) -> Path:
        """The file of a key of the store (``stores.backends.file``)."""
        return file_key(self.store_dir, key)

    def checkpoint_path(self, seq: int, agent: str = AGENT) -> Path:
        """The file of checkpoint seq's sealed bytes."""
        found = list(self.key_path(AgentKeys(agent).ckpt).glob(f"{seq:020d}-*"))
        assert len(found) == 1, f"expected one file for checkpoint {seq}, found {found}"
        return found[0]

    def drop_checkpoint(self, seq: int, agent: str = AGENT) -> None:
        """Remove checkpoint seq, as a store gone back does."""
        self.checkpoint_path(seq, agent).unlink()

    def open_checkpoint(self, seq: int, agent: str = AGENT) -> dict[str, Any]:
        store = self.store()
        cluster = store.read_cluster()
        assert cluster is not None
        info = next(i for i in store.list_checkpoints(agent) if i.seq == seq)
        return Sealer(SECRET, cluster).open(
            store.read_checkpoint(agent, info), agent, info.epoch, seq
        )

    def close(self) -> None:
        for event in self._unblock:
            event.set()
        for node in self.nodes:
            # A test checks the errors it expects itself; here every node just has to end.
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)


@pytest.fixture
def hb(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def snapshot(root: Path) -> dict[str, tuple[bool, bytes | None, int]]:
    """Every file and directory under root: (is a directory, bytes, mtime in ns)."""
    found: dict[str, tuple[bool, bytes | None, int]] = {}
    for path in sorted(root.rglob("*")):
        st = path.stat()
        is_dir = path.is_dir()
        found[str(path.relative_to(root))] = (
            is_dir,
            None if is_dir else path.read_bytes(),
            st.st_mtime_ns,
        )
    found["."] = (True, None, root.stat().st_mtime_ns)
    return found


def stop_parked(node: Runtime, agent: CountingAgent, events: Recorder) -> None:
    """Stop a node whose sync step is parked: the lease goes first, then the step is let go."""
    node.request_stop()
    events.wait("node.offline", node.node_id)
    agent.release.set()
    node.stop(timeout=20)


# -- 1. current_step() -------------------------------------------------------


@pytest.mark.parametrize("agent_class", [AsyncAgent, SyncAgent], ids=["async", "sync"])
def test_current_step_reports_the_epoch_and_seq_the_checkpoint_carries(
    hb: Harness, agent_class: type[CountingAgent]
) -> None:
    """Inside a step (async, or sync in a thread) current_step() names agent, node, lease epoch and
    the seq its checkpoint is stored under; outside a step it is None.
    """
    agent_a = agent_class(park_from=3)
    node_a = hb.node("node-a", agent_a)
    wait_until(lambda: (2, 1) in hb.checkpoints(), "node-a to publish checkpoint 2 under epoch 1")
    agent_b = agent_class(park_from=4)
    node_b = hb.node("node-b", agent_b)
    hb.events.wait("node.standby", "node-b")
    stop_parked(node_a, agent_a, hb.events)  # hand over: node-b leads under epoch 2
    wait_until(lambda: (3, 2) in hb.checkpoints(), "node-b to publish checkpoint 3 under epoch 2")

    stored = dict(hb.checkpoints())
    published = [(c, "node-a") for c in agent_a.entered_ctx()[:2]] + [
        (c, "node-b") for c in agent_b.entered_ctx()[:1]
    ]
    assert [(c.seq, c.epoch) for c, _ in published] == [(1, 1), (2, 1), (3, 2)]
    for context, node_id in published:
        assert context.agent == AGENT
        assert context.node == node_id
        assert stored[context.seq] == context.epoch, (context, stored)
    assert node_b.keeper.held is not None and node_b.keeper.held.epoch == 2
    # Outside a step: in the test's thread, and in init() (run by the node).
    assert current_step() is None
    assert agent_a.init_contexts == [None]


# -- 2. lease keeping never waits on the agent --------------------------------


@pytest.mark.parametrize("agent_class", [AsyncAgent, SyncAgent], ids=["async", "sync"])
def test_a_step_lasting_three_ttls_keeps_the_lease_and_is_published(
    hb: Harness, agent_class: type[CountingAgent]
) -> None:
    """A step lasting 3 x TTL (async, or sync in a thread) keeps epoch 1: no standby takes over, no
    lease.lost, and the step is published.
    """
    agent_a = agent_class(slow={1: 3 * TTL_S}, park_from=2)
    hb.node("node-a", agent_a)
    hb.events.wait("lease.acquired", "node-a")
    hb.node("node-b", agent_class(park_from=2))
    hb.events.wait("node.standby", "node-b")
    wait_until(
        lambda: hb.checkpoints() == [(1, 1)], "the long step 1 to be published under epoch 1"
    )

    lease = hb.store().read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.epoch) == ("node-a", 1)
    assert lease.renewals >= 5, "the lease was not renewed while the step ran"
    assert [e.node for e in hb.events.of("lease.acquired")] == ["node-a"]
    for kind in ("lease.renew_failed", "lease.lost", "agent.yielded", "node.fenced"):
        assert hb.events.of(kind) == [], f"unexpected {kind}: {hb.events.summary()}"


# -- 3. a step during which the lease is lost is never published ---------------


def _start_losing_leader(hb: Harness, agent_a: CountingAgent) -> tuple[FaultyStore, CountingAgent]:
    """node-a (faulty store) publishes step 1 and hangs in step 2; node-b stands by."""
    faulty = FaultyStore(hb.store())
    hb.node("node-a", agent_a, store=faulty)
    wait_until(lambda: 2 in agent_a.entered_seqs(), "node-a to start step 2")
    assert hb.checkpoints() == [(1, 1)]
    agent_b = AsyncAgent(park_from=3)
    hb.node("node-b", agent_b)
    hb.events.wait("node.standby", "node-b")
    return faulty, agent_b


def _assert_renew_failed_then_lost(events: Recorder, node: str) -> None:
    kinds = events.types(node)
    assert "lease.lost" in kinds
    assert "lease.renew_failed" in kinds[: kinds.index("lease.lost")], kinds


def test_async_step_is_cancelled_and_never_published_when_the_lease_is_lost(hb: Harness) -> None:
    """When renewals fail mid-step, the async step is cancelled after lease.renew_failed and
    lease.lost, and its seq is never stored under the lost epoch.
    """
    agent_a = AsyncAgent(park_from=2)
    faulty, _ = _start_losing_leader(hb, agent_a)

    faulty.fail_cas.set()
    hb.events.wait("lease.lost", "node-a")
    _assert_renew_failed_then_lost(hb.events, "node-a")
    wait_until(lambda: [c.seq for c in agent_a.cancelled] == [2], "step 2 to see CancelledError")
    hb.events.wait("agent.yielded", "node-a", where=lambda e: e.detail.get("step_seq") == 2)

    wait_until(lambda: (2, 2) in hb.checkpoints(), "node-b to publish seq 2 under epoch 2")
    assert (2, 1) not in hb.checkpoints()
    assert agent_a.returned_seqs() == [1]
    assert hb.events.of("node.fenced", "node-a") == []
    assert [e.seq for e in hb.events.of("checkpoint.published", "node-a")] == [1]


def test_sync_step_result_is_discarded_when_the_lease_is_lost(hb: Harness) -> None:
    """A sync step that returns only after lease.lost has its result discarded: it is never stored,
    not even tried against the store.
    """
    agent_a = SyncAgent(park_from=2)
    faulty, _ = _start_losing_leader(hb, agent_a)

    faulty.fail_cas.set()
    hb.events.wait("lease.lost", "node-a")
    _assert_renew_failed_then_lost(hb.events, "node-a")
    hb.events.wait("agent.yielded", "node-a", where=lambda e: e.detail.get("step_seq") == 2)
    assert agent_a.returned_seqs() == [1]  # the thread is still in step 2

    agent_a.release.set()  # only now does the abandoned step return its new state
    # (On a loaded machine the renew deadline can pass during step 2 before the fault too:
    # then step 2 was abandoned and tried again, and two threads return from it.)
    wait_until(lambda: 2 in agent_a.returned_seqs(), "the abandoned sync step to return")
    wait_until(lambda: (2, 2) in hb.checkpoints(), "node-b to publish seq 2 under epoch 2")

    def beats() -> int:
        return next((h.beats for h in hb.store().list_heartbeats(AGENT) if h.node == "node-a"), 0)

    later = beats() + 3  # node-a's loop has run a few more ticks since the step returned
    wait_until(lambda: beats() >= later, "three more heartbeats of node-a")
    assert (2, 1) not in hb.checkpoints()
    assert hb.events.of("node.fenced", "node-a") == [], "node-a tried to publish a lost step"
    assert [e.seq for e in hb.events.of("checkpoint.published", "node-a")] == [1]


# -- 4, 5. restore past a checkpoint that does not authenticate ----------------


def _publish_three_and_stop(hb: Harness, agent_id: str = AGENT, node_id: str = "node-a") -> None:
    agent = AsyncAgent(agent_id, park_from=4)
    node = hb.node(node_id, agent)
    wait_until(
        lambda: hb.checkpoints(agent_id) == [(3, 1), (2, 1), (1, 1)] and 4 in agent.entered_seqs(),
        f"{node_id} to publish checkpoints 1-3 of {agent_id}",
    )
    node.stop()


def test_restore_retries_a_checkpoint_it_could_not_read_instead_of_falling_back(
    hb: Harness,
) -> None:
    """A store error while reading the newest checkpoint makes the new leader try again, not resume
    from an older one.
    """
    _publish_three_and_stop(hb)
    faulty = FaultyStore(hb.store())
    faulty.fail_reads[3] = 1
    hb.node("node-b", AsyncAgent(park_from=4), store=faulty)
    resumed = hb.events.wait("agent.resumed", "node-b")
    assert resumed.detail["from_seq"] == 3
    assert hb.events.of("checkpoint.rejected", "node-b") == []
    assert any("restore" in e.detail["error"] for e in hb.events.of("store.error", "node-b"))


class TakingStore(FaultyStore):
    """Reads for the restore as it takes the lease (as etcd does in one txn), and counts
    node-b's restore reads after that; or makes node-b lose the race for a released lease
    to node-c, which publishes checkpoint 4 and goes silent."""

    def __init__(self, inner: FileStore, *, lose_first_take: bool = False) -> None:
        super().__init__(inner)
        self.taken = threading.Event()  # node-b's acquisition returned
        self.read_after_taking = 0
        self.lose_first_take = lose_first_take

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        self.read_after_taking += self.taken.is_set()
        return self._inner.list_checkpoints(agent)

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        self.read_after_taking += self.taken.is_set()
        return self._inner.read_checkpoint(agent, info)

    def read_cluster(self) -> ClusterRecord | None:
        self.read_after_taking += self.taken.is_set()
        return self._inner.read_cluster()

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        current = self._inner.read_lease(agent)
        if new.holder == "node-b" and self.lose_first_take and current and not current.holder:
            self.lose_first_take = False
            cluster = self._inner.read_cluster()
            assert cluster is not None
            self._inner.cas_lease(agent, expected_version, replace(new, holder="node-c"))
            fence = Fence("node-c", new.session, new.epoch)
            blob = Sealer(SECRET, cluster).seal(agent, new.epoch, 4, {"n": 4, "effects": [4]})
            self._inner.put_checkpoint(agent, fence, 4, blob)
            raise LeaseConflict("injected: node-c took the lease first")
        # As the record layer's commit reads (the cluster record along).
        taken = self.cas_lease(agent, expected_version, new), self._inner.read_for_restore(agent)
        if new.holder == "node-b":
            self.taken.set()
        return taken


def test_a_new_leader_restores_from_what_it_read_as_it_took_the_lease(hb: Harness) -> None:
    """The acquisition reads what a restore needs with it (in one txn on etcd), the cluster
    record the term follows the keys from included: the term's restore reads nothing more,
    a round trip less before the first step."""
    _publish_three_and_stop(hb)
    store = TakingStore(hb.store())
    hb.node("node-b", AsyncAgent(park_from=4), store=store)
    resumed = hb.events.wait("agent.resumed", "node-b")
    assert resumed.detail["from_seq"] == 3
    assert store.taken.is_set() and store.read_after_taking == 0


class AlongStore(TakingStore):
    """Takes the lease as the record layer does (what the term reads first read along in
    the take's commit) and counts node-b's reads after it, until its agent's first step."""

    def __init__(self, inner: FileStore, agent: AsyncAgent) -> None:
        super().__init__(inner)
        self.agent = agent

    def _count(self) -> None:
        self.read_after_taking += self.taken.is_set() and not self.agent.entered

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        taken = self._inner.take_lease(agent, expected_version, new)
        self.taken.set()
        return taken

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        self._count()
        return self._inner.read_effects(agent, seq)

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        self._count()
        return self._inner.read_inbox(agent, after)


def test_a_new_leaders_first_step_reads_its_journal_and_inbox_from_the_take(hb: Harness) -> None:
    """The take's commit read the journal of the step in flight and the inbox: between the
    acquisition and the first step, the term reads nothing of the store."""
    _publish_three_and_stop(hb)
    hb.store().admit(AGENT, "r1", 1, b"not opened: the count is what matters here")
    agent_b = AsyncAgent(park_from=4)
    store = AlongStore(hb.store(), agent_b)
    hb.node("node-b", agent_b, store=store)
    wait_until(lambda: agent_b.entered, "node-b's first step")
    assert store.taken.is_set() and store.read_after_taking == 0


def test_a_node_that_lost_the_race_for_a_released_lease_restores_from_what_is_stored_then(
    hb: Harness,
) -> None:
    """Another node took the released lease first and published: the node that lost the
    race takes the lease once it expires, and restores from what is stored then."""
    _publish_three_and_stop(hb)
    store = TakingStore(hb.store(), lose_first_take=True)
    agent_b = AsyncAgent(park_from=5)
    hb.node("node-b", agent_b, store=store)
    resumed = hb.events.wait("agent.resumed", "node-b")
    assert resumed.detail["from_seq"] == 4
    wait_until(lambda: agent_b.entered, "node-b to start a step")
    assert agent_b.entered[0][1] == {"n": 4, "effects": [4]}


def test_restore_skips_a_tampered_newest_checkpoint_that_no_node_saw_accepted(
    hb: Harness,
) -> None:
    """A new leader that knows of no accepted checkpoint (the lease record, which names the
    newest, names none) rejects a tampered newest checkpoint (checkpoint.rejected) and resumes
    from the one before it.
    """
    _publish_three_and_stop(hb)
    flip_last_byte(hb.checkpoint_path(3))
    lease = hb.key_path(AgentKeys(AGENT).lease)
    lease.write_bytes(lease.read_bytes().replace(b'"seq":3', b'"seq":0'))  # nothing known

    agent_b = AsyncAgent(park_from=3)
    hb.node("node-b", agent_b)
    resumed = hb.events.wait("agent.resumed", "node-b")
    rejected = hb.events.of("checkpoint.rejected", "node-b")
    assert [e.detail["checkpoint_seq"] for e in rejected] == [3]
    assert resumed.detail["from_seq"] == 2
    assert resumed.detail["skipped"] == 1
    wait_until(lambda: agent_b.entered, "node-b to start a step")
    context, state = agent_b.entered[0]
    assert state == {"n": 2, "effects": [1, 2]}  # checkpoint 2's state
    assert context.epoch == 2
    assert agent_b.init_calls == 0


def test_restore_refuses_a_tampered_newest_checkpoint_that_was_seen_accepted(
    hb: Harness,
) -> None:
    """A tampered newest checkpoint that the lease record says was accepted is a loss, not
    something to skip: the new leader refuses (StoreRegressed naming its seq), starts nothing."""
    _publish_three_and_stop(hb)
    flip_last_byte(hb.checkpoint_path(3))
    agent_b = AsyncAgent()
    node_b = hb.node("node-b", agent_b)
    assert node_b.stopped.wait(15), "node-b did not refuse"
    with pytest.raises(StoreRegressed, match="seq 3 did not authenticate"):
        node_b.stop()
    assert [e.detail["checkpoint_seq"] for e in hb.events.of("checkpoint.rejected")] == [3]
    assert agent_b.entered == [] and agent_b.init_calls == 0


def test_restore_refuses_when_every_checkpoint_is_tampered(hb: Harness) -> None:
    """With every retained checkpoint tampered the node refuses to resume: stop() re-raises
    NoUsableCheckpoint, init() is never called, nothing new is written.
    """
    _publish_three_and_stop(hb)
    for seq in (1, 2, 3):
        flip_last_byte(hb.checkpoint_path(seq))
    keys = AgentKeys(AGENT)
    before = snapshot(hb.key_path(keys.ckpt))

    agent_b = AsyncAgent()
    node_b = hb.node("node-b", agent_b)
    wait_until(node_b.stopped.is_set, "node-b to end on its own")
    with pytest.raises(NoUsableCheckpoint):
        node_b.stop()
    rejected = hb.events.of("checkpoint.rejected", "node-b")
    assert [e.detail["checkpoint_seq"] for e in rejected] == [3, 2, 1]
    assert hb.events.of("agent.resumed", "node-b") == []
    assert hb.events.of("agent.started", "node-b") == []
    assert agent_b.init_calls == 0
    assert agent_b.entered == []
    assert snapshot(hb.key_path(keys.ckpt)) == before


def test_checkpoint_moved_from_another_agent_is_rejected(hb: Harness) -> None:
    """A checkpoint of agent b copied into agent a's directory under a's next seq is rejected as
    moved, although it is sealed with the same key.
    """
    agent_a = AsyncAgent("a", park_from=3)
    node_a = hb.node("node-a", agent_a)
    wait_until(
        lambda: hb.checkpoints("a") == [(2, 1), (1, 1)] and 3 in agent_a.entered_seqs(),
        "node-a to publish checkpoints 1-2 of a",
    )
    node_a.stop()
    _publish_three_and_stop(hb, agent_id="b", node_id="node-b")

    RawRecords(hb.store()).put_checkpoint("a", 3, 1, hb.checkpoint_path(3, "b").read_bytes())
    assert hb.checkpoints("a") == [(3, 1), (2, 1), (1, 1)]

    agent_c = AsyncAgent("a", park_from=3)
    hb.node("node-c", agent_c)
    resumed = hb.events.wait("agent.resumed", "node-c")
    rejected = hb.events.of("checkpoint.rejected", "node-c")
    assert [e.detail["checkpoint_seq"] for e in rejected] == [3]
    assert "'b'" in rejected[0].detail["error"], rejected[0].detail
    assert (resumed.detail["from_seq"], resumed.detail["skipped"]) == (2, 1)
    wait_until(lambda: agent_c.entered, "node-c to start a step")
    assert agent_c.entered[0][1] == {"n": 2, "effects": [1, 2]}  # a's own state, not b's


# -- 6. everything observable, nothing of the state ------------------------------

OBSERVABLE = (
    "node.online",
    "node.standby",
    "node.offline",
    "lease.acquired",
    "lease.renew_failed",
    "lease.lost",
    "agent.started",
    "agent.resumed",
    "agent.step",
    "agent.yielded",
    "checkpoint.published",
    "checkpoint.rejected",
    "node.fenced",
)
STATE_SECRET = "TOPSECRET-STATE"


def test_every_state_change_is_an_event_stored_without_agent_state(hb: Harness) -> None:
    """Every event of invariant 7 reaches on_event and the store, and no event or heartbeat carries
    agent state.
    """
    faulty = FaultyStore(hb.store())
    agent_a = AsyncAgent(park_from=4, extra={"note": STATE_SECRET})
    node_a = hb.node("node-a", agent_a, store=faulty)
    wait_until(
        lambda: hb.checkpoints() == [(3, 1), (2, 1), (1, 1)] and 4 in agent_a.entered_seqs(),
        "node-a to publish checkpoints 1-3",
    )
    # node-b will reject a junk checkpoint 99 and number its first step 4, on from 3.
    agent_b = AsyncAgent(park_from=4, extra={"note": STATE_SECRET})
    node_b = hb.node("node-b", agent_b)
    hb.events.wait("node.standby", "node-b")

    RawRecords(hb.store()).put_checkpoint(AGENT, 99, 1, b"written without the secret")
    faulty.block_put.set()
    agent_a.release.set()  # step 4 ends; its publish hangs inside put_checkpoint
    wait_until(faulty.put_entered.is_set, "node-a's publish of step 4 to reach the store")
    faulty.fail_cas.set()  # ... while its renewals fail
    hb.events.wait("lease.lost", "node-a")
    hb.events.wait("agent.resumed", "node-b")
    wait_until(lambda: 4 in agent_b.entered_seqs(), "node-b to step")
    heartbeats = [p.read_bytes() for p in hb.key_path(AgentKeys(AGENT).beats).iterdir()]
    assert len(heartbeats) == 2

    faulty.put_release.set()  # the stale publish reaches the store now: fenced
    hb.events.wait("node.fenced", "node-a")
    assert (4, 1) not in hb.checkpoints()
    node_b.stop()  # its step 4 is in flight: agent.yielded
    node_a.stop()

    seen = {e.type for e in hb.events.of()}
    stored_events = FileStore(hb.store_dir).read_events(AGENT)
    stored = {e.type for e in stored_events}
    assert [k for k in OBSERVABLE if k not in seen] == []
    assert [k for k in OBSERVABLE if k not in stored] == []
    assert {(e.node, e.n) for e in stored_events} == {(e.node, e.n) for e in hb.events.of()}
    for event in hb.events.of():
        assert STATE_SECRET not in event.to_json().decode(), event
    for heartbeat in heartbeats:
        assert STATE_SECRET.encode() not in heartbeat
    for path in hb.store_dir.rglob("*"):  # events, lease, cluster; checkpoints are sealed
        if path.is_file():
            assert STATE_SECRET.encode() not in path.read_bytes(), path


# -- 7. graceful stop ------------------------------------------------------------


def test_graceful_stop_hands_over_within_a_tick_not_a_ttl(hb: Harness) -> None:
    """On stop() the leader releases the lease and drops its heartbeat, and the standby takes over
    (via "released") well within the 5 s TTL. (No stop grace: the step in flight never ends.)
    """
    timing = LeaseTiming(tick_ms=200, lease_ttl_ms=5000)
    agent_a = AsyncAgent(park_from=3)
    node_a = hb.node("node-a", agent_a, timing=timing, stop_grace_ms=0)
    wait_until(
        lambda: hb.checkpoints() == [(2, 1), (1, 1)] and 3 in agent_a.entered_seqs(),
        "node-a to publish checkpoints 1-2",
    )
    hb.node("node-b", AsyncAgent(park_from=3), timing=timing)
    hb.events.wait("node.standby", "node-b")

    stop_called = time.monotonic()
    node_a.stop()
    stop_returned = time.monotonic()
    hb.events.wait("lease.acquired", "node-b")
    [(acquired_at, acquired)] = hb.events.timed("lease.acquired", "node-b")
    assert acquired.detail["via"] == "released"
    assert acquired_at - stop_called < 2.5, f"took {acquired_at - stop_called:.2f} s"
    assert max(0.0, acquired_at - stop_returned) < 2.5

    assert "node-a" not in [h.node for h in hb.store().list_heartbeats(AGENT)]
    lease = hb.store().read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.epoch) == ("node-b", 2)
    resumed = hb.events.wait("agent.resumed", "node-b")
    assert (resumed.detail["from_seq"], resumed.detail["skipped"]) == (2, 0)


class ReleaseCounting:
    """Counts how the lease is released: by its own cas_lease, or in the last publish."""

    def __init__(self, inner: FileStore) -> None:
        self._inner = inner
        self.own_releases = 0
        self.with_publish: list[LeaseRecord | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        self.own_releases += new.holder is None
        return self._inner.cas_lease(agent, expected_version, new)

    def put_checkpoint_and_release(self, *args: Any) -> tuple[CheckpointInfo, LeaseRecord | None]:
        info, record = self._inner.put_checkpoint_and_release(*args)
        self.with_publish.append(record)
        return info, record


def test_a_stops_last_publish_releases_the_lease_in_the_same_commit(hb: Harness) -> None:
    """The step in flight at a stop finishes; its publish releases the lease in its own
    commit (one round trip for both), naming that checkpoint, and nothing else releases."""
    agent = AsyncAgent(park_from=3)
    store = ReleaseCounting(hb.store())
    node = hb.node("node-a", agent, store=store, stop_grace_ms=10_000)
    wait_until(lambda: 3 in agent.entered_seqs(), "node-a to enter step 3")
    stopping = threading.Thread(target=node.stop, name="stop-node-a", daemon=True)
    stopping.start()
    hb.events.wait("node.stopping", "node-a")
    agent.release.set()  # the step in flight finishes, and is published
    stopping.join(30)
    assert not stopping.is_alive()
    lease = hb.store().read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.seq, lease.seq_epoch) == (None, 3, 1)
    assert store.with_publish == [lease] and store.own_releases == 0
    assert hb.checkpoints()[0] == (3, 1)
    kinds = hb.events.types("node-a")
    assert kinds.index("lease.released") > kinds.index("checkpoint.published")
    assert kinds.count("lease.released") == 1


# -- 8, 9. refused before anything is written ------------------------------------


def test_wrong_secret_fails_at_start_and_touches_nothing(hb: Harness) -> None:
    """A node with the wrong secret on an existing cluster ends with WrongSecret and leaves every
    file of the store unchanged.
    """
    node_a = hb.node("node-a", AsyncAgent(park_from=2))
    wait_until(lambda: hb.checkpoints() == [(1, 1)], "node-a to publish checkpoint 1")
    node_a.stop()
    before = snapshot(hb.store_dir)

    events = Recorder()
    agent_x = AsyncAgent()
    node_x = Runtime(
        node_id="node-x",
        region="r1",
        store=FileStore(hb.store_dir),
        agent=agent_x,
        secret="not-the-cluster-secret",
        timing=LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS),
        on_event=events,
    )
    hb.nodes.append(node_x)
    node_x.start()
    with pytest.raises(WrongSecret):
        node_x.stop(timeout=20)
    assert snapshot(hb.store_dir) == before
    assert events.of() == []
    assert agent_x.init_calls == 0


BAD_TIMING: dict[str, dict[str, Any]] = {
    "tick-above-deadline": {"tick_ms": 400, "lease_ttl_ms": 600},
    "tick-equals-deadline": {"tick_ms": 360, "lease_ttl_ms": 600},
    "ttl-equals-deadline": {"tick_ms": 100, "lease_ttl_ms": 600, "renew_deadline_ms": 600},
    "ttl-below-deadline": {"tick_ms": 100, "lease_ttl_ms": 600, "renew_deadline_ms": 700},
}


@pytest.mark.parametrize("form", ["object", "url"])
@pytest.mark.parametrize("timing", BAD_TIMING.values(), ids=BAD_TIMING.keys())
def test_bad_timing_is_refused_at_construction(
    tmp_path: Path, timing: dict[str, Any], form: str
) -> None:
    """Timing without lease_ttl > renew_deadline > tick raises ConfigError in the constructor,
    before anything is stored.
    """
    store_dir = tmp_path / "store"
    store: Any = FileStore(store_dir) if form == "object" else store_dir.as_uri()
    events = Recorder()
    with pytest.raises(ConfigError, match="lease_ttl > renew_deadline > tick") as info:
        Runtime(
            node_id="node-a",
            region="r1",
            store=store,
            agent=AsyncAgent(),
            secret=SECRET,
            on_event=events,
            timing=LeaseTiming(**timing),
        )
    assert not isinstance(info.value, SecretTooShort)
    assert file_keys(store_dir) == []
    assert events.of() == []


@pytest.mark.parametrize("form", ["object", "url"])
@pytest.mark.parametrize("secret", ["", "seven77"], ids=["empty", "7-chars"])
def test_short_secret_is_refused_at_construction(tmp_path: Path, secret: str, form: str) -> None:
    """A secret under 8 characters raises SecretTooShort in the constructor, before anything is
    stored; 8 characters are accepted.
    """
    store_dir = tmp_path / "store"
    store: Any = FileStore(store_dir) if form == "object" else store_dir.as_uri()
    with pytest.raises(SecretTooShort):
        Runtime(
            node_id="node-a",
            region="r1",
            store=store,
            agent=AsyncAgent(),
            secret=secret,
            timing=LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS),
        )
    assert file_keys(store_dir) == []
    Runtime(
        node_id="node-a",
        region="r1",
        store=FileStore(tmp_path / "other"),
        agent=AsyncAgent(),
        secret="eight888",
        timing=LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS),
    )


# -- 10. a failing step ---------------------------------------------------------


def test_a_failing_step_is_retried_from_the_last_published_state(hb: Harness) -> None:
    """A step that raises emits agent.failing, the node keeps its lease, and the retry starts
    from the last published state without the failed step's effects.
    """
    agent = AsyncAgent(fail_once=(2,), park_from=3)
    hb.node("node-a", agent)
    failed = hb.events.wait("agent.failing", "node-a")
    assert failed.detail["step_seq"] == 2
    assert "fails once" in failed.detail["error"]
    wait_until(
        lambda: hb.checkpoints() == [(2, 1), (1, 1)] and 3 in agent.entered_seqs(),
        "the retried step 2 to be published",
    )

    attempts = [state for context, state in agent.entered if context.seq == 2]
    assert attempts == [{"n": 1, "effects": [1]}] * 2
    assert hb.open_checkpoint(2) == {"n": 2, "effects": [1, 2]}
    lease = hb.store().read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.epoch) == ("node-a", 1)
    assert hb.events.types("node-a").count("lease.acquired") == 1
    for kind in ("lease.lost", "agent.yielded", "lease.renew_failed"):
        assert hb.events.of(kind) == [], f"unexpected {kind}"


# -- regressions: bugs found while writing these tests ----


def test_stop_right_after_start_stops_the_node(
    hb: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() called before the node's thread has set up its event loop still stops the node."""
    real_run = asyncio.run

    def late_run(main: Any, **kwargs: Any) -> Any:  # a busy machine schedules the new thread late
        if threading.current_thread().name.startswith("hb-"):
            time.sleep(0.3)
        return real_run(main, **kwargs)

    monkeypatch.setattr(asyncio, "run", late_run)  # the module the runtime uses
    node = hb.node("node-a", AsyncAgent(park_from=2))
    node.stop(timeout=3)
    lease = hb.store().read_lease(AGENT)
    assert lease is None or lease.holder is None


def test_a_failed_publish_is_retried_from_the_last_published_state(hb: Harness) -> None:
    """When the store fails to take a checkpoint, the same seq is retried from the last published
    state, so nothing builds on an unpublished step.
    """
    faulty = FaultyStore(hb.store())
    faulty.fail_put_once.add(2)
    agent = AsyncAgent(park_from=3)
    hb.node("node-a", agent, store=faulty)
    failed = hb.events.wait("checkpoint.failed", "node-a")
    assert failed.detail["step_seq"] == 2
    wait_until(
        lambda: 3 in agent.entered_seqs() or len(agent.entered) >= 4,
        "node-a to go on after the failed publish",
    )
    assert [(c.seq, s) for c, s in agent.entered[:3]] == [
        (1, {"n": 0, "effects": []}),
        (2, {"n": 1, "effects": [1]}),
        (2, {"n": 1, "effects": [1]}),  # the retry, from checkpoint 1's state
    ]


def test_after_skipping_a_tampered_checkpoint_the_next_step_publishes(hb: Harness) -> None:
    """A leader that resumed past a tampered newest checkpoint (that nobody knew was accepted)
    numbers its next step on from the checkpoint it resumed from, beside the tampered one of
    an older epoch, and publishes it at once: the tampered one moves no number.
    """
    _publish_three_and_stop(hb)
    flip_last_byte(hb.checkpoint_path(3))
    lease = hb.key_path(AgentKeys(AGENT).lease)
    lease.write_bytes(lease.read_bytes().replace(b'"seq":3', b'"seq":0'))  # nothing known
    agent_b = AsyncAgent(park_from=5)
    hb.node("node-b", agent_b)
    hb.events.wait("agent.resumed", "node-b")
    wait_until(lambda: (3, 2) in hb.checkpoints(), "node-b to publish seq 3 under epoch 2")
    assert hb.events.of("checkpoint.failed", "node-b") == []
    first, state = agent_b.entered[0]
    assert first.seq == 3
    assert state == {"n": 2, "effects": [1, 2]}
    assert (3, 1) not in hb.checkpoints()  # replaced: the store keeps one checkpoint a seq


def test_a_lease_record_that_vanishes_is_reported_and_no_epoch_is_reused(hb: Harness) -> None:
    """The store losing the lease record (a restore from an old backup) is a store.regressed
    event, and the next lease is taken above every epoch seen, never epoch 1 again."""
    agent = AsyncAgent()
    hb.node("node-a", agent)
    hb.events.wait("agent.step", "node-a")
    hb.key_path(AgentKeys(AGENT).lease).unlink()
    regressed = hb.events.wait("store.regressed", "node-a")
    assert "gone" in regressed.detail["reason"]
    again = hb.events.wait("lease.acquired", "node-a", where=lambda e: e.epoch > 1)
    assert again.epoch == 2
    assert len(hb.events.of("store.regressed")) == 1  # once, not on every tick


def test_a_lease_record_lost_behind_an_authenticated_checkpoint_is_taken_again_above_it(
    hb: Harness,
) -> None:
    """A node that has seen nothing takes epoch 1 over a lost lease record; finding an
    authenticated checkpoint of epoch 1 when it restores, it reports the lease record went
    back, gives that term up and takes the lease again above it, then resumes: no epoch is
    used twice, and a checkpoint's name alone never moved it."""
    _publish_three_and_stop(hb)
    hb.key_path(AgentKeys(AGENT).lease).unlink()
    agent_b = AsyncAgent(park_from=5)
    hb.node("node-b", agent_b)
    resumed = hb.events.wait("agent.resumed", "node-b")
    assert (resumed.epoch, resumed.detail["from_seq"]) == (2, 3)
    assert [e.epoch for e in hb.events.of("lease.acquired", "node-b")] == [1, 2]
    regressed = hb.events.of("store.regressed", "node-b")
    assert any("lease record went back" in e.detail["reason"] for e in regressed), regressed
    wait_until(lambda: (4, 2) in hb.checkpoints(), "node-b to publish seq 4 under epoch 2")
    assert {c.epoch for c in agent_b.entered_ctx()} == {2}


def test_a_publish_that_landed_although_it_failed_is_adopted_not_retried_forever(
    hb: Harness,
) -> None:
    """A checkpoint write applied by the store but answered with an error (a lost reply)
    is found in the store and built on: the node goes on to the next seq."""
    store = FaultyStore(hb.store())
    store.land_then_fail_once = {3}
    agent = AsyncAgent()
    node = hb.node("node-a", agent, store=store)
    landed = hb.events.wait(
        "checkpoint.published", "node-a", where=lambda e: "landed_despite" in e.detail
    )
    assert landed.detail["step_seq"] == 3
    hb.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq >= 6)
    # (Without adoption, seq 3 would be offered again and refused forever: no seq 6.)
    node.stop()
    assert hb.checkpoints()[0][0] >= 6
    state = hb.open_checkpoint(hb.checkpoints()[0][0])
    assert state["effects"] == list(range(1, state["n"] + 1))  # no step lost or repeated


def test_a_store_that_went_back_past_what_the_node_saw_is_refused(hb: Harness) -> None:
    """A node that published seq N and, on taking the lease again, finds the store's newest
    checkpoint behind N refuses to resume (StoreRegressed), rather than silently lose steps."""
    agent = AsyncAgent(park_from=5)  # publishes 1-4, then holds still at step 5
    node = hb.node("node-a", agent)
    hb.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == 4)
    # The store "restored from an old backup": newest checkpoints and the lease record gone.
    kept = min(seq for seq, _ in hb.checkpoints())
    for seq, _epoch in hb.checkpoints():
        if seq != kept:
            hb.drop_checkpoint(seq)
    hb.key_path(AgentKeys(AGENT).lease).unlink()
    assert node.stopped.wait(15), "the node did not refuse"
    with pytest.raises(StoreRegressed, match="went back in time"):
        node.stop()
    regressed = [e.detail["reason"] for e in hb.events.of("store.regressed")]
    assert any("newest checkpoint" in reason for reason in regressed), regressed
    assert agent.init_calls == 1  # never started over
    assert [seq for seq, _ in hb.checkpoints()] == [kept]  # nothing written behind it


def test_events_from_a_store_outage_are_stored_once_it_answers(hb: Harness) -> None:
    """Events the node emits while the store cannot take them are held and stored, in order,
    when it answers again: a monitor learns what happened during the outage."""
    store = FaultyStore(hb.store())
    agent = AsyncAgent()
    hb.node("node-a", agent, store=store)
    hb.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq >= 2)
    store.events_down.set()
    during = hb.events.wait("agent.step", "node-a", where=lambda e: e.seq >= 5)
    store.events_down.clear()

    def stored_from_outage() -> list[Event]:
        return [e for e in hb.store().read_events(AGENT) if e.n == during.n]

    wait_until(stored_from_outage, "the outage's events in the store", 15)
    numbers = [e.n for e in hb.store().read_events(AGENT) if e.node == "node-a"]
    assert numbers == list(range(1, len(numbers) + 1))  # none lost, in order


def test_a_store_emptied_while_the_node_was_down_is_refused_by_its_memory(hb: Harness) -> None:
    """A node that keeps its memory in a state directory notices, after its own restart,
    a store emptied meanwhile: it puts the cluster record back and refuses to start the
    agent over from init(). Without the state directory it cannot tell, and starts over."""
    state_dir = hb.store_dir.parent / "state"
    agent = AsyncAgent(park_from=4)
    first = hb.node("node-a", agent, state_dir=state_dir)
    wait_until(lambda: hb.checkpoints() == [(3, 1), (2, 1), (1, 1)], "checkpoints 1-3")
    key_id = hb.store().read_cluster().key_id
    first.stop()
    shutil.rmtree(hb.store_dir)  # the store comes back empty (e.g. Redis without persistence)
    hb.store_dir.mkdir()
    again = AsyncAgent()
    node = hb.node("node-a", again, state_dir=state_dir)
    assert node.stopped.wait(15), "the restarted node did not refuse"
    with pytest.raises(
        StoreRegressed, match="newest checkpoint is seq 0 of epoch 0, behind seq 3 of epoch 1"
    ):
        node.stop()
    assert again.init_calls == 0
    assert hb.store().read_cluster().key_id == key_id  # put back: the same sealing key
    assert hb.store().read_lease(AGENT).epoch == 2  # above the remembered epoch 1
    reasons = [e.detail["reason"] for e in hb.events.of("store.regressed")]
    assert any("cluster record was gone" in r for r in reasons), reasons
    assert any("lease record is gone (epoch 1 was seen)" in r for r in reasons), reasons
    shutil.rmtree(hb.store_dir)  # emptied again, the refusal's lease record with it
    hb.store_dir.mkdir()
    forgetful = AsyncAgent(park_from=2)
    hb.node("node-b", forgetful)  # no state directory: nothing to compare with
    hb.events.wait("agent.started", "node-b")
    assert forgetful.init_calls == 1


def test_a_takeover_the_store_lost_while_the_old_leader_lived_is_refused(hb: Harness) -> None:
    """The store loses a takeover (epoch 2 and its checkpoints) while the old leader, paused
    meanwhile, lives: back on its own epoch-1 record, it steps on from its own state to seqs
    past epoch 2's. The node that saw epoch 2's checkpoints accepted refuses to resume from
    that other line although its seqs are higher, and so does the old leader, once it has
    read that node's lease record."""
    a_store = FaultyStore(hb.store())
    agent_a = AsyncAgent(slow=dict.fromkeys(range(1, 10_000), 0.02))
    node_a = hb.node("node-a", agent_a, store=a_store)
    hb.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq >= 3)
    a_store.cas_open.clear()  # node-a pauses inside a renewal
    assert a_store.cas_waiting.wait(5)
    # The lease record and the fence stored beside it (what a checkpoint write compares).
    lease_paths = [hb.key_path(AgentKeys(AGENT).lease), hb.key_path(AgentKeys(AGENT).fence)]
    epoch_1_records = [path.read_bytes() for path in lease_paths]
    agent_b = AsyncAgent(slow=dict.fromkeys(range(1, 10_000), 0.2))
    node_b = hb.node("node-b", agent_b)
    last_of_a = hb.events.wait("agent.resumed", "node-b").detail["from_seq"]
    agent_b.park_from = last_of_a + 3  # (read after each step's 0.2 s)
    wait_until(lambda: hb.checkpoints()[0] == (last_of_a + 2, 2), "node-b to publish twice")
    # The store goes back: epoch 2 and its checkpoints are lost.
    for path, record in zip(lease_paths, epoch_1_records, strict=True):
        path.write_bytes(record)
    for seq, epoch in hb.checkpoints():
        if epoch == 2:
            hb.drop_checkpoint(seq)
    a_store.cas_open.set()  # node-a's renewal lands on its own record again, and it steps on
    assert node_b.stopped.wait(15), "node-b did not refuse"
    with pytest.raises(StoreRegressed, match=r"is seq \d+ of epoch 1, behind seq \d+ of epoch 2"):
        node_b.stop()
    newest_of_a = hb.checkpoints()[0]
    assert newest_of_a[0] > last_of_a + 2 and newest_of_a[1] == 1  # higher seqs, other line
    assert [c.epoch for c in agent_b.entered_ctx()] == [2, 2, 2]  # never stepped from it
    assert node_a.stopped.wait(15), "node-a did not refuse"
    with pytest.raises(StoreRegressed, match="of epoch 2"):
        node_a.stop()
    assert hb.store().read_lease(AGENT).epoch == 4  # 3: node-b, 4: node-a; each refused
