"""A store an earlier version wrote is refused, never read as an empty store
(``stores.backends.earlier``).

The hand-written stores of earlier versions kept the same records in other
layouts (read by ``stores.earlier``). Read by this version such a store would look
empty and a node would start its agents afresh: silent loss. Each test plants
an earlier store's records raw, as those stores wrote them (a cluster record,
an agent's lease and checkpoint), and opens it as this version does.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest

from hamsterbunker import FileStore
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.stores import open_store
from tests.support.cli import HB, hb_env
from tests.support.records import cluster, lease, network_heartbeat

AGENT = "a"
LEASE = lease("n1", 1).to_json()
INFO = json.dumps({"epoch": 1, "seq": 1, "size": 6, "written": 1.0}).encode()


class Earlier(Protocol):
    url: str
    where: str  # how the refusal names the store

    def plant(self, *, cluster_only: bool = False) -> None:
        """The records an earlier store holds once a node has run (or only its cluster
        record, as ``hb init`` leaves it)."""

    def names(self) -> set[str]:
        """Every name in the store's space (a file, a Redis key, an etcd key)."""

    def close(self) -> None: ...


class EarlierFile:
    """The earlier file store's: cluster.json and agents/<agent>/... at the root."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "store"
        self.root.mkdir()
        self.url, self.where = self.root.as_uri(), str(self.root)

    def plant(self, *, cluster_only: bool = False) -> None:
        (self.root / "cluster.json").write_bytes(cluster(1).to_json())
        if cluster_only:
            return
        agent = self.root / "agents" / AGENT
        (agent / "checkpoints").mkdir(parents=True)
        (agent / "lease.json").write_bytes(LEASE)
        (agent / "checkpoints" / f"ckpt-{1:020d}-{1:010d}.hbc").write_bytes(b"sealed")

    def names(self) -> set[str]:
        return {str(path.relative_to(self.root)) for path in self.root.rglob("*")}

    def close(self) -> None:
        pass


class EarlierRedis:
    """The earlier Redis store's: P:cluster, P:agent:<agent>:lease and the like."""

    def __init__(self) -> None:
        import redis

        from hamsterbunker.stores.backends.redis_connection import parse_redis_url
        from tests.support.redis_server import redis_url

        self.url = self.where = redis_url()
        client_url, self.prefix = parse_redis_url(self.url)
        self.client = redis.Redis.from_url(client_url)

    def plant(self, *, cluster_only: bool = False) -> None:
        self.client.set(f"{self.prefix}:cluster", cluster(1).to_json())
        if cluster_only:
            return
        agent = f"{self.prefix}:agent:{AGENT}"
        self.client.hset(f"{agent}:lease", mapping={"record": LEASE, "version": 1})
        self.client.hset(f"{agent}:checkpoints", "1", INFO)
        self.client.hset(f"{agent}:blobs", "1", b"sealed")

    def names(self) -> set[str]:
        # Every key of this prefix, the backend's {P}:... included.
        found = self.client.keys(f"*{self.prefix}*")
        return {key.decode() for key in found}

    def close(self) -> None:
        self.client.close()


class EarlierEtcd:
    """The earlier etcd store's: P/cluster and P/agents/<agent>/..., under the URL's prefix P."""

    def __init__(self) -> None:
        from etcd3gw.client import Etcd3Client

        from hamsterbunker.stores.backends.etcd_connection import parse_etcd_url
        from tests.support.etcd_server import shared_etcd

        server = shared_etcd()
        self.url = self.where = server.url()
        self.prefix = parse_etcd_url(self.url).prefix
        self.client = Etcd3Client(host="127.0.0.1", port=server.port, timeout=5, api_path="/v3/")

    def plant(self, *, cluster_only: bool = False) -> None:
        self.client.put(f"{self.prefix}/cluster", cluster(1).to_json())
        if cluster_only:
            return
        agent = f"{self.prefix}/agents/{AGENT}"
        self.client.put(f"{agent}/lease", LEASE)
        self.client.put(f"{agent}/checkpoint-info/{1:020d}", INFO)
        self.client.put(f"{agent}/checkpoints/{1:020d}-{1:010d}", b"sealed")

    def names(self) -> set[str]:
        found = self.client.get_prefix(self.prefix + "/")
        return {meta["key"].decode() for _value, meta in found}

    def close(self) -> None:
        self.client.session.close()


