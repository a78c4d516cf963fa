"""A throwaway one-member ``etcd`` (Debian package ``etcd-server``) on free loopback ports.

Tests share one server per session (``shared_etcd()``), each test under its own
key prefix (``etcd_url()``); tests that stop or freeze a server start a private
one (``EtcdServer.start``), and tests of member loss a private three-member
cluster (``EtcdCluster.start``). Without etcd the tests skip, except in CI
(``CI=true``), where a missing server is a failure: .ci/run installs it.
"""

from __future__ import annotations

import atexit
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.server_process import die_with_parent, free_port, require_binary, stop_server

__all__ = [
    "EtcdCluster",
    "EtcdServer",
    "etcd_url",
    "require_etcd",
    "shared_etcd",
]

START_TIMEOUT_S = 20.0


def require_etcd() -> str:
    return require_binary("etcd", "etcd-server")


def _healthy(url: str, tls: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=0.5, context=tls) as answer:
            return b'"health":"true"' in answer.read()
    except OSError:
        return False


class EtcdServer:
    """One etcd member in its own temporary data directory.

    With ``certs`` (paths of ca.crt, server.crt, server.key, client.crt,
    client.key) it serves clients over TLS and asks them for a certificate
    signed by that CA (mutual TLS).
    """

    def __init__(self, command: list[str], port: int, workdir: Path, scheme: str,
                 tls: ssl.SSLContext | None) -> None:  # fmt: skip
        self.command = command
        self.port = port
        self.workdir = workdir
        self.scheme = scheme
        self._tls = tls
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.workdir / "etcd.log", "ab") as log:
            return subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=die_with_parent,
            )  # fmt: skip

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        client_url = f"{'https' if self.scheme == 'etcds' else 'http'}://127.0.0.1:{self.port}"
        while self.process.poll() is None and time.monotonic() < deadline:
            if _healthy(client_url, self._tls):
                return True
            time.sleep(0.02)
        return False

    @classmethod
    def start(cls, certs: Mapping[str, Path] | None = None) -> EtcdServer:
        """Start a member on free client and peer ports; wait (bounded) until it is healthy."""
        binary = require_etcd()
        workdir = Path(tempfile.mkdtemp(prefix="hb-etcd-"))
        tls, scheme, options = None, "etcd", []
        if certs is not None:
            tls = ssl.create_default_context(cafile=certs["ca.crt"])
            tls.load_cert_chain(certs["client.crt"], certs["client.key"])
            scheme = "etcds"
            options = ["--cert-file", str(certs["server.crt"]), "--key-file",
                       str(certs["server.key"]), "--client-cert-auth", "--trusted-ca-file",
                       str(certs["ca.crt"])]  # fmt: skip
        # The ports are free when chosen but could be taken before etcd binds
        # them: then etcd exits, and we try others.
        for attempt in range(3):
            client, peer = free_port(), free_port()
            client_url = f"{'https' if tls else 'http'}://127.0.0.1:{client}"
            peer_url = f"http://127.0.0.1:{peer}"
            command = [
                binary, "--name", "hb-test", "--data-dir", str(workdir / f"data{attempt}"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"hb-test={peer_url}", "--log-level", "warn", *options,
            ]  # fmt: skip
            server = cls(command, client, workdir, scheme, tls)
            if server._wait_healthy():
                return server
            server.process.kill()
            server.process.wait()
        tail = (workdir / "etcd.log").read_text(errors="replace")[-2000:]
        pytest.fail(f"etcd was not healthy within {START_TIMEOUT_S} s:\n{tail}")

    def restart(self) -> None:
        """Stop the member and start it again on the same ports and data: its streams break."""
        self.halt()
        self.start_again()

    def halt(self) -> None:
        """Stop the member (SIGTERM), keeping its ports' numbers and its data for start_again."""
        self.process.terminate()
        self.process.wait(timeout=10)

    def start_again(self) -> None:
        """Start a halted member on the same ports and data; wait (bounded) until it is healthy."""
        self.process = self._spawn()
        if not self._wait_healthy():
            pytest.fail(f"etcd was not healthy again within {START_TIMEOUT_S} s")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, prefix: str | None = None, query: str = "") -> str:
        """A store URL on this server: a fresh random prefix unless one is given."""
        prefix = prefix or f"hb-test/{uuid.uuid4().hex}"
        return f"{self.scheme}://{self.endpoint}/{prefix}" + (f"?{query}" if query else "")

    def stop(self) -> None:
        stop_server(self.process, self.workdir)


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


