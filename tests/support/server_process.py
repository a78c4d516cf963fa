"""What the throwaway test servers (etcd, Redis, PostgreSQL) share: finding the binary, free
loopback ports, children that die with the test process, and stopping them."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Protocol

import pytest

__all__ = ["die_with_parent", "free_port", "require_binary", "stop_server", "stop_thawed"]


def require_binary(name: str, package: str, search: str | None = None) -> str:
    """The path of name (in search, a PATH-like list, if given, else in PATH); skip the test
    without it (fail in CI, where .ci/run installs it)."""
    path = shutil.which(name, path=search)
    if path is None:
        message = f"{name} is not installed (apt-get install {package})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def die_with_parent() -> None:
    """In the child: receive SIGTERM when the test process dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Server(Protocol):
    process: subprocess.Popen[bytes]

    def stop(self) -> None: ...


def stop_thawed(server: _Server) -> None:
    """Stop a test server, first letting a frozen one (SIGSTOP) run, or SIGTERM cannot land."""
    server.process.send_signal(signal.SIGCONT)
    server.stop()


def stop_server(process: subprocess.Popen[bytes], workdir: Path) -> None:
    """SIGTERM, SIGKILL after 10 s, then remove the server's temporary directory."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(workdir, ignore_errors=True)
