"""A loopback "tool" for effect tests: a tiny HTTP server that counts calls per idempotency key.

The test starts it (``ToolServer.start()``, 127.0.0.1, a port the OS picks,
served from a thread) and hands its URL to node processes (``HB_TOOL_URL``).
A test agent's journaled effect POSTs one JSON call per run of its function,
naming ``current_effect().key``; the server answers with how many times that
key has been called so far, so a result also tells which call produced it.
It keeps every call in arrival order, for counting and ordering afterwards,
and can hold chosen calls in flight until the test releases them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Call", "ToolServer"]

MAX_BODY = 64 * 1024
MAX_DELAY_S = 5.0
HOLD_LIMIT_S = 30.0


@dataclass(frozen=True)
class Call:
    """One call the tool received (its number ``n`` is per key, from 1)."""

    key: str
    n: int
    order: int  # arrival order over all keys, from 1
    at: float  # time.monotonic() of this process
    body: dict[str, Any] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            self.send_error(400, "a JSON body of at most 64 KiB")
            return
        try:
            body = json.loads(self.rfile.read(length))
            key = body["key"]
            if not isinstance(key, str) or not key:
                raise ValueError("key")
        except (ValueError, KeyError, TypeError):
            self.send_error(400, "a JSON object with a key")
            return
        call = self.server.tool.record(key, body)
        self.server.tool.wait_if_held(body)
        delay = min(float(body.get("delay_s") or 0.0), MAX_DELAY_S)
        if delay > 0:
            time.sleep(delay)  # the tool's work: a call in flight for this long
        data = json.dumps({"key": key, "n": call.n, "order": call.order}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows the test's own output


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    tool: ToolServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller killed mid-call (the tests' point) hangs up: its call still counts."""


class ToolServer:
    """The server and what it has seen; ``stop()`` it (or use it as a context manager)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._counts: Counter[str] = Counter()
        # Calls whose body matches all of these are held (not answered) until release().
        self._hold: dict[str, Any] | None = None
        self._released = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.tool = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tool-server", daemon=True
        )

    @classmethod
    def start(cls) -> ToolServer:
        tool = cls()
        tool._thread.start()
        return tool

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/call"

    def record(self, key: str, body: dict[str, Any]) -> Call:
        with self._lock:
            self._counts[key] += 1
            call = Call(key, self._counts[key], len(self._calls) + 1, time.monotonic(), body)
            self._calls.append(call)
            return call

    def hold(self, **match: Any) -> None:
        """Answer no call whose body has all these values until release() (at most 30 s):
        the call stays in flight, its caller waiting, as long as the test wants."""
        self._released.clear()
        self._hold = match

    def release(self) -> None:
        self._hold = None
        self._released.set()

    def wait_if_held(self, body: dict[str, Any]) -> None:
        hold = self._hold
        if hold is not None and all(body.get(k) == v for k, v in hold.items()):
            self._released.wait(timeout=HOLD_LIMIT_S)

    def calls(self) -> list[Call]:
        """Every call so far, in arrival order."""
        with self._lock:
            return list(self._calls)

    def counts(self) -> Counter[str]:
        """How many times each key has been called."""
        with self._lock:
            return Counter(self._counts)

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> ToolServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
