"""``hb run --http HOST:PORT``: the node's HTTP endpoints, served from threads of their own.

``/metrics``, ``/health``, ``/leader`` and ``/status`` (``node.probes``); never on the
event loop. Binds when the node starts (an address in use is a ConfigError) and
closes when it stops. A client is bounded by ``READ_TIMEOUT_S``, ``MAX_CONNECTIONS``
and ``STATUS_TIMEOUT_S`` (docs/design.md, "The node").
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import choose_encoder

from ..core.errors import ConfigError
from ..core.http_address import HttpAddress
from .metrics import NodeMetrics
from .probes import Answer, NodeProbes

__all__ = ["Endpoints"]

log = logging.getLogger("hamsterbunker")
# The most /status waits for the store before it answers 503.
STATUS_TIMEOUT_S = 5.0
# How long a connection may stay silent while it sends its request or takes its answer.
READ_TIMEOUT_S = 5.0
# Connections served at once: scrapers, probes and hb status need a handful, and each one
# holds a thread.
MAX_CONNECTIONS = 16
PATHS = ("/metrics", "/health", "/leader", "/status")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client that never finishes its request does not hold up a stop
    allow_reuse_address = True

    def __init__(
        self, address: HttpAddress, endpoints: Endpoints, read_timeout_s: float, connections: int
    ) -> None:
        # A literal IPv6 address needs an IPv6 socket; "" and names take the first IPv4 one.
        if ":" in address.host:
            self.address_family = socket.AF_INET6
        self.endpoints, self.read_timeout_s = endpoints, read_timeout_s
        self.connections = connections
        self._slots = threading.BoundedSemaphore(connections)
        super().__init__((address.host, address.port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Closed at once rather than queued for a thread: a flood of connections then costs
        # no more threads than the limit, and those it holds end within the read timeout.
        if not self._slots.acquire(blocking=False):
            log.debug("http: %s: closed, %d open already", _peer(client_address), self.connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Not socketserver's traceback on stderr: anyone who can reach the port could fill
        # the journal with them, one per request aborted.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # the client went away, or stalled past the timeout
            log.debug("http: %s: %s", _peer(client_address), exc)
            return
        log.warning("http: %s: the request failed: %r", _peer(client_address), exc)
        log.debug("http: the failure in full", exc_info=True)


def _peer(client_address: Any) -> str:
    """``host:port`` of a client (its address tuple as the socket family gives it)."""
    host, port = client_address[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server  # HTTP/1.0: a connection per request, so none outlives a stopped node

    def setup(self) -> None:
        super().setup()
        # On the socket: each read of the request and each write of the answer is bounded.
        self.connection.settimeout(self.server.read_timeout_s)

    def do_GET(self) -> None:
        self.server.endpoints.answer(self)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)

    def send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET


class _StatusRead:
    """One read of the store for /status, in a daemon thread of its own: a store call that
    hangs neither holds an answer past STATUS_TIMEOUT_S nor keeps the process from exiting."""

    def __init__(self, read: Callable[[], Answer]) -> None:
        self.answer: Answer | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(read,), name="hb-http-status", daemon=True).start()

    def _run(self, read: Callable[[], Answer]) -> None:
        try:
            self.answer = read()
        finally:
            self.done.set()


class Endpoints:
    """The HTTP endpoints of one node: ``start()`` binds and serves, ``stop()`` closes.

    ``read_timeout_s`` and ``max_connections``: see READ_TIMEOUT_S and MAX_CONNECTIONS.
    """

    def __init__(
        self,
        address: HttpAddress,
        metrics: NodeMetrics,
        probes: NodeProbes,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.address, self._metrics, self._probes = address, metrics, probes
        self._read_timeout_s, self._max_connections = read_timeout_s, max_connections
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._status_lock = threading.Lock()
        self._status_in_flight: _StatusRead | None = None

    @property
    def port(self) -> int:
        """The port bound (the one asked for, or the one given for port 0)."""
        assert self._server is not None
        return int(self._server.server_address[1])

    def start(self) -> None:
        try:
            self._server = _Server(self.address, self, self._read_timeout_s, self._max_connections)
        except OSError as exc:  # in use, not an address of this machine, a name that resolves not
            reason = exc.strerror or str(exc)
            raise ConfigError(f"http {self.address}: cannot listen there: {reason}") from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="hb-http",
            daemon=True,
        )  # fmt: skip
        self._thread.start()
        log.info("serving /metrics, /health, /leader and /status on http://%s", self.address)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def answer(self, request: _Handler) -> None:
        """One request, in the server's thread for it."""
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
            request.send(200, encoder(self._metrics.registry), content_type)
            return
        if path == "/health":
            answer = self._probes.health()
        elif path == "/leader":
            answer = self._probes.leader()
        elif path == "/status":
            self._send_status(request)
            return
        else:
            request.send(404, f"not found; try {', '.join(PATHS)}\n".encode(), "text/plain")
            return
        self._send(request, answer, "text/plain; charset=utf-8")

    def _send_status(self, request: _Handler) -> None:
        read = self._status_read()
        answer = (
            read.answer
            if read.done.wait(STATUS_TIMEOUT_S) and read.answer is not None
            else Answer(False, f"the store did not answer within {STATUS_TIMEOUT_S:g} s")
        )
        json_doc = answer.text.startswith("{")
        self._send(request, answer, "application/json" if json_doc else "text/plain; charset=utf-8")

    def _status_read(self) -> _StatusRead:
        """The read in flight, else a new one: a store that hangs holds one thread, not one
        per request."""
        with self._status_lock:
            if self._status_in_flight is None or self._status_in_flight.done.is_set():
                self._status_in_flight = _StatusRead(self._status)
            return self._status_in_flight

    def _status(self) -> Answer:
        try:
            return self._probes.status()
        except Exception as exc:  # a store error: said, never a traceback to the client
            return Answer(False, f"the store could not be read: {exc}")

    @staticmethod
    def _send(request: _Handler, answer: Answer, content_type: str) -> None:
        body = answer.text.replace("\n", " ") if content_type.startswith("text") else answer.text
        request.send(200 if answer.ok else 503, (body + "\n").encode(), content_type)
