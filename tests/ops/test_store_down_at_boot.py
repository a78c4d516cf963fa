"""A store that is down when `hb run` starts: the node waits for it, and never fails its start.

Real `hb run` processes against a Redis port where no server listens yet, with
a datagram socket standing in for systemd's NOTIFY_SOCKET: the node retries
with backoff, says so in its log and its STATUS=, extends the start timeout,
says READY=1 only once the store answered (and the secret checked out), and
then joins (its lease and heartbeat in the store) without anyone touching it.
Only a configuration mistake ends it (exit 2).
"""

from __future__ import annotations

import logging
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker import Runtime
from hamsterbunker.core.errors import CorruptRecord, StoreUnavailable
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.records import ClusterRecord, Event
from hamsterbunker.sealing import new_cluster_record
from hamsterbunker.stores import open_store
from hamsterbunker.testing import MemoryStore
from tests.node.test_notify import Counter, NotifySocket
from tests.support import SUPPORT_DIR, wait_until
from tests.support.agents import SECRET, Recorder
from tests.support.cli import HB, hb_env
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.server_process import free_port

AGENT_ID = "journal"  # hb_test_agents.JournalCounter's id
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    """A socket standing in for systemd's (a short path: AF_UNIX addresses are short)."""
    sock = NotifySocket(Path(f"/tmp/hb-notify-{secrets.token_hex(6)}.sock"))
    try:
        yield sock
    finally:
        sock.close()
        sock.path.unlink(missing_ok=True)


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    """Redis servers a test starts, stopped (and their directories removed) afterwards."""
    require_redis_server()
    started: list[RedisServer] = []
    yield started
    for server in started:
        server.stop()


def _start_node(
    url: str, log_path: Path, notify: NotifySocket, secret: str = SECRET
) -> subprocess.Popen[bytes]:
    command = [
        *HB, "run", "--create-store", "--store", url, "--agent", "hb_test_agents:JournalCounter",
        "--node-id", "n1", "--tick-ms", "100", "--lease-ttl-ms", "600",
    ]  # fmt: skip
    env = hb_env(HB_SECRET=secret, PYTHONPATH=str(SUPPORT_DIR), NOTIFY_SOCKET=str(notify.path))
    with log_path.open("ab") as log:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip


def _waited(log_path: Path, tries: int) -> bool:
    return f"(try {tries}, next in" in log_path.read_text()


def _end(node: subprocess.Popen[bytes]) -> None:
    if node.poll() is None:
        node.kill()
        node.wait(timeout=10)


