"""`hb run --http HOST:PORT` on real node processes: the numbers move as a takeover says.

Three `hb run` processes on one store (file, Redis, etcd), each serving on a
loopback port of its own, are scraped while the leader is SIGKILLed: exactly
one answers /leader 200 before, the killed one's port is closed, one other
answers 200 after; the new leader's takeovers_total{via="expired"} rose by
one, its epoch went up, is_leader is 1 on it alone, its steps_total grows, and
/health is 200 on the live nodes. A bad --http is one line and exit 2.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.config import parse_config
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from tests.support import wait_until
from tests.support.cli import AGENT, FAST, HB, SECRET, hb_env, run_hb
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url
from tests.support.server_process import free_port

pytestmark = pytest.mark.multiprocess

NODES = (NodeSpec("node-a", "eu"), NodeSpec("node-b", "us"), NodeSpec("node-c", "ap"))
MakeCluster = Callable[..., LocalCluster]


@pytest.fixture(params=["file", "redis", "etcd"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None for local_cluster's own file store, or a prefix on the session's Redis or etcd."""
    urls = {"redis": redis_url, "etcd": etcd_url}
    return urls[request.param]() if request.param in urls else None


def get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body), or None when nothing answers on the port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def metrics(port: int) -> dict[str, float]:
    """The node's unlabelled samples, and takeovers_total by via as takeovers_<via>."""
    answer = get(port, "/metrics")
    assert answer is not None and answer[0] == 200
    found = {}
    for family in text_string_to_metric_families(answer[1]):
        for s in family.samples:
            name = s.name.removeprefix("hamsterbunker_")
            if name == "takeovers_total":
                found[f"takeovers_{s.labels['via']}"] = s.value
            elif not s.labels:
                found[name] = s.value
    return found


def leaders(ports: dict[str, int]) -> list[str]:
    return [node for node, port in ports.items() if (get(port, "/leader") or (0,))[0] == 200]


def serving_on(port: int) -> list[str]:
    """A command prefix that runs the node with --http on port (the process is the node)."""
    return ["sh", "-c", f'exec "$@" --http 127.0.0.1:{port}', "sh"]


def test_scraped_numbers_follow_a_leader_killed_and_replaced(
    local_cluster: MakeCluster, store_url: str | None
) -> None:
    cluster = local_cluster(timing=LeaseTiming(200, 1000), store_url=store_url)
    ports = {spec.node: free_port() for spec in NODES}
    for spec in NODES:
        cluster.start(spec, command_prefix=serving_on(ports[spec.node]))
    wait_until(
        lambda: all((get(p, "/health") or (0,))[0] == 200 for p in ports.values()),
        "/health 200 on all three nodes",
    )
    old = wait_until(lambda: leaders(ports), "one node to answer /leader 200")
    assert len(old) == 1, old
    old_leader = old[0]
    before = {node: metrics(port) for node, port in ports.items()}
    assert [n for n, m in before.items() if m["is_leader"] == 1] == [old_leader]
    first = before[old_leader]["steps_total"]
    wait_until(lambda: metrics(ports[old_leader])["steps_total"] > first, "the leader's steps")

    cluster.kill(old_leader)
    assert get(ports[old_leader], "/health") is None  # gone with its node
    live = {node: port for node, port in ports.items() if node != old_leader}
    new = wait_until(lambda: leaders(live), "a standby to answer /leader 200", timeout=60)
    assert len(new) == 1, new
    new_leader = new[0]
    (standby,) = set(live) - {new_leader}

    after = metrics(live[new_leader])
    taken = before[new_leader]
    assert after["takeovers_expired"] == taken["takeovers_expired"] + 1
    assert after["epoch"] > taken["epoch"] and after["epoch"] > before[old_leader]["epoch"]
    assert after["is_leader"] == 1 and metrics(live[standby])["is_leader"] == 0
    assert (get(live[standby], "/leader") or (0,))[0] == 503
    steps = after["steps_total"]
    wait_until(lambda: metrics(live[new_leader])["steps_total"] > steps, "the new leader's steps")
    assert metrics(live[standby])["takeovers_expired"] == before[standby]["takeovers_expired"]
    wait_until(
        lambda: all((get(p, "/health") or (0,))[0] == 200 for p in live.values()),
        "/health 200 on the two live nodes",
    )
    standby_health = get(live[standby], "/health")
    assert standby_health is not None and f"leader {new_leader}" in standby_health[1]


