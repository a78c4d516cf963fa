"""The sd_notify protocol, against a real AF_UNIX datagram socket bound by the test.

The socket stands in for systemd's: each datagram is one message, read as
systemd reads it (UTF-8, ``KEY=value`` lines).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import Runtime
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.node.notify import Notifier
from hamsterbunker.records import CheckpointInfo, Heartbeat, LeaseRecord
from hamsterbunker.stores import RestoreRead
from hamsterbunker.stores.layer.keys import CLUSTER
from hamsterbunker.testing import MemoryStore
from tests.support import SUPPORT_DIR, wait_until
from tests.support.raw_store import file_key

SECRET = "notify-test-secret"
TICK_MS = 100
TTL_MS = 600


class NotifySocket:
    """A bound datagram socket collecting every message a node sends, with arrival times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.05)
        self._lock = threading.Lock()
        self._received: list[tuple[float, bytes]] = []
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._received.append((time.monotonic(), data))

    def datagrams(self) -> list[bytes]:
        with self._lock:
            return [data for _, data in self._received]

    def messages(self) -> list[str]:
        """Every datagram as text (systemd reads UTF-8); raises if one is not UTF-8."""
        return [data.decode("utf-8") for data in self.datagrams()]

    def times_of(self, message: str) -> list[float]:
        with self._lock:
            return [t for t, data in self._received if data == message.encode()]

    def wait_for(self, predicate: Any, what: str, timeout: float = 20.0) -> list[str]:
        return wait_until(
            lambda: (lambda m: m if predicate(m) else None)(self.messages()),
            f"{what}; received so far: {self.messages()[-12:]}",
            timeout,
        )

    def close(self) -> None:
        self._closed.set()
        self._reader.join(5)
        self._sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    # A short path: AF_UNIX addresses are limited to 107 bytes.
    sock = NotifySocket(Path(f"/tmp/hb-notify-{secrets.token_hex(6)}.sock"))
    try:
        yield sock
    finally:
        sock.close()
        sock.path.unlink(missing_ok=True)


class Counter:
    id = "counter"

    def init(self) -> dict[str, Any]:
        return {"n": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {"n": state["n"] + 1}


class ControlledStore(MemoryStore):
    """A memory store whose heartbeat writes or checkpoint reads can be made to hang."""

    def __init__(self) -> None:
        super().__init__()
        self.hang_heartbeats = threading.Event()
        self.hang_reads = threading.Event()
        self.hanging = threading.Event()  # set while a call hangs
        self.release = threading.Event()

    def _hang(self) -> None:
        self.hanging.set()
        self.release.wait(60)
        self.hanging.clear()

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        if self.hang_heartbeats.is_set():
            self._hang()
        super().put_heartbeat(agent, heartbeat)

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        if self.hang_reads.is_set():
            self._hang()
        return super().read_checkpoint(agent, info)

    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        taken, read = super().take_lease(agent, expected_version, new)
        if read is not None and self.hang_reads.is_set():  # as one too big to read along
            read = dataclasses.replace(read, newest=None)
        return taken, read


def _node(store: MemoryStore, notifier: Notifier, **kwargs: Any) -> Runtime:
    kwargs.setdefault("node_id", "n1")
    kwargs.setdefault("region", "eu-west")
    return Runtime(
        store=store,
        agent=Counter(),
        secret=SECRET,
        timing=LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS),
        notifier=notifier,
        **{"stop_grace_ms": 0, **kwargs},  # parked steps: no grace to wait out
    )


@pytest.fixture
def nodes() -> Iterator[list[Runtime]]:
    """Nodes to stop at the end; any ControlledStore they use is released first."""
    started: list[Runtime] = []
    yield started
    for node in started:
        if isinstance(node.store, ControlledStore):
            node.store.release.set()
    for node in started:
        node.request_stop()
    for node in started:
        node.stop(timeout=20)


def _hb_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HB_SECRET", "NOTIFY_SOCKET")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT_DIR), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


# -- a real node process ------------------------------------------------------


