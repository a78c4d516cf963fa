"""A switchover with a node killed at each step of its protocol (failpoints), on every backend.

The steps: the leader sees the request (``switchover.asked``), has published its
last step and not yet handed the lease over (``switchover.before_release``), has
written the target's term (``switchover.after_release``); the target leads it and
has not yet stepped (``switchover.after_acquire``). Whoever dies, the agent goes on
under one leader: the target at once, or a standby a TTL after the dead node's
last write. The ``local_cluster`` fixture holds every history to the checker
(one writer per epoch, nothing published twice, no resume behind).

The slow tier (real processes killed at failpoints): the hand-over itself is
proved in-process on every backend by tests/node/test_control.py and
tests/node/test_handed_lease.py, in the fast tier.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import pytest

from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease.control import request_switchover
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from tests.support import wait_until
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

AGENT = "journal"  # hb_test_agents:JournalCounter
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=800)
A, B, C = NodeSpec("node-a", "eu"), NodeSpec("node-b", "us"), NodeSpec("node-c", "ap")
MakeCluster = Callable[..., LocalCluster]

pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]

# point, the node it kills, who leads after, and how the last takeover came about
POINTS = [
    ("switchover.asked", "node-a", "node-b|node-c", "expired"),
    ("switchover.before_release", "node-a", "node-b|node-c", "expired"),
    ("switchover.after_release", "node-a", "node-c", "switchover"),
    ("switchover.after_acquire", "node-c", "node-a|node-b", "expired"),
]


def seq(store: Store) -> int:
    return max((i.seq for i in store.list_checkpoints(AGENT)), default=0)


def exited(process: subprocess.Popen[bytes], what: str) -> int:
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after 30 s waiting for {what}")


@pytest.mark.parametrize("backend", ["file", "redis", "etcd"])
@pytest.mark.parametrize(("point", "victim", "leads", "via"), POINTS, ids=[p[0] for p in POINTS])
def test_a_node_killed_at_each_step_of_a_switchover_leaves_one_leader_and_loses_nothing(
    local_cluster: MakeCluster, backend: str, point: str, victim: str, leads: str, via: str
) -> None:
    url = {"file": None, "redis": redis_url, "etcd": etcd_url}[backend]
    cluster = local_cluster(store_url=url() if url else None, timing=TIMING)
    store = open_store(cluster.store_url)
    armed = {"HB_FAILPOINTS": f"{point}=kill"}
    processes = {A.node: cluster.start(A, extra_env=armed if victim == A.node else None)}
    wait_until(lambda: (lease := store.read_lease(AGENT)) is not None and lease.holder == A.node
               and seq(store) >= 2, "node-a to lead and step")  # fmt: skip
    for spec in (B, C):
        processes[spec.node] = cluster.start(spec, extra_env=armed if victim == spec.node else None)
    wait_until(lambda: len(store.list_heartbeats(AGENT)) == 3, "three heartbeats")
    cluster_record = store.read_cluster()
    assert cluster_record is not None
    before = store.read_lease(AGENT)
    assert before is not None

    assert request_switchover(store, Sealer(cluster.secret, cluster_record), AGENT, to="node-c")
    code = exited(processes[victim], f"{victim} to be killed at {point}")
    assert code == -signal.SIGKILL, f"{victim} exited with {code}:\n{cluster.log(victim)}"

    def led_on() -> bool:
        lease = store.read_lease(AGENT)
        return (
            lease is not None
            and lease.holder in leads.split("|")
            and (lease.epoch > before.epoch + (1 if victim == C.node else 0))
        )

    wait_until(led_on, f"one of {leads} to lead", 20)
    stood = seq(store)
    wait_until(lambda: seq(store) >= stood + 3, "the new leader to step", 20)
    lease = store.read_lease(AGENT)
    assert lease is not None
    assert lease.history[-1].via == via, lease.history
    if victim == C.node:  # the target took it, then died: its term is in the history too
        assert [t.via for t in lease.history[-2:]] == ["switchover", "expired"]
    store.close()