class EtcdCluster:
    """Three etcd members on loopback, each with its own client and peer ports and data dir.

    ``start`` waits (bounded) until every member reports healthy (a leader is
    elected and reachable); ``stop`` ends every member still running and removes
    all their files. ``leader()`` asks the members' ``/v3/maintenance/status``.
    """

    SIZE = 3

    def __init__(self, workdir: Path, members: list[EtcdServer], names: list[str]) -> None:
        self.workdir = workdir
        self.members = members
        self.names = names

    @classmethod
    def start(cls, size: int = SIZE) -> EtcdCluster:
        binary = require_etcd()
        workdir = Path(tempfile.mkdtemp(prefix="hb-etcd-cluster-"))
        # Ports are free when chosen but could be taken before etcd binds them:
        # then a member exits or the cluster never gets healthy, and we try others.
        for attempt in range(3):
            names = [f"hb-member-{i}" for i in range(size)]
            clients = [free_port() for _ in names]
            peers = [free_port() for _ in names]
            initial = ",".join(
                f"{name}=http://127.0.0.1:{peer}" for name, peer in zip(names, peers, strict=True)
            )
            token = f"hb-test-{uuid.uuid4().hex}"  # one per cluster: all members share it
            members = []
            for name, client, peer in zip(names, clients, peers, strict=True):
                memberdir = workdir / f"{name}-{attempt}"
                memberdir.mkdir()
                client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
                command = [
                    binary, "--name", name, "--data-dir", str(memberdir / "data"),
                    "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                    "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token,
                    "--log-level", "warn",
                ]  # fmt: skip
                members.append(EtcdServer(command, client, memberdir, "etcd", None))
            cluster = cls(workdir, members, names)
            if all(member._wait_healthy() for member in members):
                return cluster
            cluster._stop_members()
        tail = "\n".join(
            (path / "etcd.log").read_text(errors="replace")[-800:]
            for path in sorted(workdir.iterdir())
        )
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.fail(f"the etcd cluster was not healthy within {START_TIMEOUT_S} s:\n{tail}")

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def url(
        self, prefix: str | None = None, members: list[int] | None = None, query: str = ""
    ) -> str:
        """A store URL naming the given members (all by default), under a fresh prefix."""
        chosen = range(len(self.members)) if members is None else members
        prefix = prefix or f"hb-test/{uuid.uuid4().hex}"
        hosts = ",".join(self.members[i].endpoint for i in chosen)
        return f"etcd://{hosts}/{prefix}" + (f"?{query}" if query else "")

    def alive(self) -> list[int]:
        return [i for i, member in enumerate(self.members) if member.process.poll() is None]

    def status(self, index: int) -> dict[str, object] | None:
        """The member's /v3/maintenance/status answer, or None if it does not answer."""
        request = urllib.request.Request(
            f"http://{self.members[index].endpoint}/v3/maintenance/status",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=1.0) as answer:
                found: dict[str, object] = json.loads(answer.read())
                return found
        except (OSError, ValueError):
            return None

    def leader(self, timeout: float = START_TIMEOUT_S) -> int:
        """The index of the member that leads, as the live members agree on it (bounded wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids: dict[str, int] = {}
            leaders = set()
            for i in self.alive():
                status = self.status(i)
                if status is None:
                    continue
                header = status.get("header")
                if isinstance(header, dict):
                    ids[str(header.get("member_id"))] = i
                leaders.add(str(status.get("leader")))
            if len(leaders) == 1:
                leader = leaders.pop()
                if leader in ids:
                    return ids[leader]
            time.sleep(0.05)
        pytest.fail(f"the etcd members agreed on no leader within {timeout} s")

    def kill(self, index: int) -> None:
        """SIGKILL one member and reap it."""
        process = self.members[index].process
        process.kill()
        process.wait(timeout=10)

    def wait_healthy(self, indices: list[int], timeout: float = START_TIMEOUT_S) -> None:
        """Wait (bounded) until each of the given members reports healthy."""
        deadline = time.monotonic() + timeout
        for i in indices:
            url = f"http://{self.members[i].endpoint}"
            while not _healthy(url, None):
                if time.monotonic() > deadline:
                    pytest.fail(f"etcd member {self.names[i]} not healthy within {timeout} s")
                time.sleep(0.05)

    def _stop_members(self) -> None:
        # SIGKILL: the data is thrown away, and a SIGTERMed member of a cluster
        # whose peers are stopping too waits seconds trying to hand its leadership on.
        for member in self.members:
            if member.process.poll() is None:
                member.process.kill()
        for member in self.members:
            member.process.wait(timeout=10)

    def stop(self) -> None:
        """Stop every member still running and remove all their files."""
        self._stop_members()
        shutil.rmtree(self.workdir, ignore_errors=True)
