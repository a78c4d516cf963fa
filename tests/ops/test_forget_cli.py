"""``hb forget NODE --agent-id ID`` with real ``hb run`` nodes on file, Redis and etcd stores.

A node that was SIGKILLed (the leader, so the lease moves on first) is forgotten
and no longer shown by ``hb status --json``; a live standby is refused (its
heartbeat moves while watched from here) and a node holding the lease is
refused, each with nothing removed; exit codes as other commands. On a fake
clock, in process: liveness is what moves while watched, never the time a
heartbeat carries.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.cli import forget as cli_forget
from hamsterbunker.core.errors import ConfigError, StoreError
from hamsterbunker.records import Heartbeat, LeaseRecord
from hamsterbunker.sealing import new_cluster_record
from hamsterbunker.stores import Store, open_store
from tests.support.cli import AGENT, AGENT_ID, FAST, HB, SECRET, hb_env, run_hb, wait_for

pytestmark = pytest.mark.multiprocess

START_S = 60  # generous: three Python processes starting on a busy 2-core machine
NODES = ("n1", "n2", "n3")


def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "file":
        return (tmp_path / "store").as_uri()
    if backend == "redis":
        from tests.support.redis_server import redis_url

        return redis_url()
    from tests.support.etcd_server import etcd_url

    return etcd_url()


@contextmanager
def nodes(url: str, log: Path, *ids: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """``hb run`` nodes of the counter, killed on the way out if still running."""
    started = {}
    with log.open("ab") as out:
        for node in ids:
            command = [*HB, "run", "--store", url, "--agent", AGENT, "--node-id", node,
                       "--region", "test", "--create-store", *FAST]  # fmt: skip
            started[node] = subprocess.Popen(
                command,
                env=hb_env(HB_SECRET=SECRET),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    try:
        yield started
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


def forget(url: str, node: str, *more: str) -> subprocess.CompletedProcess[str]:
    return run_hb(["forget", node, "--agent-id", AGENT_ID, "--store", url, *more],
                  env=hb_env(HB_SECRET=SECRET))  # fmt: skip


def holder(store: Store) -> str | None:
    lease = store.read_lease(AGENT_ID)
    return lease.holder if lease is not None else None


def beats(store: Store) -> dict[str, Heartbeat]:
    return {beat.node: beat for beat in store.list_heartbeats(AGENT_ID)}


def events_of(store: Store, node: str) -> list[int]:
    return [e.n for e in store.read_events(AGENT_ID) if e.node == node]


@pytest.mark.parametrize("backend", ["file", "redis", "etcd"])
def test_a_killed_node_is_forgotten_and_live_ones_are_refused(backend: str, tmp_path: Path) -> None:
    """Three nodes; the leader SIGKILLed and replaced. hb forget of the killed one: exit 0,
    gone from hb status --json and from the events; of the live standby: exit 1, "is live";
    of the new leader: exit 1, "holds the lease"; nothing of either removed."""
    url, log = store_url(backend, tmp_path), tmp_path / "nodes.log"
    with nodes(url, log, *NODES) as running:
        store = wait_for("the store", lambda: _opened(url), START_S)
        try:
            first = wait_for("a leader and three heartbeats", lambda: _settled(store), START_S)
            running[first].send_signal(signal.SIGKILL)
            running[first].wait(timeout=10)
            second = wait_for("a takeover", lambda: _taken_over(store, first), START_S)
            (standby,) = set(NODES) - {first, second}
            assert events_of(store, first), log.read_text()

            done = forget(url, first)
            assert done.returncode == 0, done.stdout + done.stderr + log.read_text()
            assert done.stdout.startswith(f"forgot node {first} of agent {AGENT_ID}: its "
                                          "heartbeat (host "), done.stdout  # fmt: skip
            assert "as seen from here" in done.stdout and done.stderr == "", done
            shown = json.loads(run_hb(["status", "--store", url, "--agent-id", AGENT_ID,
                                       "--json"]).stdout)  # fmt: skip
            assert sorted(n["node"] for n in shown["nodes"]) == sorted([second, standby]), shown
            assert events_of(store, first) == []

            before = events_of(store, standby)
            live = forget(url, standby)
            assert live.returncode == 1, live.stdout + live.stderr
            assert live.stderr.startswith(f"hb forget: refused: node {standby} of agent "
                                          f"{AGENT_ID} is live: "), live.stderr  # fmt: skip
            assert len(live.stderr.splitlines()) == 1 and live.stdout == "", live
            assert standby in beats(store) and events_of(store, standby)[: len(before)] == before

            leading = forget(url, second)
            assert leading.returncode == 1, leading.stdout + leading.stderr
            assert leading.stderr.startswith(f"hb forget: refused: node {second} holds the lease"),\
                leading.stderr  # fmt: skip
            assert second in beats(store) and events_of(store, second)

            again = forget(url, first)
            assert again.returncode == 1, again.stdout + again.stderr
            assert again.stderr == (f"hb forget: no heartbeat or events of node {first} "
                                    f"(agent {AGENT_ID}) in {store.url}\n")  # fmt: skip
        finally:
            store.close()


def test_usage_mistakes_exit_2_in_one_line(tmp_path: Path) -> None:
    """A missing --agent-id, no store, a bad URL, a name that is no node id, a wrong secret:
    one line each, exit 2, nothing changed; then the store from $HB_STORE forgets."""
    url = (tmp_path / "store").as_uri()
    with nodes(url, tmp_path / "nodes.log", "n1", "n2") as running:
        store = wait_for("the store", lambda: _opened(url), START_S)
        leader = wait_for("a leader", lambda: _settled(store, ("n1", "n2")), START_S)
        gone = "n2" if leader == "n1" else "n1"
        running[gone].send_signal(signal.SIGKILL)
        running[gone].wait(timeout=10)
        env = hb_env(HB_SECRET=SECRET)
        cases = {
            "no agent id": run_hb(["forget", gone, "--store", url], env=env),
            "no store": run_hb(["forget", gone, "--agent-id", AGENT_ID], env=env),
            "bad url": forget("redis://127.0.0.1:notaport/0", gone),
            "missing store": forget((tmp_path / "nothing").as_uri(), gone),
            "bad name": forget(url, f"../{gone}"),
            "glob name": forget(url, "n*"),
            "wrong secret": run_hb(
                ["forget", gone, "--agent-id", AGENT_ID, "--store", url],
                env=hb_env(HB_SECRET="not-the-secret"),
            ),
            "no secret": run_hb(["forget", gone, "--agent-id", AGENT_ID, "--store", url]),
        }
        for case, result in cases.items():
            assert result.returncode == 2, (case, result.stdout, result.stderr)
            assert len(result.stderr.splitlines()) == 1, (case, result.stderr)
            assert result.stderr.startswith("hb forget: error: "), (case, result.stderr)
            assert "Traceback" not in result.stderr and result.stdout == "", (case, result)
        assert gone in beats(store) and events_of(store, gone)
        assert not (tmp_path / "nothing").exists()
        with_env = run_hb(["forget", gone, "--agent-id", AGENT_ID],
                          env=hb_env(HB_SECRET=SECRET, HB_STORE=url))  # fmt: skip
        assert with_env.returncode == 0, with_env.stdout + with_env.stderr
        assert gone not in beats(store) and events_of(store, gone) == []
        assert leader in beats(store)
        store.close()


def _opened(url: str) -> Store | None:
    """The store once a node made it (its cluster record written), else None."""
    try:
        store = open_store(url, create=False)
    except (ConfigError, StoreError):  # not made yet (the file store's directory): look again
        return None
    made = False
    try:
        made = store.read_cluster() is not None
    finally:
        if not made:
            store.close()
    return store if made else None


def _settled(store: Store, ids: tuple[str, ...] = NODES) -> str | None:
    """The leader, once there is one and every node of ids beats."""
    leader = holder(store)
    return leader if leader is not None and set(beats(store)) == set(ids) else None


def _taken_over(store: Store, gone: str) -> str | None:
    leader = holder(store)
    return leader if leader not in (None, gone) else None


# -- liveness, on a fake clock: what moves, never what a writer's clock says ----------


class FakeClock:
    """A monotonic clock that moves only when slept on; each sleep may run a writer first."""

    def __init__(self, on_sleep: Callable[[], None] = lambda: None) -> None:
        self.now, self.slept, self._on_sleep = 100.0, 0.0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self._on_sleep()
        self.now += seconds
        self.slept += seconds


def planted(root: Path, beat_time: float) -> FileStore:
    """A store whose lease (TTL 5 s) n1 holds, with a heartbeat of n2 at beat_time."""
    store = FileStore(root)
    store.create_cluster(new_cluster_record(SECRET))
    store.cas_lease(AGENT_ID, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=5000))
    store.put_heartbeat(AGENT_ID, heartbeat("n2", beat_time, 1))
    return store


def heartbeat(node: str, at: float, count: int) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="h", pid=7, role="standby", epoch=1, seq=0,
                     leader="n1", time=at, beats=count)  # fmt: skip


def forget_in_process(root: Path, clock: FakeClock) -> int:
    args = argparse.Namespace(node="n2", agent_id=AGENT_ID, agent=None, store=root.as_uri())
    return cli_forget.forget(args, lambda: SECRET, clock=clock, sleep=clock.sleep)


def test_a_heartbeat_that_moves_is_live_however_old_its_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A heartbeat stamped in 1970 that is rewritten while watched: refused, nothing removed."""
    store = planted(tmp_path / "store", beat_time=0.0)
    count = iter(range(2, 1000))
    clock = FakeClock(lambda: store.put_heartbeat(AGENT_ID, heartbeat("n2", 0.0, next(count))))
    assert forget_in_process(tmp_path / "store", clock) == 1
    assert "hb forget: refused: node n2 of agent counter is live" in capsys.readouterr().err
    assert "n2" in beats(store)


def test_a_heartbeat_that_stands_still_a_ttl_is_dead_however_fresh_its_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A heartbeat stamped an hour ahead that never changes: forgotten after the lease's TTL
    (5 s) of watching on this process's clock."""
    store = planted(tmp_path / "store", beat_time=time.time() + 3600)
    clock = FakeClock()
    assert forget_in_process(tmp_path / "store", clock) == 0
    assert capsys.readouterr().out.startswith("forgot node n2 of agent counter: its heartbeat")
    assert clock.slept == pytest.approx(5.0)
    assert beats(store) == {}
