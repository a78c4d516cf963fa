"""Nodes as real processes on one shared store: kill, race, pause, slow steps, graceful stop.

The kill, the racers, the two zombie leaders and the graceful stop run on the
file store, on Redis, on etcd and on PostgreSQL (``store_url``; the racers three
rounds on the file store and one on each other); each network store test has a
key prefix (PostgreSQL: a table) of its own on the session's server. The kill
and the graceful stop are the fast tier's smoke tests (``make test``); the rest
is in the slow tier. The store's half, fenced writes and compare-and-set races of eight clients, is proved on
every backend by the contract suite (tests/stores/contract).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hamsterbunker import Event
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from tests.support import pause_outside_lock, process_state, redo_finished, wait_until
from tests.support.etcd_server import etcd_url
from tests.support.postgres_server import postgres_url
from tests.support.redis_server import redis_url

pytestmark = pytest.mark.multiprocess

A, B, C = (
    NodeSpec("node-a", "eu-central"),
    NodeSpec("node-b", "us-east"),
    NodeSpec("node-c", "ap-south"),
)
MakeCluster = Callable[..., LocalCluster]


@pytest.fixture(params=["file", "redis", "etcd", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """The store the nodes share: None for local_cluster's own file store, or a Redis or etcd
    prefix, or a PostgreSQL table."""
    urls = {"redis": redis_url, "etcd": etcd_url, "postgres": postgres_url}
    return urls[request.param]() if request.param in urls else None


def opened(cluster: LocalCluster) -> Store:
    """The store the cluster's nodes share (file, Redis, etcd or PostgreSQL), as an outside reader."""
    return open_store(cluster.store_url)


def pause(cluster: LocalCluster, node: str, agent: str) -> None:
    """SIGSTOP node and wait until it is stopped.

    On the file store it is stopped outside the store lock (``pause_outside_lock``);
    on Redis and etcd a paused node holds nothing up but its own lease.
    """
    if cluster.store_url.startswith("file://"):
        pause_outside_lock(cluster, node)
        return
    cluster.signal(node, signal.SIGSTOP)
    wait_until(lambda: process_state(cluster.pid(node)) == "T", f"{node} to stop")


def events(store: Store, agent: str, kind: str | None = None) -> list[Event]:
    found = store.read_events(agent)
    return [e for e in found if kind is None or e.type == kind]


def holder(store: Store, agent: str) -> str | None:
    lease = store.read_lease(agent)
    return lease.holder if lease else None


def latest_seq(store: Store, agent: str) -> int:
    checkpoints = store.list_checkpoints(agent)
    return checkpoints[0].seq if checkpoints else 0


def role_of(store: Store, agent: str, node: str) -> str | None:
    return next((b.role for b in store.list_heartbeats(agent) if b.node == node), None)


def assert_one_publisher_per_epoch(store: Store, agent: str) -> None:
    publishers: dict[int, set[str]] = {}
    for event in events(store, agent, "checkpoint.published"):
        publishers.setdefault(event.epoch, set()).add(event.node)
    assert all(len(nodes) == 1 for nodes in publishers.values()), publishers


@pytest.mark.smoke  # in the fast tier: a kill and a graceful stop, per store
def test_survival_sigkill_active_node_standby_resumes_from_last_checkpoint(
    local_cluster: MakeCluster, store_url: str | None
) -> None:
    """SIGKILL of the active node: a standby resumes from the last accepted checkpoint, nothing lost."""
    cluster = local_cluster(timing=LeaseTiming(200, 1000), store_url=store_url)
    for spec in (A, B, C):
        cluster.start(spec)
    store = opened(cluster)
    wait_until(lambda: latest_seq(store, "journal") >= 5, "five published steps")
    lease = wait_until(lambda: store.read_lease("journal"), "a lease holder")
    active = lease.holder

    cluster.kill(active)
    # The dead node publishes no more; a commit it had made durable counts.
    last = redo_finished(store).list_checkpoints("journal")[0]

    # The term after the killed one's (a loaded machine may have moved the lease before).
    resumed = wait_until(
        lambda: next(
            (e for e in events(store, "journal", "agent.resumed") if e.epoch > lease.epoch), None
        ),
        "a standby to resume",
    )
    assert resumed.node != active
    assert resumed.detail["from_seq"] == last.seq
    wait_until(lambda: latest_seq(store, "journal") >= last.seq + 3, "the agent to advance")

    # From outside: every retained checkpoint's count equals its seq (one count per step,
    # none lost), and at most the step in flight at the kill ran twice. Stopped first, so
    # that retention does not remove a listed checkpoint before it is read.
    cluster.stop_all()
    sealer = Sealer(cluster.secret, store.read_cluster())
    for info in store.list_checkpoints("journal"):
        state = sealer.open(store.read_checkpoint("journal", info), "journal", info.epoch, info.seq)
        assert state["count"] == info.seq
    journal = [
        json.loads(line) for line in Path(cluster.env["HB_TEST_JOURNAL"]).read_text().splitlines()
    ]
    seqs = [line["seq"] for line in journal]
    repeated = {seq for seq in seqs if seqs.count(seq) > 1}
    assert repeated <= {last.seq + 1}
    assert set(range(1, last.seq + 4)) <= set(seqs)
    assert_one_publisher_per_epoch(store, "journal")


