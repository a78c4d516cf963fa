"""The node's HTTP endpoints against the clients anyone who can reach the port can be.

Idle connections, more connections than the limit, and clients that abort
mid-request, on loopback against an ``Endpoints`` of its own (port 0). Each
connection the server serves runs in a thread named after socketserver's
``process_request_thread``; those threads are what is counted. Every wait is
bounded and on a condition.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.http_address import HttpAddress
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper
from hamsterbunker.node import endpoints as endpoints_module
from hamsterbunker.node.endpoints import Endpoints
from hamsterbunker.node.metrics import NodeMetrics
from hamsterbunker.node.probes import NodeProbes
from hamsterbunker.node.state import Identity, Standing
from hamsterbunker.records import LeaseRecord
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=600)
LOOPBACK = HttpAddress("127.0.0.1", 0)
# Generous: the machine running the tests may be loaded.
BOUND_S = 10.0

Serve = Callable[..., Endpoints]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start Endpoints of a node that is starting, with the limits given; stopped at the end."""
    started: list[Endpoints] = []

    def start(store: MemoryStore | None = None, **limits: float) -> Endpoints:
        """``store``: the one /status reads (a MemoryStore of its own unless given)."""
        clock, standing = FakeClock(), Standing()
        store = store or MemoryStore()
        keeper = LeaseKeeper(MemoryStore(), AGENT, "a", "eu", timing=TIMING, clock=clock)
        identity = Identity("a", "eu", "host", AGENT)
        metrics = NodeMetrics(identity, standing, keeper, clock)
        probes = NodeProbes(identity, standing, keeper, store, clock)
        endpoints = Endpoints(LOOPBACK, metrics, probes, **limits)  # type: ignore[arg-type]
        endpoints.start()
        started.append(endpoints)
        return endpoints

    yield start
    for endpoints in started:
        endpoints.stop()


def serving_threads() -> int:
    """Threads serving a connection now (socketserver names them after their target)."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def status_reads() -> int:
    """Threads reading the store for /status now."""
    return sum(t.name == "hb-http-status" for t in threading.enumerate())


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed sock: it reads as the end (or a reset), without waiting."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=BOUND_S) as got:
            return got.status, got.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_idle_connections_hold_at_most_the_limit_of_threads_and_close_after_the_timeout(
    serve: Serve,
) -> None:
    """Three times the limit of idle connections: the ones over it are closed at once, the
    others after the read timeout, never more threads than the limit, and a request made
    after them is answered."""
    timeout_s, limit = 0.5, 4
    endpoints = serve(read_timeout_s=timeout_s, max_connections=limit)
    opened_at = time.monotonic()
    idle = [connect(endpoints.port) for _ in range(3 * limit)]
    closed_at: dict[int, float] = {}
    most_threads = 0

    def all_closed() -> bool:
        nonlocal most_threads
        most_threads = max(most_threads, serving_threads())
        for i, sock in enumerate(idle):
            if i not in closed_at and closed_by_server(sock):
                closed_at[i] = time.monotonic() - opened_at
        return len(closed_at) == len(idle)

    try:
        wait_until(all_closed, "every idle connection to be closed by the server", BOUND_S)
    finally:
        for sock in idle:
            sock.close()
    assert most_threads <= limit
    # The connections served were left their read timeout before they were closed.
    assert sorted(closed_at.values())[-limit] >= timeout_s
    status, body = get(endpoints.port, "/health")
    assert (status, body) == (503, b"starting\n")
    wait_until(lambda: serving_threads() == 0, "the served connections' threads to end", BOUND_S)


def test_a_request_is_answered_while_idle_connections_fill_the_limit(serve: Serve) -> None:
    """With every connection slot taken by an idle client, a client that retries is answered
    within the read timeout (plus the machine's slack), not never."""
    timeout_s, limit = 0.5, 4
    endpoints = serve(read_timeout_s=timeout_s, max_connections=limit)
    idle = [connect(endpoints.port) for _ in range(limit)]
    try:
        wait_until(lambda: serving_threads() == limit, "the idle connections to be served", BOUND_S)
        began = time.monotonic()

        def answered() -> tuple[int, bytes] | None:
            try:
                return get(endpoints.port, "/health")
            except (ConnectionError, urllib.error.URLError):  # closed at once: over the limit
                return None

        assert wait_until(answered, "/health to be answered", BOUND_S) == (503, b"starting\n")
        assert time.monotonic() - began < BOUND_S
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_aborts_mid_request_is_one_debug_line_and_no_traceback(
    serve: Serve, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A client that resets its connection halfway through its request headers leaves nothing
    on stderr and at most one log line, at debug level."""
    endpoints = serve()
    caplog.set_level(logging.DEBUG, logger="hamsterbunker")
    with connect(endpoints.port) as client:
        client.sendall(b"GET /metrics HTTP/1.0\r\nHost: node\r\n")  # the headers never end
        wait_until(lambda: serving_threads() == 1, "the request to be served", BOUND_S)
        caplog.clear()
        # Linger 0: close sends a reset, as a client killed or timing out would.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_until(lambda: serving_threads() == 0, "the aborted request's thread to end", BOUND_S)
    stderr = capfd.readouterr().err
    assert "Traceback" not in stderr and "Exception occurred" not in stderr, stderr
    logged = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(logged) <= 1 and all(level == logging.DEBUG for level, _ in logged), logged


def test_status_requests_while_the_store_hangs_share_one_read_of_it(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the store hangs, each /status answers 503 within its bound, and all of them
    together leave one thread waiting on the store, not one each."""
    monkeypatch.setattr(endpoints_module, "STATUS_TIMEOUT_S", 0.2)
    release = threading.Event()

    class Hanging(MemoryStore):
        def read_lease(self, agent: str) -> LeaseRecord | None:
            release.wait(BOUND_S)
            return super().read_lease(agent)

    endpoints = serve(Hanging())
    before = status_reads()
    try:
        for _ in range(5):
            answer = get(endpoints.port, "/status")
            assert answer == (503, b"the store did not answer within 0.2 s\n")
        assert status_reads() - before == 1
    finally:
        release.set()
    wait_until(lambda: status_reads() == before, "the read of the store to end", BOUND_S)
    # A request after that read ended starts a new one, which answers: hb status's JSON.
    assert get(endpoints.port, "/status")[1].startswith(b"{")