def test_a_node_process_says_ready_status_pings_and_stopping_in_order(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    """hb run sends STATUS(starting), READY=1, role statuses and pings, then STOPPING=1 on SIGTERM."""
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "hamsterbunker", "run", "--store", store.as_uri()),
            "--create-store",
            *("--agent", "hb_test_agents:JournalCounter", "--node-id", "n1"),
            *("--region", "eu-west", "--tick-ms", str(TICK_MS), "--lease-ttl-ms", str(TTL_MS)),
        ],
        env=_hb_env(
            HB_SECRET=SECRET,
            NOTIFY_SOCKET=str(notify_socket.path),
            WATCHDOG_USEC="400000",  # a ping every 0.2 s
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        notify_socket.wait_for(
            lambda m: (
                any(x.startswith("STATUS=active · epoch 1 · step ") for x in m)
                and m.count("WATCHDOG=1") >= 3
            ),
            "an active status with a step number, and three pings",
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, stderr
    messages = notify_socket.messages()
    # One assignment per datagram: a ping never shares a datagram with a status.
    assert all("\n" not in m and m.count("=") >= 1 for m in messages), messages
    kinds = [m.partition("=")[0] for m in messages]
    assert messages[0] == "STATUS=starting · opening the store"
    assert kinds.count("READY") == 1 and kinds.count("STOPPING") == 1
    ready, stopping = kinds.index("READY"), kinds.index("STOPPING")
    role_statuses = [m for m in messages[ready:stopping] if m.startswith("STATUS=")]
    assert role_statuses[0].startswith(("STATUS=standby · ", "STATUS=active · ")), role_statuses
    assert any(m.startswith("STATUS=active · epoch 1 · step ") for m in role_statuses)
    assert "STATUS=stopping · handing over the lease" in messages[stopping:]


def test_ready_is_never_sent_when_the_secret_is_wrong(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    """A node whose secret does not match the cluster's exits 2 without ever saying READY=1."""
    store = tmp_path / "store"
    common = [sys.executable, "-m", "hamsterbunker", "run", "--store", store.as_uri()]
    common += ["--agent", "hb_test_agents:JournalCounter", "--node-id", "n1"]
    # The first node creates the cluster with its secret, then stops.
    first = subprocess.Popen(
        [*common, "--create-store"], env=_hb_env(HB_SECRET=SECRET), stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: file_key(store, CLUSTER).exists(), "the cluster record")
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0
    finally:
        if first.poll() is None:  # the test failed: no node is left behind
            first.kill()
            first.wait(timeout=10)
    second = subprocess.run(
        common,
        env=_hb_env(HB_SECRET="another-secret", NOTIFY_SOCKET=str(notify_socket.path)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 2, second.stderr
    assert "secret" in second.stderr.lower()
    assert "READY=1" not in notify_socket.messages()


# -- the watchdog -------------------------------------------------------------


def test_watchdog_pings_stop_while_the_lease_loop_stalls_and_resume_after(
    notify_socket: NotifySocket, nodes: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    """A store call that hangs stalls the lease loop: pings stop (systemd would kill us)."""
    store = ControlledStore()
    interval = 0.2
    node = _node(store, Notifier(str(notify_socket.path), watchdog_usec=int(interval * 2e6)))
    nodes.append(node)
    node.start()
    notify_socket.wait_for(lambda m: m.count("WATCHDOG=1") >= 3, "three pings")
    with caplog.at_level(logging.ERROR, logger="hamsterbunker"):
        store.hang_heartbeats.set()
        assert store.hanging.wait(10), "the heartbeat write never hung"
        hung_at = time.monotonic()
        wait_until(lambda: "no progress" in caplog.text, "the node to notice its stalled loop", 10)
    # A stall is a pass running longer than one interval; after that no ping
    # may come. Watch for four intervals more.
    silent_from = hung_at + interval + 0.05
    time.sleep(max(0.0, silent_from + 4 * interval - time.monotonic()))
    late = [t for t in notify_socket.times_of("WATCHDOG=1") if t > silent_from]
    assert late == [], f"{len(late)} pings during the stall"
    store.hang_heartbeats.clear()
    store.release.set()
    released = time.monotonic()
    wait_until(
        lambda: [t for t in notify_socket.times_of("WATCHDOG=1") if t > released],
        "pings to resume once the loop moves again",
        10,
    )


def test_pings_follow_half_the_watchdog_interval(
    notify_socket: NotifySocket, nodes: list[Runtime]
) -> None:
    """WATCHDOG_USEC=1 s gives a ping about every 0.5 s, each in its own datagram."""
    node = _node(MemoryStore(), Notifier(str(notify_socket.path), watchdog_usec=1_000_000))
    nodes.append(node)
    node.start()
    notify_socket.wait_for(lambda m: m.count("WATCHDOG=1") >= 5, "five pings", 20)
    times = notify_socket.times_of("WATCHDOG=1")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Generous bounds: the point is "half", not a tenth or the whole interval.
    assert all(0.3 < gap < 0.95 for gap in gaps), gaps


def test_a_non_ascii_status_arrives_as_utf8_and_loses_no_ping(
    notify_socket: NotifySocket, nodes: list[Runtime]
) -> None:
    """A region of 東京 (not even Latin-1, where sdnotify fails silently) reaches systemd intact."""
    store = MemoryStore()
    leader = _node(store, Notifier(None), node_id="n1", region="東京")
    nodes.append(leader)
    leader.start()
    assert leader.ready.wait(10)
    wait_until(lambda: leader.role == "active", "n1 to lead")
    standby = _node(store, Notifier(str(notify_socket.path), watchdog_usec=400_000), node_id="n2")
    nodes.append(standby)
    standby.start()
    messages = notify_socket.wait_for(
        lambda m: "STATUS=standby · leader n1 (東京) · epoch 1" in m and m.count("WATCHDOG=1") >= 3,
        "the standby status naming the leader's region, and pings",
    )
    assert "WATCHDOG=1" in messages[messages.index("STATUS=standby · leader n1 (東京) · epoch 1") :]


def test_a_watchdog_meant_for_another_process_is_not_pinged() -> None:
    """WATCHDOG_PID naming another process means no watchdog for us; the variables are unset."""
    env = {"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}
    notifier = Notifier.from_environment(env)
    assert notifier.watchdog_usec is None
    assert env == {}  # processes the agent starts must not notify or ping as us
    ours = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_environment(ours).watchdog_usec == 2_000_000


# -- restore and failures -----------------------------------------------------


def test_a_slow_restore_extends_the_timeout_and_says_restoring(
    notify_socket: NotifySocket, nodes: list[Runtime]
) -> None:
    """While a checkpoint read hangs, the node has asked for more time and its status says so."""
    store = ControlledStore()
    first = _node(store, Notifier(None))
    nodes.append(first)
    first.start()
    wait_until(lambda: first.seq >= 2, "a published checkpoint")
    first.stop()
    store.hang_reads.set()
    second = _node(store, Notifier(str(notify_socket.path)), node_id="n2")
    nodes.append(second)
    second.start()
    assert store.hanging.wait(15), "the restore never read a checkpoint"
    notify_socket.wait_for(
        lambda m: (
            "EXTEND_TIMEOUT_USEC=30000000" in m
            and any(x.startswith("STATUS=active · epoch 2 · restoring") for x in m)
        ),
        "a timeout extension and a 'restoring' status",
    )
    store.hang_reads.clear()
    store.release.set()
    notify_socket.wait_for(
        lambda m: any(x.startswith("STATUS=active · epoch 2 · step ") for x in m),
        "stepping after the restore",
    )


def test_an_unreachable_socket_is_reported_once_and_the_node_runs_on(
    tmp_path: Path, nodes: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    """systemd going away mid-run costs a warning per message kind, never the node."""
    path = Path(f"/tmp/hb-notify-{secrets.token_hex(6)}.sock")
    sock = NotifySocket(path)
    notifier = Notifier(str(path), watchdog_usec=200_000)
    sock.close()
    path.unlink()  # sends now fail with ECONNREFUSED/ENOENT
    with caplog.at_level(logging.WARNING, logger="hamsterbunker.node.notify"):
        node = _node(MemoryStore(), notifier)
        nodes.append(node)
        node.start()
        wait_until(lambda: node.seq >= 3, "the node to step despite the dead socket")
        wait_until(lambda: "WATCHDOG failed" in caplog.text, "the failed ping to be reported")
        # Then several more pings, each failing, before the warnings are counted.
        pings = [0]
        ping = notifier.watchdog

        def counted() -> None:
            pings[0] += 1
            ping()

        notifier.watchdog = counted  # type: ignore[method-assign]
        wait_until(lambda: pings[0] >= 3, "three more failing pings")
    failures = [r.getMessage() for r in caplog.records if "notification" in r.getMessage()]
    kinds = [m.split()[2] for m in failures]
    assert len(kinds) == len(set(kinds)), failures


def test_a_full_socket_buffer_never_blocks_the_sender(notify_socket: NotifySocket) -> None:
    """Messages to a socket nobody reads are dropped (and reported), never waited on."""
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = notify_socket.path.with_suffix(".stuck")
    stuck.bind(str(path))  # bound but never read: its queue fills
    try:
        notifier = Notifier(str(path))
        for n in range(5000):  # far more than a datagram queue holds
            notifier.status(f"active · epoch 1 · step {n}")
        notifier.watchdog()
    finally:
        stuck.close()
        path.unlink(missing_ok=True)