EARLIER: dict[str, Callable[[Path], Earlier]] = {
    "file": EarlierFile,
    "redis": lambda _tmp_path: EarlierRedis(),
    "etcd": lambda _tmp_path: EarlierEtcd(),
}


@pytest.fixture(params=list(EARLIER))
def earlier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Earlier]:
    made = EARLIER[request.param](tmp_path)
    try:
        yield made
    finally:
        made.close()


def refusal(earlier: Earlier, exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert earlier.where in message and "earlier version" in message, message
    assert "new, empty store" in message, message  # what to do
    return message


def test_an_earlier_store_is_refused_in_one_line_and_left_as_it_was(earlier: Earlier) -> None:
    """A node's open and a reader's open are both a ConfigError naming the store, that an
    earlier version wrote it and what to do; nothing of this version's is written there."""
    earlier.plant()
    before = earlier.names()
    for create in (True, False):
        with pytest.raises(ConfigError) as refused:
            open_store(earlier.url, create=create).read_cluster()
        refusal(earlier, refused)
    assert earlier.names() == before


@pytest.mark.parametrize("command", ["run", "status"])
def test_hb_on_an_earlier_store_exits_2_in_one_line(earlier: Earlier, command: str) -> None:
    """hb run (a node) and hb status (a reader) stop at once, exit 2, and say why."""
    earlier.plant()
    before = earlier.names()
    argv = ["--store", earlier.url]
    if command == "run":
        argv += ["--agent", "hamsterbunker.demo:CounterAgent", "--node-id", "n2"]
    else:
        argv += ["--agent-id", AGENT]
    env = hb_env(HB_SECRET="correct-horse-battery")
    done = subprocess.run(
        [*HB, command, *argv], env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "earlier version" in lines[0], done.stderr
    assert earlier.where in lines[0]
    assert earlier.names() == before


def test_the_file_store_class_refuses_an_earlier_directory(tmp_path: Path) -> None:
    """hamsterbunker.FileStore(path) refuses it too, an earlier store left by hb init (its
    cluster record alone) included: this version would write its own beside it."""
    made = EarlierFile(tmp_path)
    made.plant(cluster_only=True)
    with pytest.raises(ConfigError) as refused:
        FileStore(made.root)
    refusal(made, refused)
    assert os.listdir(made.root) == ["cluster.json"]


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_a_client_opened_before_the_server_held_it_is_refused_at_its_first_call(
    tmp_path: Path, backend: str
) -> None:
    """The earlier layout is looked for by the first call that reaches the server, not at
    open: a node may open its store before the server is up."""
    made = EARLIER[backend](tmp_path)
    store = open_store(made.url)
    try:
        made.plant()
        with pytest.raises(ConfigError) as refused:
            store.read_lease(AGENT)
        refusal(made, refused)
    finally:
        store.close()
        made.close()


def test_an_etcd_store_of_this_version_is_not_taken_for_an_earlier_one(tmp_path: Path) -> None:
    """Both versions keep their records under the prefix's agents/, the earlier one under
    names of its own: junk under this version's names is no earlier store, an agent is
    listed in index/ with its first write, whatever that write is, and an earlier store's
    cluster record alone is the same record, taken as it is."""
    made = EarlierEtcd()
    try:
        made.plant(cluster_only=True)
        made.client.put(f"{made.prefix}/agents/x/effects/{1:020d}/0000-intent", b"junk")
        first = open_store(made.url)
        first.put_acceptance(AGENT, b"accepted")
        first.put_heartbeat("b", network_heartbeat("n1"))
        first.close()
        second = open_store(made.url, create=False)
        try:
            assert second.read_cluster() == cluster(1)
            assert second.read_acceptance(AGENT) == b"accepted"
            assert second.list_agents() == [AGENT, "b"]
        finally:
            second.close()
    finally:
        made.close()
