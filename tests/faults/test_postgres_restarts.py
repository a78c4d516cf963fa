"""PostgreSQL crashes and stops under real node processes.

A server SIGKILLed mid-run and started again on its data directory loses
nothing a node saw accepted (synchronous commit: a commit is in the write-ahead
log on disk before it returns); the nodes report the outage (``store.error``,
then ``store.recovered``) and go on with one leader. A server down for longer
than a TTL, shut down or frozen: the leader stops publishing by its renew
deadline, and once the server is back one node takes the next epoch and goes
on, with never two publishers of one epoch. The checker holds the whole history
to the safety rules at teardown (local_cluster).

The backend's half (a commit that fails leaves nothing, a call that outlives the
URL's timeout fails, a server gone is StoreUnavailable) is proved by the backend
contract suite and tests/stores/backend/test_postgres_backend.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from hamsterbunker.core.clock import MonotonicClock
from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.stores import Store, open_store
from tests.support import process_state, wait_until
from tests.support.postgres_server import PostgresServer

pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]

A, B = NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east")
NODES = (A.node, B.node)
AGENT = "journal"
TIMING = LeaseTiming(200, 2000)
RENEW_DEADLINE_S = 0.6 * TIMING.lease_ttl_ms / 1000  # the default: 0.6 x TTL
SLACK_S = 0.1  # scheduling between the deadline check and the history's start time
NODE_CLOCK = MonotonicClock()  # the clock a node times its history with
MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    """A private server: the test crashes, stops and restarts it on the same data and port."""
    started = PostgresServer.start()
    try:
        yield started
    finally:
        started.stop()


def history(cluster: LocalCluster) -> list[Op]:
    assert cluster.history is not None
    return read_history(cluster.history) if cluster.history.exists() else []


def accepted(cluster: LocalCluster) -> list[Op]:
    return [o for o in history(cluster) if o.op == "publish" and o.outcome == "ok"]


def newest_accepted(cluster: LocalCluster) -> int:
    return max((o.seq for o in accepted(cluster)), default=0)


def acquired(cluster: LocalCluster) -> list[Op]:
    return [o for o in history(cluster) if o.op == "acquire" and o.outcome == "ok"]


def stored_seqs(store: Store) -> list[int]:
    return [c.seq for c in store.list_checkpoints(AGENT)]


def logged_since(cluster: LocalCluster, offsets: dict[str, int], what: str) -> bool:
    """Whether every node has logged what since offsets (where its log then ended)."""
    return all(f" {what} " in cluster.log(node)[offsets[node] :] for node in NODES)


def log_ends(cluster: LocalCluster) -> dict[str, int]:
    return {node: len(cluster.log(node)) for node in NODES}


def reporters(store: Store, kind: str) -> set[str]:
    return {e.node for e in store.read_events(AGENT) if e.type == kind}


def assert_one_publisher_per_epoch(cluster: LocalCluster) -> None:
    publishers: dict[int, set[str]] = {}
    for op in accepted(cluster):
        publishers.setdefault(op.epoch, set()).add(op.node)
    assert all(len(nodes) == 1 for nodes in publishers.values()), publishers


def running(make: MakeCluster, url: str) -> tuple[Store, LocalCluster]:
    """node-a and node-b on url, five checkpoints in, the standby standing by."""
    store = open_store(url)
    cluster = make(store_url=url, timing=TIMING)
    for spec in (A, B):
        cluster.start(spec)
    wait_until(lambda: newest_accepted(cluster) >= 5, "five checkpoints")
    leader = acquired(cluster)[0].node
    standby = B.node if leader == A.node else A.node
    wait_until(lambda: " node.standby " in cluster.log(standby), "the other node to stand by")
    return store, cluster


def freeze(cluster: LocalCluster) -> None:
    for node in NODES:
        cluster.signal(node, signal.SIGSTOP)
    wait_until(
        lambda: all(process_state(cluster.pid(node)) == "T" for node in NODES),
        "both nodes to stop",
    )


def thaw(cluster: LocalCluster) -> None:
    for node in NODES:
        cluster.signal(node, signal.SIGCONT)


def crash_and_restart(server: PostgresServer, store: Store, cluster: LocalCluster) -> None:
    """Three more checkpoints, then SIGKILL the server; once both nodes have seen it gone,
    start it again and check that it holds every checkpoint accepted."""
    before = newest_accepted(cluster)
    wait_until(lambda: newest_accepted(cluster) >= before + 3, "three more checkpoints")
    offsets = log_ends(cluster)
    server.kill()
    wait_until(lambda: logged_since(cluster, offsets, "store.error"), "both nodes to see it")
    # Frozen, so that the restarted store is read before any new write.
    freeze(cluster)
    seen = newest_accepted(cluster)
    server.start_again()
    seqs = stored_seqs(store)
    # Nothing accepted is lost; a write in flight at the crash may have landed unanswered.
    assert seen in seqs and max(seqs) <= seen + 1, (seen, seqs)
    thaw(cluster)
    wait_until(
        lambda: logged_since(cluster, offsets, "store.recovered"), "both nodes to see it back"
    )


def test_sigkill_of_the_server_loses_nothing_accepted_and_the_nodes_go_on(
    server: PostgresServer, local_cluster: MakeCluster
) -> None:
    """Three crashes: every checkpoint a node saw accepted is still there after each
    restart, the nodes report the outage, and one leader goes on."""
    store, cluster = running(local_cluster, server.url())
    for _crash in range(3):
        crash_and_restart(server, store, cluster)
    final = newest_accepted(cluster)
    wait_until(lambda: newest_accepted(cluster) >= final + 5, "five checkpoints after the last")
    both = set(NODES)
    wait_until(lambda: reporters(store, "store.recovered") == both, "the outages in the store")
    assert reporters(store, "store.error") == both
    kinds = [e.type for e in store.read_events(AGENT)]
    assert "store.regressed" not in kinds
    assert kinds.count("agent.started") == 1  # never started over from init()
    assert_one_publisher_per_epoch(cluster)
    for node in NODES:  # each node's watch (a hint) outlived the outages
        assert "store watch stopped" not in cluster.log(node), cluster.log(node)[-3000:]
    leader = store.read_lease(AGENT)
    assert leader is not None and leader.holder in NODES
    assert [o.node for o in accepted(cluster)[-3:]] == [leader.holder] * 3


@pytest.mark.parametrize("stop", ["shut down", "frozen"])
def test_a_server_down_for_a_ttl_the_leader_stops_by_its_deadline_and_one_leader_goes_on(
    server: PostgresServer, local_cluster: MakeCluster, stop: str
) -> None:
    """Shut down (connections refused) or frozen (every call waits out the URL's timeout)
    for longer than a TTL: the leader publishes nothing past its renew deadline and loses
    the lease; once the server is back, one node takes epoch 2 and goes on alone."""
    store, cluster = running(local_cluster, server.url())
    first = acquired(cluster)[0]
    leader = first.node
    assert first.epoch == 1
    offsets = log_ends(cluster)
    if stop == "shut down":
        server.halt()
    else:
        server.signal_all(signal.SIGSTOP)
    cut = NODE_CLOCK.monotonic()  # every renewal answered from now on was sent before this
    wait_until(
        lambda: (
            " lease.lost " in cluster.log(leader)[offsets[leader] :]
            and NODE_CLOCK.monotonic() - cut > TIMING.lease_ttl_ms / 1000
        ),
        "a TTL down, and the leader to lose the lease for want of a renewal",
    )
    if stop == "shut down":
        server.start_again()
    else:
        server.signal_all(signal.SIGCONT)

    second = wait_until(
        lambda: next((o for o in acquired(cluster) if o.epoch == 2), None), "a leader of epoch 2"
    )
    wait_until(lambda: sum(o.epoch == 2 for o in accepted(cluster)) >= 5, "the new leader to go on")
    # Its last successful renewal sent before the cut, the old leader started no publish
    # (whatever its outcome) past its renew deadline, so none after the takeover.
    old = [o for o in history(cluster) if o.op == "publish" and o.epoch == 1]
    last_start = max(o.start for o in old)
    assert last_start <= cut + RENEW_DEADLINE_S + SLACK_S, (last_start - cut, old[-3:])
    assert last_start < second.start
    assert [o.epoch for o in acquired(cluster)] == [1, 2]  # one takeover, no flapping
    assert_one_publisher_per_epoch(cluster)
    assert all(cluster.alive(node) for node in NODES)
    for node in NODES:
        assert "store watch stopped" not in cluster.log(node), cluster.log(node)[-3000:]
    # The leader reports the outage; a frozen server may only have slowed the standby's read.
    wait_until(lambda: leader in reporters(store, "store.recovered"), "the outage in the store")
    assert leader in reporters(store, "store.error")
    lease = store.read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.epoch) == (second.node, 2)