def test_a_node_started_before_its_redis_waits_and_joins_when_it_comes_up(
    tmp_path: Path, notify: NotifySocket, servers: list[RedisServer]
) -> None:
    """No server on the port: the node stays alive, retrying with backoff, one WARNING line
    per try, STATUS= saying what it waits for, no READY=1. The server starts on that port:
    the node takes the lease and beats with nobody touching it, then says READY=1."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?prefix=boot"
    log_path = tmp_path / "node.log"
    node = _start_node(url, log_path, notify)
    try:
        wait_until(lambda: _waited(log_path, 3) or node.poll() is not None, "three tries", 30)
        assert node.poll() is None, log_path.read_text()  # still waiting, not failed
        messages = notify.messages()
        assert "READY=1" not in messages
        waiting = [m for m in messages if m.startswith("STATUS=starting · waiting for the store")]
        assert waiting and waiting[-1].startswith(
            f"STATUS=starting · waiting for the store {url}: "
        )
        assert "Connection refused" in waiting[-1] and waiting[-1].endswith(")"), waiting
        assert any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in messages), messages
        text = log_path.read_text()
        assert "WARNING" in text and "store.error" in text and "Traceback" not in text, text

        servers.append(RedisServer.start(port=port))
        store = open_store(url)

        def joined() -> bool:
            lease = store.read_lease(AGENT_ID)
            beats = [h.node for h in store.list_heartbeats(AGENT_ID)]
            return lease is not None and lease.holder == "n1" and "n1" in beats

        # The wait is capped at 10 s between tries: it notices within one cap and a bit.
        wait_until(joined, "n1 to take the lease and beat once Redis is up", 30)
        notify.wait_for(lambda m: "READY=1" in m, "READY=1 once the store answered", 10)
        messages = notify.messages()
        last_waiting = max(i for i, m in enumerate(messages) if "waiting for the store" in m)
        assert messages.index("READY=1") > last_waiting
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=20) == 0, log_path.read_text()
    finally:
        _end(node)
    events = [e for e in open_store(url).read_events(AGENT_ID) if e.node == "n1"]
    kinds = [e.type for e in events]
    # A store that was not there yet: made once it answered (--create-store), and said so.
    assert kinds[:4] == ["store.error", "store.recovered", "store.created", "node.online"], kinds
    assert events[0].detail["tries"] >= 3 and events[0].detail["during"] == "start"
    assert "Traceback" not in log_path.read_text()


def test_a_stop_while_waiting_for_the_store_ends_at_once_with_exit_0(
    tmp_path: Path, notify: NotifySocket
) -> None:
    """SIGTERM while the node waits (even in the middle of a 4 s backoff): exit 0 promptly."""
    url = f"redis://127.0.0.1:{free_port()}/0?prefix=boot"
    log_path = tmp_path / "node.log"
    node = _start_node(url, log_path, notify)
    try:
        wait_until(lambda: _waited(log_path, 3) or node.poll() is not None, "three tries", 30)
        assert node.poll() is None, log_path.read_text()
        asked = time.monotonic()
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=10) == 0, log_path.read_text()
        assert time.monotonic() - asked < 3, "the stop waited for the backoff"
    finally:
        _end(node)
    assert "READY=1" not in notify.messages()
    assert "Traceback" not in log_path.read_text()


def test_a_wrong_secret_found_once_the_store_answers_exits_2(
    tmp_path: Path, notify: NotifySocket, servers: list[RedisServer]
) -> None:
    """The store holds another cluster's record but is down at start: the node waits; once
    the store answers, the secret does not open the record: one line, exit 2, no READY=1."""
    first = RedisServer.start(*DURABLE)
    url = first.url(prefix="boot")
    made = open_store(url)
    made.create_cluster(new_cluster_record("another-cluster-secret"))
    made.close()
    first.kill()  # its append-only file stays for the restart
    log_path = tmp_path / "node.log"
    node = _start_node(url, log_path, notify)
    try:
        wait_until(lambda: _waited(log_path, 2) or node.poll() is not None, "two tries", 30)
        assert node.poll() is None, log_path.read_text()
        servers.append(RedisServer.start(*DURABLE, port=first.port, workdir=first.workdir))
        assert node.wait(timeout=30) == 2, log_path.read_text()
    finally:
        _end(node)
    text = log_path.read_text()
    assert "hb run: error:" in text and "secret" in text.lower(), text
    assert "Traceback" not in text, text
    assert "READY=1" not in notify.messages()


def test_a_file_store_whose_parent_directory_is_missing_is_a_mistake_not_a_wait(
    tmp_path: Path,
) -> None:
    """A file store under a directory that does not exist (a mount not there yet) exits 2 at
    once, naming the directory: waiting would hide a typo, and systemd orders the unit after
    its mounts (RequiresMountsFor=)."""
    url = (tmp_path / "not-mounted" / "store").as_uri()
    command = [*HB, "run", "--store", url, "--agent", "hb_test_agents:JournalCounter"]
    env = hb_env(HB_SECRET=SECRET, PYTHONPATH=str(SUPPORT_DIR))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "not-mounted" in done.stderr and "does not exist" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# -- in process: what the wait emits, and what it does not retry ----------------------


class _DownAtFirst(MemoryStore):
    """A store whose cluster record cannot be read (the given error) while ``down``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error, self.down, self.tries = error, True, 0

    def read_cluster(self) -> ClusterRecord | None:
        self.tries += 1
        if self.down:
            raise self.error
        return super().read_cluster()


def _runtime(store: MemoryStore, events: Recorder) -> Runtime:
    return Runtime(
        node_id="n1", region="r1", store=store, agent=Counter(), secret=SECRET,
        timing=LeaseTiming(tick_ms=100, lease_ttl_ms=600), on_event=events,
    )  # fmt: skip


def test_the_wait_is_one_store_error_event_numbered_on_from_the_nodes_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node whose earlier run stored events up to n=5: the wait's store.error (with its tries)
    and store.recovered come as n=6 and 7, before node.online; one WARNING line per try."""
    store = _DownAtFirst(StoreUnavailable("injected: connection refused"))
    store.append_event(Counter.id, Event(node="n1", n=5, type="node.offline", time=time.time()))
    events = Recorder()
    node = _runtime(store, events)
    caplog.set_level(logging.WARNING, logger="hamsterbunker")
    node.start()
    try:
        wait_until(lambda: store.tries >= 3, "three tries of the cluster record", 10)
        assert not node.ready.is_set() and events.of() == []
        store.down = False
        assert node.ready.wait(20)
    finally:
        node.stop(timeout=20)
    stored = [e for e in store.read_events(Counter.id) if e.node == "n1"]
    # (It holds no cluster record yet: the node makes one, and says so once numbered too.)
    assert [(e.n, e.type) for e in stored[:5]] == [
        (5, "node.offline"), (6, "store.error"), (7, "store.recovered"), (8, "store.created"),
        (9, "node.online"),
    ]  # fmt: skip
    assert stored[1].detail["tries"] >= 3 and "connection refused" in stored[1].detail["error"]
    tries = [r for r in caplog.records if "waiting for the store memory://" in r.getMessage()]
    assert len(tries) == stored[1].detail["tries"] and not any(r.exc_info for r in tries)


def test_a_store_error_other_than_unavailable_is_not_waited_for() -> None:
    """A corrupt cluster record is no outage: the node ends with it after one try."""
    store = _DownAtFirst(CorruptRecord("injected: the cluster record does not parse"))
    node = _runtime(store, Recorder())
    node.start()
    assert node.stopped.wait(20), "the node went on waiting"
    with pytest.raises(CorruptRecord):
        node.stop(timeout=20)
    assert store.tries == 1