# Three rounds on the file store, one on each network store: the contract suite races
# eight clients' compare-and-set on every backend (tests/stores/contract).
@pytest.mark.parametrize(
    ("store_url", "round_no"),
    [("file", 0), ("file", 1), ("file", 2), ("redis", 0), ("etcd", 0), ("postgres", 0)],
    indirect=["store_url"],
)
def test_eight_racers_on_an_empty_lease_elect_exactly_one_holder(
    local_cluster: MakeCluster, store_url: str | None, round_no: int
) -> None:
    """Eight nodes started together on an empty store: exactly one acquires epoch 1."""
    cluster = local_cluster(timing=LeaseTiming(100, 2000), store_url=store_url)
    racers = [NodeSpec(f"racer-{i}", f"region-{i}") for i in range(8)]
    # Each racer stops itself just before its first lease tick; once all eight
    # are lined up they are continued together, so they really race.
    lined_up = {"HB_FAILPOINTS": "node.before_first_tick=stop"}
    processes = [cluster.start(spec, extra_env=lined_up) for spec in racers]
    wait_until(
        lambda: all(process_state(p.pid) == "T" for p in processes),
        "all racers to line up",
        timeout=60,
    )
    for process in processes:
        process.send_signal(signal.SIGCONT)
    store = opened(cluster)

    def all_settled() -> bool:
        beats = store.list_heartbeats("journal")
        return len(beats) == 8 and all(
            b.beats >= 5 and b.role in ("active", "standby") for b in beats
        )

    wait_until(all_settled, "all eight racers to settle", timeout=60)
    acquired = events(store, "journal", "lease.acquired")
    assert [(e.epoch, e.detail["via"]) for e in acquired] == [(1, "empty")], acquired
    roles = sorted(b.role for b in store.list_heartbeats("journal"))
    assert roles == ["active"] + ["standby"] * 7
    assert store.read_lease("journal").epoch == 1
    assert_one_publisher_per_epoch(store, "journal")


def test_zombie_leader_publish_is_fenced_by_the_store_and_it_steps_down(
    local_cluster: MakeCluster, store_url: str | None
) -> None:
    """A leader paused mid-publish past the TTL has that publish refused by the store, and steps down."""
    cluster = local_cluster(timing=LeaseTiming(200, 1000), store_url=store_url)
    # node-a stops itself (SIGSTOP) on its 4th publish, before the store's fence
    # check (file: bytes written, lock not taken; Redis, etcd: script or txn not
    # sent): the write is then decided by the store alone.
    zombie = cluster.start(A, extra_env={"HB_FAILPOINTS": "checkpoint.before_commit=stop@4"})
    store = opened(cluster)
    wait_until(lambda: process_state(zombie.pid) == "T", "node-a to stop itself mid-publish")
    assert latest_seq(store, "journal") == 3

    cluster.start(B)
    resumed = wait_until(
        lambda: next(
            (e for e in events(store, "journal", "agent.resumed") if e.node == B.node), None
        ),
        "node-b to take over",
    )
    assert (resumed.epoch, resumed.detail["from_seq"]) == (2, 3)

    cluster.signal(A.node, signal.SIGCONT)
    fenced = wait_until(
        lambda: next(
            (e for e in events(store, "journal", "node.fenced") if e.node == A.node), None
        ),
        "node-a to be fenced",
    )
    assert fenced.detail["step_seq"] == 4 and fenced.epoch == 1
    wait_until(lambda: role_of(store, "journal", A.node) == "standby", "node-a to report standby")
    # The zombie's seq-4 checkpoint of epoch 1 never landed; node-b's line continues.
    assert all(info.epoch == 2 for info in store.list_checkpoints("journal") if info.seq >= 4)
    assert holder(store, "journal") == B.node
    assert_one_publisher_per_epoch(store, "journal")


