"""A throwaway ``redis-server`` (Debian package ``redis-server``) on a free loopback port.

Tests share one server per session (``shared_redis()``), each test under its
own key prefix (``redis_url()``); tests that stop or freeze a server start a
private one (``RedisServer.start``). Without redis-server the tests skip, except
in CI (``CI=true``), where a missing server is a failure: .ci/run installs it.
"""

from __future__ import annotations

import atexit
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.support.server_process import die_with_parent, free_port, require_binary, stop_server

__all__ = ["RedisServer", "mutual_tls_args", "redis_url", "require_redis_server", "shared_redis"]

START_TIMEOUT_S = 10.0


def require_redis_server() -> str:
    return require_binary("redis-server", "redis-server")


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            # A server with a password answers, too: it refuses the PING.
            return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


class RedisServer:
    """One redis-server process, without persistence unless asked, in its own directory."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir

    @classmethod
    def start(
        cls, *extra: str, port: int | None = None, workdir: Path | None = None
    ) -> RedisServer:
        """Start a server (on a free port unless given) and wait, bounded, for its PING.

        A workdir given is that of an earlier server: its data files are loaded.
        """
        binary = require_redis_server()
        workdir = workdir or Path(tempfile.mkdtemp(prefix="hb-redis-"))
        # A free port can be taken before the server binds it: then the server
        # exits, and we try another.
        for _attempt in range(3):
            chosen = port or free_port()
            process = subprocess.Popen(
                [binary, "--port", str(chosen), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(workdir), "--logfile", "redis.log", *extra],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )  # fmt: skip
            deadline = time.monotonic() + START_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline:
                if _answers_ping(chosen):
                    return cls(process, chosen, workdir)
                time.sleep(0.01)
            process.kill()
            process.wait()
        log = workdir / "redis.log"
        tail = log.read_text()[-2000:] if log.exists() else "(no log)"
        pytest.fail(f"redis-server did not answer PING within {START_TIMEOUT_S} s:\n{tail}")

    def url(self, prefix: str | None = None, db: int = 0, query: str = "") -> str:
        """A store URL on this server: a fresh random prefix unless one is given."""
        prefix = prefix or f"t{uuid.uuid4().hex}"
        return f"redis://127.0.0.1:{self.port}/{db}?prefix={prefix}" + (
            f"&{query}" if query else ""
        )

    def stop(self) -> None:
        stop_server(self.process, self.workdir)

    def kill(self) -> None:
        """SIGKILL, as a crash: the data files stay for a restart."""
        self.process.kill()
        self.process.wait(timeout=10)


def mutual_tls_args(tls_port: int, certs: dict[str, Path]) -> tuple[str, ...]:
    """redis-server options for a TLS port that asks every client for a certificate of the CA."""
    return (
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(certs["server.crt"]),
        "--tls-key-file", str(certs["server.key"]),
        "--tls-ca-cert-file", str(certs["ca.crt"]),
        "--tls-auth-clients", "yes",
    )  # fmt: skip


_shared: RedisServer | None = None


def shared_redis() -> RedisServer:
    """The session's server: started on first use, stopped when the test process exits."""
    global _shared
    if _shared is None or _shared.process.poll() is not None:
        _shared = RedisServer.start()
        atexit.register(_shared.stop)
    return _shared


def redis_url(query: str = "") -> str:
    """A URL of the shared server under a prefix no other test uses."""
    return shared_redis().url(query=query)
