"""A throwaway one-member ``etcd`` (Debian package ``etcd-server``) on free loopback ports.

Tests share one server per session (``shared_etcd()``), each test under its own
key prefix (``etcd_url()``); tests that stop or freeze a server start a private
one (``EtcdServer.start``). Without etcd the tests skip, except in CI
(``CI=true``), where a missing server is a failure: .ci/run installs it.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

__all__ = ["EtcdServer", "etcd_url", "require_etcd", "shared_etcd"]

START_TIMEOUT_S = 20.0


def require_etcd() -> str:
    """The path of etcd; skip the test without it (fail in CI)."""
    path = shutil.which("etcd")
    if path is None:
        message = "etcd is not installed (apt-get install etcd-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _die_with_parent() -> None:
    """In the child: receive SIGTERM when the test process dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as answer:
            return b'"health":"true"' in answer.read()
    except OSError:
        return False


class EtcdServer:
    """One etcd member in its own temporary data directory."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir

    @classmethod
    def start(cls) -> EtcdServer:
        """Start a member on free client and peer ports; wait (bounded) until it is healthy."""
        binary = require_etcd()
        workdir = Path(tempfile.mkdtemp(prefix="hb-etcd-"))
        # The ports are free when chosen but could be taken before etcd binds
        # them: then etcd exits, and we try others.
        for attempt in range(3):
            client, peer = _free_port(), _free_port()
            peer_url = f"http://127.0.0.1:{peer}"
            with open(workdir / "etcd.log", "ab") as log:
                process = subprocess.Popen(
                    [binary, "--name", "hb-test", "--data-dir", str(workdir / f"data{attempt}"),
                     "--listen-client-urls", f"http://127.0.0.1:{client}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client}",
                     "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                     "--initial-cluster", f"hb-test={peer_url}", "--log-level", "warn"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    preexec_fn=_die_with_parent,
                )  # fmt: skip
            deadline = time.monotonic() + START_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline:
                if _healthy(client):
                    return cls(process, client, workdir)
                time.sleep(0.02)
            process.kill()
            process.wait()
        tail = (workdir / "etcd.log").read_text(errors="replace")[-2000:]
        pytest.fail(f"etcd was not healthy within {START_TIMEOUT_S} s:\n{tail}")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, prefix: str | None = None, query: str = "") -> str:
        """A store URL on this server: a fresh random prefix unless one is given."""
        prefix = prefix or f"hb-test/{uuid.uuid4().hex}"
        return f"etcd://{self.endpoint}/{prefix}" + (f"?{query}" if query else "")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_shared: EtcdServer | None = None


def shared_etcd() -> EtcdServer:
    """The session's server: started on first use, stopped when the test process exits."""
    global _shared
    if _shared is None or _shared.process.poll() is not None:
        _shared = EtcdServer.start()
        atexit.register(_shared.stop)
    return _shared


def etcd_url(query: str = "") -> str:
    """A URL of the shared server under a prefix no other test uses."""
    return shared_etcd().url(query=query)