def test_zombie_leader_paused_past_ttl_steps_down_and_never_publishes_again(
    local_cluster: MakeCluster, store_url: str | None
) -> None:
    """A leader SIGSTOPped for 2.5 × TTL then SIGCONTed loses the lease and never publishes under it."""
    cluster = local_cluster(timing=LeaseTiming(200, 1000), store_url=store_url)
    cluster.start(A)
    store = opened(cluster)
    wait_until(lambda: latest_seq(store, "journal") >= 2, "node-a to lead")
    cluster.start(B)
    wait_until(lambda: role_of(store, "journal", B.node) == "standby", "node-b to stand by")

    pause(cluster, A.node, "journal")
    paused_at = time.monotonic()
    resumed = wait_until(
        lambda: next(
            (e for e in events(store, "journal", "agent.resumed") if e.node == B.node), None
        ),
        "node-b to take over",
    )
    while time.monotonic() - paused_at < 2.5:  # keep the zombie paused for 2.5 × TTL in all
        time.sleep(0.05)
    cluster.signal(A.node, signal.SIGCONT)

    wait_until(
        lambda: any(e.node == A.node for e in events(store, "journal", "lease.lost")),
        "node-a to lose the lease",
    )
    wait_until(lambda: role_of(store, "journal", A.node) == "standby", "node-a to report standby")
    published_by_a = [
        e.seq for e in events(store, "journal", "checkpoint.published") if e.node == A.node
    ]
    assert max(published_by_a) <= resumed.detail["from_seq"]
    assert holder(store, "journal") == B.node
    assert_one_publisher_per_epoch(store, "journal")


def test_a_step_three_times_the_ttl_keeps_the_lease_and_is_published(
    local_cluster: MakeCluster,
) -> None:
    """A blocking step of 3 × TTL neither loses the lease nor lets the standby take over."""
    cluster = local_cluster(
        agent="hb_test_agents:SlowSyncCounter",
        timing=LeaseTiming(200, 1000),
        env={"HB_TEST_STEP_S": "3.0"},
    )
    cluster.start(A)
    store = opened(cluster)
    wait_until(lambda: holder(store, "slow") == A.node, "node-a to lead")
    cluster.start(B)
    wait_until(lambda: latest_seq(store, "slow") >= 2, "two slow steps published", timeout=60)

    assert [e.node for e in events(store, "slow", "lease.acquired")] == [A.node]
    assert not events(store, "slow", "lease.lost")
    assert [(i.seq, i.epoch) for i in store.list_checkpoints("slow")][-2:] == [(2, 1), (1, 1)]


@pytest.mark.smoke  # in the fast tier: a kill and a graceful stop, per store
def test_graceful_stop_hands_over_within_a_tick_not_a_ttl(
    local_cluster: MakeCluster, store_url: str | None
) -> None:
    """SIGTERM of the active node: the standby takes the released lease at once, from its last checkpoint."""
    cluster = local_cluster(timing=LeaseTiming(200, 8000), store_url=store_url)
    leader = cluster.start(A)
    store = opened(cluster)
    wait_until(lambda: holder(store, "journal") == A.node, "node-a to lead")
    cluster.start(B)
    wait_until(lambda: role_of(store, "journal", B.node) == "standby", "node-b to stand by")
    wait_until(lambda: latest_seq(store, "journal") >= 3, "a few steps")

    cluster.signal(A.node, signal.SIGTERM)
    stopped_at = time.monotonic()
    acquired = wait_until(
        lambda: next(
            (e for e in events(store, "journal", "lease.acquired") if e.node == B.node), None
        ),
        "node-b to take over",
    )
    took = time.monotonic() - stopped_at
    # By expiry it could not be under 8 s (the TTL); a handover is one tick or less.
    assert acquired.detail["via"] == "released"
    assert took < 4.0, f"handover took {took:.2f} s"
    assert leader.wait(timeout=15) == 0
    assert role_of(store, "journal", A.node) is None  # heartbeat dropped
    last_a = max(
        e.seq for e in events(store, "journal", "checkpoint.published") if e.node == A.node
    )
    resumed = wait_until(
        lambda: next(
            (e for e in events(store, "journal", "agent.resumed") if e.node == B.node), None
        ),
        "node-b to resume",
    )
    assert resumed.detail["from_seq"] == last_a
