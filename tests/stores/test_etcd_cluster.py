"""Real node processes on a three-member etcd cluster: SIGKILL of one member.

The store URL names all three members; a node whose member dies gets a
StoreUnavailable and moves on to the next endpoint. Losing a follower costs
nothing (the lease epoch stays); losing the etcd leader stalls writes for an
election, after which the agent either kept its lease or failed over safely.
Either way steps go on being published and the checker (``local_cluster``'s
teardown) finds the history clean. Without etcd the tests skip, except in CI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from hamsterbunker.core.errors import StoreError
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from tests.support import wait_until
from tests.support.etcd_server import EtcdCluster

pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]

A, B = NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east")
AGENT = "journal"
MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A private three-member cluster (its members get killed); every member stopped after."""
    cluster = EtcdCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def quietly(probe: Callable[[], object]) -> Callable[[], object]:
    """probe, with a store error (a member just died) counted as 'not yet'."""

    def guarded() -> object:
        try:
            return probe()
        except StoreError:
            return None

    return guarded


def latest_seq(store: Store) -> int:
    checkpoints = store.list_checkpoints(AGENT)
    return checkpoints[0].seq if checkpoints else 0


def start_agent(etcd: EtcdCluster, make: MakeCluster) -> LocalCluster:
    # timeout=1: a request to a member that hangs (no leader yet) fails within a second.
    cluster = make(timing=LeaseTiming(200, 2000), store_url=etcd.url(query="timeout=1"))
    cluster.start(A)
    cluster.start(B)
    return cluster


def prefix_of(cluster: LocalCluster) -> str:
    return urlsplit(cluster.store_url).path.lstrip("/")


def assert_no_step_lost(cluster: LocalCluster, store: Store) -> None:
    """Every retained checkpoint's count equals its seq: one count per step, none lost.

    The nodes are stopped first (gracefully), so that no checkpoint is pruned while read.
    """
    assert all(code == 0 for code in cluster.stop_all().values())
    sealer = Sealer(cluster.secret, store.read_cluster())
    infos = store.list_checkpoints(AGENT)
    assert infos
    for info in infos:
        state = sealer.open(store.read_checkpoint(AGENT, info), AGENT, info.epoch, info.seq)
        assert state["count"] == info.seq


def test_sigkill_of_a_follower_member_costs_no_failover_and_no_checkpoint(
    etcd_cluster: EtcdCluster, local_cluster: MakeCluster
) -> None:
    """SIGKILL of a non-leader etcd member: the lease epoch stays, the steps keep rising."""
    cluster = start_agent(etcd_cluster, local_cluster)
    store = open_store(cluster.store_url)
    wait_until(lambda: latest_seq(store) >= 3, "three published steps")
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.epoch == 1

    leader = etcd_cluster.leader()
    victim = next(i for i in range(3) if i != leader)
    etcd_cluster.kill(victim)
    survivors = [i for i in range(3) if i != victim]
    store = open_store(etcd_cluster.url(prefix=prefix_of(cluster), members=survivors))
    before = latest_seq(store)

    wait_until(quietly(lambda: latest_seq(store) >= before + 8), "eight more steps", timeout=30)
    after = store.read_lease(AGENT)
    assert after is not None and (after.epoch, after.holder) == (1, lease.holder)
    types = [e.type for e in store.read_events(AGENT)]
    assert "lease.lost" not in types and "agent.resumed" not in types
    assert_no_step_lost(cluster, store)


def test_sigkill_of_the_leader_member_keeps_or_safely_moves_the_lease(
    etcd_cluster: EtcdCluster, local_cluster: MakeCluster
) -> None:
    """SIGKILL of the etcd leader: after the election the agent steps on, under one epoch or the next."""
    cluster = start_agent(etcd_cluster, local_cluster)
    store = open_store(cluster.store_url)
    wait_until(lambda: latest_seq(store) >= 3, "three published steps")

    leader = etcd_cluster.leader()
    etcd_cluster.kill(leader)
    survivors = [i for i in range(3) if i != leader]
    store = open_store(etcd_cluster.url(prefix=prefix_of(cluster), members=survivors))
    etcd_cluster.wait_healthy(survivors)  # a new etcd leader, bounded
    before = wait_until(quietly(lambda: latest_seq(store)), "the store to answer again")

    wait_until(quietly(lambda: latest_seq(store) >= before + 8), "eight more steps", timeout=40)
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.holder in (A.node, B.node)
    assert lease.epoch <= 3, lease  # kept (1), or a failover or two, each one fenced
    assert_no_step_lost(cluster, store)