def test_a_bad_http_address_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = hb_env(HB_SECRET=SECRET)
    store = ["--store", (tmp_path / "store").as_uri(), "--agent", AGENT, "--create-store", *FAST]
    result = run_hb(["run", *store, "--http", "localhost"], env=env)
    assert result.returncode == 2
    assert "--http: 'localhost' is not HOST:PORT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with socket.socket() as taken:  # a port in use: found when the node binds it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_hb(["run", *store, "--http", f"127.0.0.1:{port}"], env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"hb run: error: http 127.0.0.1:{port}: cannot listen there: Address already in use"
    ]
    assert not list((tmp_path / "store").glob("kv/agents/*/*"))  # refused before it joined


def test_the_config_key_http_is_checked_like_the_flag() -> None:
    keys = {"store": "file:///s", "agent": AGENT}
    assert parse_config({**keys, "http": "[::1]:9100"}, Path("n.toml")).http == "[::1]:9100"
    with pytest.raises(ConfigError, match=r"n.toml: '127.0.0.1:0' is not HOST:PORT"):
        parse_config({**keys, "http": "127.0.0.1:0"}, Path("n.toml"))


def test_a_node_without_http_listens_nowhere(tmp_path: Path) -> None:
    """Off by default: without --http, hb run holds no listening TCP socket."""
    env = hb_env(HB_SECRET=SECRET)
    store = ["--store", (tmp_path / "store").as_uri(), "--agent", AGENT, "--create-store", *FAST]
    process = subprocess.Popen(
        [*HB, "run", *store, "--node-id", "n1"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: list((tmp_path / "store").glob("kv/agents/*/beats/*")), "a heartbeat")
        tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
        listening = {
            f"socket:[{fields[9]}]"
            for table in tables
            if table.exists()
            for fields in (line.split() for line in table.read_text().splitlines()[1:])
            if fields[3] == "0A"  # TCP_LISTEN
        }
        own = set()
        for fd in Path(f"/proc/{process.pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):  # closed since listed: no listener
                own.add(str(fd.readlink()))
        assert not listening & own
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_pause_and_switchover_show_in_the_numbers(local_cluster: MakeCluster) -> None:
    """hb pause: the leader's paused gauge is 1 and /health stays 200 saying so; hb resume: 0.
    hb switchover --to: the target's takeovers_total{via="switchover"} rises and /leader moves."""
    cluster = local_cluster(timing=LeaseTiming(100, 800))
    ports = {spec.node: free_port() for spec in NODES}
    cluster.start(NODES[0], command_prefix=serving_on(ports["node-a"]))
    wait_until(lambda: leaders(ports) == ["node-a"], "node-a to lead")
    for spec in NODES[1:]:
        cluster.start(spec, command_prefix=serving_on(ports[spec.node]))
    wait_until(
        lambda: all((get(p, "/health") or (0,))[0] == 200 for p in ports.values()),
        "/health 200 on all three nodes",
    )
    env = hb_env(HB_STORE=cluster.store_url, HB_SECRET=cluster.secret)

    def hb(*args: str) -> None:
        done = run_hb([*args, "--agent-id", "journal"], env=env, timeout=60)
        assert done.returncode == 0, done.stderr

    hb("pause")
    wait_until(lambda: metrics(ports["node-a"])["paused"] == 1, "node-a's paused gauge")
    assert get(ports["node-a"], "/health") == (200, "leader · epoch 1 · paused\n")
    hb("resume")
    wait_until(lambda: metrics(ports["node-a"])["paused"] == 0, "node-a to resume")

    before = metrics(ports["node-c"])["takeovers_switchover"]
    hb("switchover", "--to", "node-c", "--wait", "--timeout", "20")
    wait_until(lambda: leaders(ports) == ["node-c"], "/leader 200 on node-c alone")
    after = metrics(ports["node-c"])
    assert after["takeovers_switchover"] == before + 1 and after["is_leader"] == 1
    assert metrics(ports["node-a"])["is_leader"] == 0
