"""Network partitions: nodes and the store server each in their own network namespace.

The store (etcd, Redis or PostgreSQL) runs in a server namespace, each of two nodes in its
own (tests/support/netns.py); nftables rules in the server namespace cut the active
node off, fully or one way (its requests arrive, the replies are dropped). The
cut-off leader must stop publishing by its renew deadline, the standby must take
over after a TTL, and once healed the old leader must be fenced or lose the
lease and become a standby. The checker holds the whole history to the safety
rules at teardown (local_cluster).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.clock import MonotonicClock
from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from tests.support import wait_until
from tests.support.etcd_server import require_etcd
from tests.support.netns import Network, require_netns
from tests.support.postgres_server import PostgresServer
from tests.support.redis_server import require_redis_server

pytestmark = [pytest.mark.multiprocess, pytest.mark.fault, pytest.mark.netns]

A, B = NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east")
TICK_MS, TTL_MS = 100, 600
RENEW_DEADLINE_S = 0.6 * TTL_MS / 1000  # the default: 0.6 x TTL
STORE_TIMEOUT_S = 0.3  # every store call fails fast while cut off
SLACK_S = 0.1  # scheduling between the deadline check and the history's start time
MakeCluster = Callable[..., LocalCluster]

# Run inside a node's namespace: true once the server answers there.
_PROBES = {
    "etcd": "import urllib.request as u; "
    "assert b'\"health\":\"true\"' in u.urlopen('http://{addr}:2379/health', timeout=0.5).read()",
    "redis": "import socket; s = socket.create_connection(('{addr}', 6379), 0.5); "
    "s.settimeout(0.5); s.sendall(b'PING\\r\\n'); assert s.recv(16).startswith(b'+PONG')",
    # A login: the server's pg_hba.conf lets the nodes' subnet in.
    "postgres": "import psycopg; psycopg.connect('{conninfo}', connect_timeout=2).close()",
}

NODE_CLOCK = MonotonicClock()  # the clock a node times its history with


@pytest.fixture
def network() -> Iterator[Network]:
    require_netns()
    net = Network([A.node, B.node])
    try:
        yield net
    finally:
        net.close()


@pytest.fixture(params=["etcd", "redis", "postgres"])
def server(request: pytest.FixtureRequest, network: Network, tmp_path: Path) -> Iterator[str]:
    """A store server in the server namespace; yields the nodes' store URL."""
    kind: str = request.param
    addr = network.server_addr
    if kind == "postgres":
        yield from postgres_server(network)
        return
    if kind == "etcd":
        binary = require_etcd()
        peer = "http://127.0.0.1:2380"
        command = [
            binary, "--name", "hb-p", "--data-dir", str(tmp_path / "etcd-data"),
            "--listen-client-urls", f"http://{addr}:2379",
            "--advertise-client-urls", f"http://{addr}:2379",
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"hb-p={peer}", "--log-level", "warn",
        ]  # fmt: skip
        url = f"etcd://{addr}:2379/hb-p?timeout={STORE_TIMEOUT_S}"
    else:
        binary = require_redis_server()
        command = [binary, "--port", "6379", "--bind", addr, "--protected-mode", "no",
                   "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]  # fmt: skip
        url = (f"redis://{addr}:6379/0?prefix=hb-p&socket_timeout={STORE_TIMEOUT_S}"
               f"&socket_connect_timeout={STORE_TIMEOUT_S}")  # fmt: skip
    with open(tmp_path / f"{kind}.log", "ab") as log:
        process = subprocess.Popen(
            [*network.prefix(), *command], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        wait_until_it_answers(network, kind, process, tmp_path / f"{kind}.log")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(tmp_path / "etcd-data", ignore_errors=True)


def postgres_server(network: Network) -> Iterator[str]:
    """PostgreSQL (as nobody: it refuses root) on the server namespace's address."""
    postgres = PostgresServer.start(netns=network.server, host=network.server_addr, port=5432)
    try:
        assert postgres.process is not None
        log = postgres.workdir / "postgres.log"
        wait_until_it_answers(network, "postgres", postgres.process, log, postgres.raw_conninfo())
        yield postgres.url(table="hb_p", query=f"timeout={STORE_TIMEOUT_S}")
    finally:
        postgres.stop()


def wait_until_it_answers(
    network: Network, kind: str, process: subprocess.Popen[bytes], log: Path, conninfo: str = ""
) -> None:
    """Wait (bounded) until the server answers a probe run in a node's namespace."""
    code = _PROBES[kind].format(addr=network.server_addr, conninfo=conninfo)
    probe = [*network.prefix(A.node), sys.executable, "-c", code]

    def answers() -> bool:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0

    wait_until(answers, f"{kind} to answer in its namespace", timeout=20)


def history(cluster: LocalCluster) -> list[Op]:
    assert cluster.history is not None
    return read_history(cluster.history) if cluster.history.exists() else []


def acquired(cluster: LocalCluster, epoch: int) -> Op | None:
    return next(
        (o for o in history(cluster) if o.op == "acquire" and o.outcome == "ok"
         and o.epoch == epoch), None,
    )  # fmt: skip


def published(cluster: LocalCluster, node: str, epoch: int) -> list[Op]:
    return [o for o in history(cluster)
            if o.op == "publish" and o.node == node and o.epoch == epoch]  # fmt: skip


def partition_the_leader(make: MakeCluster, network: Network, url: str, one_way: bool) -> None:
    cluster = make(timing=LeaseTiming(TICK_MS, TTL_MS), store_url=url)
    for spec in (A, B):
        cluster.start(spec, command_prefix=network.prefix(spec.node))
    first = wait_until(lambda: acquired(cluster, 1), "a first leader")
    leader, standby = (A.node, B.node) if first.node == A.node else (B.node, A.node)
    wait_until(
        lambda: sum(o.outcome == "ok" for o in published(cluster, leader, 1)) >= 3,
        "three published steps",
    )
    wait_until(lambda: "node.standby" in cluster.log(standby), "the other node to stand by")
    log_offset = len(cluster.log(leader))

    network.partition(leader, one_way=one_way)
    # On the nodes' clock, as the history's times are: every renewal answered from now
    # on was sent before this.
    cut = NODE_CLOCK.monotonic()
    second = wait_until(lambda: acquired(cluster, 2), "the standby to take over", timeout=15)
    assert second.node == standby
    wait_until(
        lambda: sum(o.outcome == "ok" for o in published(cluster, standby, 2)) >= 3,
        "the new leader to publish",
    )

    # Cut off, the old leader started no publish past its renew deadline (its
    # last successful renewal was sent before the cut), so none after the
    # standby took over. (A write sent before the deadline may still land, one
    # way, and be acknowledged late: the store's fence, not timing, covers that.)
    old = published(cluster, leader, 1)
    last_start = max(o.start for o in old)
    assert last_start <= cut + RENEW_DEADLINE_S + SLACK_S, (last_start - cut, old[-3:])
    assert last_start < second.start, (last_start, second)

    network.heal()

    # Seen from the old leader's own namespace: the new term holds the lease, and
    # the old leader is back in touch (its heartbeat has seen epoch 2) as a standby.
    def status() -> dict[str, Any] | None:
        command = [*network.prefix(leader), sys.executable, "-m", "hamsterbunker", "status",
                   "--store", url, "--agent-id", "journal", "--json"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        if done.returncode != 0:
            return None
        found: dict[str, Any] = json.loads(done.stdout)
        nodes = {n["node"]: n for n in found["nodes"]}
        old_beat = nodes.get(leader, {})
        ok = old_beat.get("role") == "standby" and old_beat.get("epoch", 0) >= 2
        return found if ok else None

    found = wait_until(status, f"{leader} to report back as a standby", timeout=20)
    assert found["lease"]["holder"] == standby and found["lease"]["epoch"] == 2, found
    after_cut = cluster.log(leader)[log_offset:]
    assert "lease.lost" in after_cut or "node.fenced" in after_cut, after_cut[-3000:]
    assert "node.standby" in after_cut and "lease.acquired" not in after_cut, after_cut[-3000:]
    assert cluster.alive(leader), cluster.log(leader)[-3000:]
    # Still one leader: the new one goes on, the old one publishes nothing more.
    count = sum(o.outcome == "ok" for o in published(cluster, standby, 2))
    wait_until(
        lambda: sum(o.outcome == "ok" for o in published(cluster, standby, 2)) >= count + 3,
        "the new leader to go on after the heal",
    )
    assert [o for o in published(cluster, leader, 1) if o.start > cut + 1] == []
    assert acquired(cluster, 3) is None


def test_full_partition_of_the_leader_standby_takes_over_old_leader_steps_down(
    network: Network, server: str, local_cluster: MakeCluster
) -> None:
    """The active node is cut off both ways: it stops by its deadline, the standby takes over."""
    partition_the_leader(local_cluster, network, server, one_way=False)


def test_one_way_partition_replies_lost_standby_takes_over_old_leader_steps_down(
    network: Network, server: str, local_cluster: MakeCluster
) -> None:
    """The active node's requests reach the store but no reply comes back: same safety."""
    partition_the_leader(local_cluster, network, server, one_way=True)
