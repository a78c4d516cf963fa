"""Redis restarts under each persistence setting, with real node processes.

With ``appendfsync always`` a crash of Redis loses nothing a node saw
accepted. With ``everysec`` a crash of the *machine* can lose the last second
of writes, and without persistence a restart loses everything: the store comes
back behind what the nodes saw, or empty. The nodes must notice, say so
(``store.regressed``), and never start the agent over from ``init()``, resume
behind a checkpoint they saw accepted, or take an epoch again.

A SIGKILL of redis-server loses nothing under ``everysec`` (its writes are in
the kernel), so a machine crash is played by restarting Redis on a copy of its
append-only files taken earlier: exactly what a disk that had not yet synced
the last writes would hold.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.stores import Store, open_store
from tests.support import each_ended, wait_until
from tests.support.redis_server import RedisServer
from tests.support.server_process import stop_thawed

pytestmark = pytest.mark.multiprocess

A, B, C = NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east"), NodeSpec("node-c", "ap")
AGENT = "journal"
ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")
EVERYSEC = ("--appendonly", "yes", "--appendfsync", "everysec")
EXIT_REFUSED = 3
MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def redis() -> Iterator[Callable[..., RedisServer]]:
    """Start private servers (restarts reuse the port and directory); all stopped at the end."""
    with each_ended(RedisServer.start, stop_thawed) as start:
        yield start


def newest_seq(store: Store) -> int:
    checkpoints = store.list_checkpoints(AGENT)
    return checkpoints[0].seq if checkpoints else 0


def history(cluster: LocalCluster) -> list[Op]:
    assert cluster.history is not None
    return read_history(cluster.history) if cluster.history.exists() else []


def accepted_seqs(cluster: LocalCluster) -> list[int]:
    return [o.seq for o in history(cluster) if o.op == "publish" and o.outcome == "ok"]


def acquired_epochs(cluster: LocalCluster) -> list[int]:
    return [o.epoch for o in history(cluster) if o.op == "acquire" and o.outcome == "ok"]


def event_types(store: Store) -> list[str]:
    return [e.type for e in store.read_events(AGENT)]


def copy_of_disk(server: RedisServer) -> Path:
    """The append-only files as they are now: what a disk that synced no later would hold."""
    disk = server.workdir / "disk-at-crash"
    shutil.copytree(server.workdir / "appendonlydir", disk)
    return disk


def crash_back_to(
    redis: Callable[..., RedisServer], server: RedisServer, disk: Path
) -> RedisServer:
    """SIGKILL the server and start it again on an earlier copy of its files."""
    server.kill()
    shutil.rmtree(server.workdir / "appendonlydir")
    disk.rename(server.workdir / "appendonlydir")
    return redis(*EVERYSEC, port=server.port, workdir=server.workdir)


def start_nodes(make: MakeCluster, url: str, *specs: NodeSpec) -> LocalCluster:
    cluster = make(store_url=url, timing=LeaseTiming(200, 2000))
    for spec in specs:
        cluster.start(spec)
    return cluster


def running(
    make: MakeCluster, redis: Callable[..., RedisServer], *settings: str
) -> tuple[RedisServer, Store, LocalCluster]:
    """A Redis with these persistence settings, and node-a and node-b five checkpoints in,
    each having said (in its heartbeat) that it saw the lease: a node that first reaches
    the store after a restart emptied it cannot tell it from a new store."""
    server = redis(*settings)
    url = server.url(prefix="p")
    store = open_store(url)
    cluster = start_nodes(make, url, A, B)
    wait_until(lambda: newest_seq(store) >= 5, "five checkpoints")
    wait_until(lambda: seen_by_both(store), "both nodes to have seen the lease")
    return server, store, cluster


def seen_by_both(store: Store) -> bool:
    seen = {b.node for b in store.list_heartbeats(AGENT) if b.epoch >= 1}
    return seen >= {A.node, B.node}


def exit_code(cluster: LocalCluster, node: str, timeout: float = 60) -> int:
    try:
        return cluster.processes[node].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{node} did not exit within {timeout} s:\n{cluster.log(node)}")


def assert_refused_and_never_started_over(cluster: LocalCluster, *nodes: str) -> None:
    """Every node exits with the refusal code, saying why, and none ran init() again."""
    for node in nodes:
        assert exit_code(cluster, node) == EXIT_REFUSED, cluster.log(node)
        assert "went back in time" in cluster.log(node)
    restores = [o for o in history(cluster) if o.op == "restore"]
    assert [o.outcome for o in restores].count("started") == 1, restores  # the first start only
    epochs = acquired_epochs(cluster)
    assert epochs == sorted(set(epochs)), epochs  # no epoch taken twice, none taken back


def test_appendfsync_always_a_redis_crash_loses_nothing_accepted(
    local_cluster: MakeCluster, redis: Callable[..., RedisServer]
) -> None:
    server, store, cluster = running(local_cluster, redis, *ALWAYS)
    server.kill()
    # Freeze the nodes so the restarted store is read before any new write.
    for node in (A, B):
        cluster.signal(node.node, signal.SIGSTOP)
    accepted = max(accepted_seqs(cluster))
    server = redis(*ALWAYS, port=server.port, workdir=server.workdir)
    # Nothing accepted is lost; a write in flight at the crash may have landed unanswered.
    assert accepted <= newest_seq(store) <= accepted + 1
    for node in (A, B):
        cluster.signal(node.node, signal.SIGCONT)
    wait_until(lambda: max(accepted_seqs(cluster)) >= accepted + 5, "five more checkpoints")
    assert "store.regressed" not in event_types(store)
    assert acquired_epochs(cluster) == [1]  # the leader kept its lease through the restart
    assert event_types(store).count("agent.started") == 1


def test_everysec_store_behind_within_the_term_is_reported_and_the_leader_goes_on(
    local_cluster: MakeCluster, redis: Callable[..., RedisServer]
) -> None:
    """Behind, but the lease record is still the leader's own term: nobody else can have
    written, so the leader adopts it and goes on from its own state, never from the
    store's older checkpoint; everyone reports the regression."""
    server, store, cluster = running(local_cluster, redis, *EVERYSEC)
    disk = copy_of_disk(server)
    behind = newest_seq(store)
    wait_until(lambda: max(accepted_seqs(cluster)) >= behind + 5, "five more checkpoints")
    # Frozen, so that the restarted store is read before the leader writes to it again.
    for node in (A, B):
        cluster.signal(node.node, signal.SIGSTOP)
    accepted = max(accepted_seqs(cluster))
    server = crash_back_to(redis, server, disk)
    assert newest_seq(store) < accepted  # the store really came back behind
    for node in (A, B):
        cluster.signal(node.node, signal.SIGCONT)

    def reported_by_both() -> bool:
        found = {e.node for e in store.read_events(AGENT) if e.type == "store.regressed"}
        return found == {A.node, B.node}

    wait_until(reported_by_both, "both nodes to report store.regressed")
    wait_until(lambda: newest_seq(store) >= accepted + 3, "the leader to publish on")
    after = sorted(s for s in accepted_seqs(cluster) if s > behind)
    assert after == list(range(after[0], after[-1] + 1)), after  # on from its own state
    assert acquired_epochs(cluster) == [1]
    assert [o.outcome for o in history(cluster) if o.op == "restore"] == ["started"]


def test_everysec_store_behind_a_takeover_is_refused_by_every_node(
    local_cluster: MakeCluster, redis: Callable[..., RedisServer]
) -> None:
    """Behind past a takeover: the lease record is an older epoch and the checkpoints are
    older than what the nodes saw. Nobody resumes behind them or reuses an epoch: each node
    that takes the lease refuses (exit 3), and so does a node started afterwards."""
    server, store, cluster = running(local_cluster, redis, *EVERYSEC)
    disk = copy_of_disk(server)
    behind = newest_seq(store)
    leader = A if store.read_lease(AGENT).holder == A.node else B
    cluster.kill(leader.node)
    wait_until(lambda: 2 in acquired_epochs(cluster), "the standby to take over")
    wait_until(lambda: max(accepted_seqs(cluster)) >= behind + 5, "the new leader to publish")
    cluster.start(leader)  # a fresh process: it knows only what it reads from now on
    wait_until(
        lambda: any(b.node == leader.node and b.beats >= 3 for b in store.list_heartbeats(AGENT)),
        "the old leader to run again as a standby",
    )
    server = crash_back_to(redis, server, disk)
    assert store.read_lease(AGENT).epoch == 1  # behind the takeover

    assert_refused_and_never_started_over(cluster, A.node, B.node)
    assert newest_seq(store) == behind  # nothing written behind what was seen
    assert store.read_lease(AGENT).epoch > 2
    cluster.start(C)  # started later: the lease record still says what was accepted
    assert_refused_and_never_started_over(cluster, C.node)


def test_no_persistence_an_empty_store_is_refused_and_the_cluster_record_put_back(
    local_cluster: MakeCluster, redis: Callable[..., RedisServer]
) -> None:
    """Without persistence a restart empties the store. The nodes refuse to start the
    agent over from init() (exit 3), never reuse an epoch, and put the cluster record back
    so that the key of the sealed checkpoints stays the same."""
    server, store, cluster = running(local_cluster, redis)
    key_id = store.read_cluster().key_id
    server.kill()
    server = redis(port=server.port)  # empty
    assert_refused_and_never_started_over(cluster, A.node, B.node)
    assert store.list_checkpoints(AGENT) == []
    assert store.read_cluster().key_id == key_id
    assert store.read_lease(AGENT).epoch > 1
    regressed = [
        e.detail["reason"] for e in store.read_events(AGENT) if e.type == "store.regressed"
    ]
    assert any("gone" in reason for reason in regressed), regressed
    cluster.start(C)
    assert_refused_and_never_started_over(cluster, C.node)


def test_no_persistence_nodes_that_were_down_remember_through_their_state_directory(
    local_cluster: MakeCluster, redis: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """Every node is down while Redis restarts empty, so no running node sees it go. Nodes
    started again with their state directories ($STATE_DIRECTORY, as systemd sets it)
    remember the epoch and seq they saw and refuse, instead of starting over from init()."""
    server = redis()
    url = server.url(prefix="p")
    store = open_store(url)
    cluster = local_cluster(store_url=url, timing=LeaseTiming(200, 2000))
    state = {spec.node: {"STATE_DIRECTORY": str(tmp_path / spec.node)} for spec in (A, B)}
    for spec in (A, B):
        cluster.start(spec, extra_env=state[spec.node])
    wait_until(lambda: newest_seq(store) >= 5, "five checkpoints")
    # Each node has seen the lease (a node stopped before its first read remembers
    # nothing, and may rightly start afresh on the emptied store).
    wait_until(
        lambda: {b.node for b in store.list_heartbeats(AGENT) if b.epoch == 1} == {A.node, B.node},
        "both nodes to have seen the lease",
    )
    assert set(cluster.stop_all().values()) == {0}
    server.kill()
    server = redis(port=server.port)  # empty
    for spec in (A, B):
        cluster.start(spec, extra_env=state[spec.node])
    assert_refused_and_never_started_over(cluster, A.node, B.node)
    assert store.list_checkpoints(AGENT) == []
